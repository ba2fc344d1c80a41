//! End to end on the real control plane: the host provisions claims through real guests,
//! publishes PVs the real binder binds, and deletes backend volumes of released PVs.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT};

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";
const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn has_finalizer<K: ResourceExt>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// The whole life of a hostpath volume: Events, the PV as published, the directory on
/// disk, the protection finalizer, and deletion when the claim goes.
#[tokio::test]
async fn hostpath_volume_is_provisioned_bound_and_deleted() -> anyhow::Result<()> {
    let mut fx = Fixture::new("hostpath-life").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class(
            "hostpath",
            &[("nodePath", "/var/lib/wasm-provisioner/hostpath")],
            json!({ "reclaimPolicy": "Delete", "mountOptions": ["noatime"] }),
        )
        .await?;
    let host = fx.host(&[]);
    let claim = fx.claim("data", &class, "2Gi", json!({})).await?;

    let pv = fx.wait_bound("data").await?;
    let uid = claim.uid().unwrap();
    assert_eq!(pv.name_any(), format!("pvc-{uid}"), "deterministic PV name");
    assert_eq!(
        pv.annotations().get("pv.kubernetes.io/provisioned-by"),
        Some(&fx.provisioner)
    );
    assert_eq!(
        pv.annotations()
            .get("wasm-provisioner.dev/module")
            .map(String::as_str),
        Some("hostpath")
    );
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some(class.as_str()));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert!(
        spec.mount_options
            .unwrap_or_default()
            .contains(&"noatime".to_string())
    );
    assert_eq!(
        spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()),
        Some(uid.as_str())
    );
    let capacity = spec.capacity.unwrap_or_default();
    assert_eq!(capacity.get("storage").map(|q| q.0.as_str()), Some("2Gi"));
    assert_eq!(
        spec.host_path.map(|h| h.path),
        Some(format!("/var/lib/wasm-provisioner/hostpath/pvc-{uid}"))
    );
    // The backend volume really exists, inside the granted directory.
    let dir = fx.module_data("hostpath").join(format!("pvc-{uid}"));
    assert!(dir.is_dir(), "{} was not created", dir.display());

    fx.wait_claim_event("data", "Provisioning").await?;
    let note = fx.wait_claim_event("data", "ProvisioningSucceeded").await?;
    assert!(note.contains(&pv.name_any()), "{note}");
    // The claim finalizer is gone once the PV exists; the PV carries the protection one.
    fx.wait_claim("data", "our finalizer removed", |c| {
        c.is_some_and(|c| !has_finalizer(c, FINALIZER_CLAIM))
    })
    .await?;
    let volumes = fx.volumes();
    wait_for("the PV protection finalizer", WAIT, || async {
        Ok(has_finalizer(&volumes.get(&pv.name_any()).await?, FINALIZER_PV).then_some(()))
    })
    .await?;

    fx.claims().delete("data", &DeleteParams::default()).await?;
    fx.wait_volume_gone(&pv.name_any()).await?;
    assert!(!dir.exists(), "{} survived the delete", dir.display());
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// Every outcome a plugin can answer, through the echo guest.
#[tokio::test]
async fn plugin_outcomes_are_handled_as_the_library_does() -> anyhow::Result<()> {
    let mut fx = Fixture::new("outcomes").await?;
    fx.install_module("test-echo", "echo");
    fx.node("outcomes-node").await.ok();
    let host = fx.host(&[]);

    // failed: a Warning Event, the claim finalizer removed (nothing left), retried.
    let failed = fx
        .class("echo", &[("outcome", "failed")], json!({}))
        .await?;
    fx.claim("failed", &failed, "1Gi", json!({})).await?;
    let note = fx.wait_claim_event("failed", "ProvisioningFailed").await?;
    assert!(note.contains("echo: failed"), "{note}");

    // ignored: no Warning Event at all, no PV.
    let ignored = fx
        .class("echo", &[("outcome", "ignored")], json!({}))
        .await?;
    // Announced as the binder would: before that, the host may ask once at first sight
    // (`--provision-before-binder`) and once more when the announcement changes the
    // claim, so the count of calls below would depend on who is first.
    let announced = json!({ "metadata": { "annotations": {
        "volume.kubernetes.io/storage-provisioner": fx.provisioner,
    } } });
    fx.claim("ignored", &ignored, "1Gi", announced).await?;

    // in-background: the finalizer stays (the backend may be working) and the host
    // keeps asking until the plugin answers definitively. `outcomeFile` lets the test
    // change the answer while the claim is in flight.
    let outcome_file = fx.module_data("echo").join("background");
    std::fs::write(&outcome_file, "in-background")?;
    let background = fx
        .class("echo", &[("outcomeFile", "/volumes/background")], json!({}))
        .await?;
    fx.claim("background", &background, "1Gi", json!({}))
        .await?;
    let note = fx
        .wait_claim_event("background", "ProvisioningFailed")
        .await?;
    assert!(note.contains("echo: in-background"), "{note}");
    fx.wait_claim("background", "keeps our finalizer", |c| {
        c.is_some_and(|c| has_finalizer(c, FINALIZER_CLAIM))
    })
    .await?;

    // reschedule: the selected-node annotation is removed so the scheduler picks again.
    let reschedule = fx
        .class(
            "echo",
            &[("outcome", "reschedule")],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    fx.claim(
        "reschedule",
        &reschedule,
        "1Gi",
        json!({ "metadata": { "annotations": { "volume.kubernetes.io/selected-node": "outcomes-node" } } }),
    )
    .await?;
    fx.wait_claim("reschedule", "selected-node removed", |c| {
        c.is_some_and(|c| {
            !c.annotations()
                .contains_key("volume.kubernetes.io/selected-node")
        })
    })
    .await?;

    // infeasible: a Warning Event with the plugin's message.
    let infeasible = fx
        .class("echo", &[("outcome", "infeasible")], json!({}))
        .await?;
    fx.claim("infeasible", &infeasible, "1Gi", json!({}))
        .await?;
    let note = fx
        .wait_claim_event("infeasible", "ProvisioningFailed")
        .await?;
    assert!(note.contains("echo: infeasible"), "{note}");

    // After all that, the ignored claim never got a Warning nor a PV.
    let events = fx.events(&fx.ctx.namespace, "ignored").await?;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "ProvisioningFailed"),
        "ignored must not warn: {events:?}"
    );
    let claim = fx.claims().get("ignored").await?;
    assert!(claim.spec.and_then(|s| s.volume_name).is_none());
    // ... and was asked once: the host's own finalizer edits must not re-trigger it.
    let ignored_calls = host.metric(
        "wasm_provisioner_guest_call_failures_total{call=\"provision\",module=\"echo\",outcome=\"ignored\"}",
    );
    assert_eq!(ignored_calls, Some(1.0), "{}", host.log_text());
    // A failed attempt finished: nothing is left in the backend, so our finalizer comes
    // off between attempts.
    fx.wait_claim("failed", "our finalizer removed between attempts", |c| {
        c.is_some_and(|c| !has_finalizer(c, FINALIZER_CLAIM))
    })
    .await?;

    // The in-background claim is deleted mid-flight: it cannot vanish while the backend
    // may hold its volume; once the plugin finishes, the host deletes that volume and
    // lets the claim go.
    fx.claims()
        .delete("background", &DeleteParams::default())
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = fx.claims().get_opt("background").await?;
    assert!(
        still.is_some_and(
            |c| c.metadata.deletion_timestamp.is_some() && has_finalizer(&c, FINALIZER_CLAIM)
        ),
        "a claim whose backend volume may exist must not vanish"
    );
    std::fs::write(&outcome_file, "ok")?;
    fx.wait_claim("background", "gone after cleanup", |c| c.is_none())
        .await?;
    let deletes = host
        .metric("wasm_provisioner_guest_call_duration_seconds_count{call=\"delete\",module=\"echo\",outcome=\"ok\"}")
        .unwrap_or_default();
    assert!(
        deletes >= 1.0,
        "the finished volume was deleted by the plugin\n{}",
        host.log_text()
    );
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// A class changed under its claims (deleted and created again, as parameters are
/// immutable) retries them at once, not after their back-off: here the class's first
/// version makes the plugin answer infeasible, the claim backs off for two minutes, and
/// the class recreated without that parameter gets it provisioned within seconds. The
/// claims are retried only once the host's class cache holds the new class, so the
/// retry cannot see the old one (or none) and back off again.
#[tokio::test]
async fn a_recreated_class_retries_its_claims_at_once() -> anyhow::Result<()> {
    let mut fx = Fixture::new("class-again").await?;
    fx.install_module("test-echo", "echo");
    let host = fx.host(&["--retry-interval-start=120s", "--retry-interval-max=120s"]);
    let class = fx
        .class("echo", &[("outcome", "infeasible")], json!({}))
        .await?;
    fx.claim("again", &class, "1Gi", json!({})).await?;
    let note = fx.wait_claim_event("again", "ProvisioningFailed").await?;
    assert!(note.contains("echo: infeasible"), "{note}");

    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(fx.ctx.client.clone());
    let mut fixed = classes.get(&class).await?;
    classes.delete(&class, &DeleteParams::default()).await?;
    wait_for("the class to be gone", WAIT, || async {
        Ok(classes.get_opt(&class).await?.is_none().then_some(()))
    })
    .await?;
    fixed.metadata = kube::api::ObjectMeta {
        name: Some(class.clone()),
        ..Default::default()
    };
    fixed.parameters = Some([("module".to_string(), "echo".to_string())].into());
    let recreated = std::time::Instant::now();
    classes.create(&PostParams::default(), &fixed).await?;
    wait_for(
        "the claim to be Bound well before its back-off ends",
        Duration::from_secs(30),
        || async {
            let claim = fx.claims().get("again").await?;
            Ok(claim.spec.and_then(|s| s.volume_name).map(|_| ()))
        },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}\n{}", host.log_text()))?;
    eprintln!(
        "the claim was provisioned {:.1}s after its class was recreated (back-off 120 s)",
        recreated.elapsed().as_secs_f64()
    );
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// The decision rules before a plugin is called: another provisioner's claims, a
/// WaitForFirstConsumer class without a node, the plugin's veto, block support, the
/// legacy class annotation, and a missing module fixed by adding it (hot reload).
#[tokio::test]
async fn decisions_before_the_plugin_is_called() -> anyhow::Result<()> {
    let mut fx = Fixture::new("decisions").await?;
    fx.install_module("test-echo", "echo");
    fx.node("decisions-node").await.ok();
    let host = fx.host(&[]);

    // WaitForFirstConsumer: nothing until a node is selected, then provisioned there.
    let wffc = fx
        .class(
            "echo",
            &[],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    fx.claim("wffc", &wffc, "1Gi", json!({})).await?;
    // The veto: should-provision says no, nothing happens.
    let veto = fx.class("echo", &[("veto", "true")], json!({})).await?;
    fx.claim("veto", &veto, "1Gi", json!({})).await?;
    // Block: the echo guest does not support block volumes.
    let plain = fx.class("echo", &[], json!({})).await?;
    fx.claim(
        "block",
        &plain,
        "1Gi",
        json!({ "spec": { "volumeMode": "Block" } }),
    )
    .await?;
    let note = fx.wait_claim_event("block", "ProvisioningFailed").await?;
    assert!(note.contains("block"), "{note}");
    // The legacy beta annotation wins over spec.storageClassName.
    fx.claim(
        "legacy",
        "no-such-class",
        "1Gi",
        json!({ "metadata": { "annotations": { "volume.beta.kubernetes.io/storage-class": plain } } }),
    )
    .await?;
    fx.wait_bound("legacy").await?;

    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["wffc", "veto"] {
        let claim = fx.claims().get(name).await?;
        assert!(
            claim.spec.and_then(|s| s.volume_name).is_none(),
            "{name} must not be provisioned"
        );
    }
    fx.claims()
        .patch(
            "wffc",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                "volume.kubernetes.io/selected-node": "decisions-node" } } })),
        )
        .await?;
    let pv = fx.wait_bound("wffc").await?;
    let selected = pv
        .annotations()
        .get("echo/selected-node")
        .cloned()
        .unwrap_or_default();
    assert!(
        selected.contains("decisions-node"),
        "the plugin saw the selected node: {selected}"
    );

    // A class naming a module that is not there: a Warning Event, then the module is
    // added to the directory and the claim is provisioned without a restart.
    let later = fx.class("flaky", &[], json!({})).await?;
    fx.claim("later", &later, "1Gi", json!({})).await?;
    let note = fx.wait_claim_event("later", "ProvisioningFailed").await?;
    assert!(note.contains("flaky"), "the Event names the module: {note}");
    fx.install_module("test-echo", "flaky");
    fx.wait_bound("later").await?;

    // Claims of another provisioner are never touched.
    let other: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(json!({
        "metadata": { "name": format!("other-{}", fx.ctx.namespace) },
        "provisioner": "someone-else.example.com",
        "parameters": { "module": "echo" },
    }))?;
    let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
        kube::Api::all(fx.ctx.client.clone());
    classes.create(&Default::default(), &other).await?;
    fx.claim("other", &other.name_any(), "1Gi", json!({}))
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let claim = fx.claims().get("other").await?;
    assert!(claim.spec.and_then(|s| s.volume_name).is_none());
    // (kube-controller-manager's own ExternalProvisioning events are expected.)
    let ours: Vec<_> = fx
        .events(&fx.ctx.namespace, "other")
        .await?
        .into_iter()
        .filter(|(reason, _)| reason.starts_with("Provisioning"))
        .collect();
    assert!(
        ours.is_empty(),
        "another provisioner's claim got our Events: {ours:?}"
    );
    classes
        .delete(&other.name_any(), &DeleteParams::default())
        .await?;
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// The retry threshold, as the Go library counts it (docs/design.md, "Retries, give-up
/// and resync, as the Go library"): the fast retries stop at the failure after
/// `threshold` requeues, with one Warning Event; then the claim is tried once per resync
/// period (not abandoned), so it binds on its own once the cause is gone.
#[tokio::test]
async fn failing_claim_is_given_up_after_the_threshold_then_retried_each_resync()
-> anyhow::Result<()> {
    let mut fx = Fixture::new("threshold").await?;
    fx.install_module("test-echo", "echo");
    let outcome_file = fx.module_data("echo").join("outcome");
    std::fs::write(&outcome_file, "failed")?;
    let host = fx.host(&["--failed-provision-threshold=3", "--resync-period=8s"]);
    let failing = fx
        .class("echo", &[("outcomeFile", "/volumes/outcome")], json!({}))
        .await?;
    fx.claim("doomed", &failing, "1Gi", json!({})).await?;
    let note = wait_for("the give-up Event", WAIT, || async {
        let events = fx.events(&fx.ctx.namespace, "doomed").await?;
        Ok(events
            .into_iter()
            .find(|(reason, note)| reason == "ProvisioningFailed" && note.contains("gave up"))
            .map(|(_, note)| note))
    })
    .await?;
    assert!(note.contains("4 failed attempts"), "{note}");
    assert!(note.contains("once every 8s"), "{note}");
    let failed_calls = || {
        host.metric("wasm_provisioner_guest_call_failures_total{call=\"provision\",module=\"echo\",outcome=\"failed\"}")
            .unwrap_or_default()
    };
    assert_eq!(
        failed_calls(),
        4.0,
        "threshold + 1 attempts, as the Go library"
    );
    // The four attempts' ProvisioningFailed Events are one Event whose series counts
    // them (created once, then patched), as kube-runtime's Recorder and client-go do.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    let attempts = wait_for("one ProvisioningFailed series of 4", WAIT, || async {
        let attempts: Vec<_> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("doomed"))
            .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
            .filter(|e| !e.note.as_deref().unwrap_or_default().contains("gave up"))
            .map(|e| e.series.map_or(1, |s| s.count))
            .collect();
        Ok((attempts == [4]).then_some(attempts))
    })
    .await?;
    assert_eq!(attempts, [4]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(failed_calls(), 4.0, "no fast retry after giving up");

    // The cause goes away; nobody edits the claim: the next resync binds it.
    std::fs::write(&outcome_file, "ok")?;
    fx.wait_bound("doomed").await?;
    let gave_up = fx
        .events(&fx.ctx.namespace, "doomed")
        .await?
        .into_iter()
        .filter(|(_, note)| note.contains("gave up"))
        .count();
    assert_eq!(gave_up, 1, "the give-up is told once");
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// The metrics endpoint: the Go library's metrics with their labels, the end-to-end histogram,
/// guest calls, module reloads, health and readiness.
#[tokio::test]
async fn metrics_are_scraped_end_to_end() -> anyhow::Result<()> {
    let mut fx = Fixture::new("metrics").await?;
    fx.install_module("test-echo", "echo");
    let class = fx.class("echo", &[], json!({})).await?;
    let host = fx.host(&[]);
    fx.claim("one", &class, "1Gi", json!({})).await?;
    let pv = fx.wait_bound("one").await?;
    fx.claims().delete("one", &DeleteParams::default()).await?;
    fx.wait_volume_gone(&pv.name_any()).await?;

    let (code, _) = host.get("/healthz")?;
    assert_eq!(code, 200);
    let (code, _) = host.get("/readyz")?;
    assert_eq!(code, 200);
    let sample = |s: &str| host.metric(s);
    assert_eq!(
        sample(&format!(
            "controller_persistentvolumeclaim_provision_total{{class=\"{class}\",source=\"\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        sample(&format!(
            "controller_persistentvolumeclaim_provision_duration_seconds_count{{class=\"{class}\",source=\"\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        sample(&format!(
            "controller_persistentvolume_delete_total{{class=\"{class}\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        sample(&format!(
            "controller_persistentvolume_delete_duration_seconds_count{{class=\"{class}\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        sample(&format!(
            "wasm_provisioner_claim_to_volume_seconds_count{{class=\"{class}\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        sample(
            "wasm_provisioner_guest_call_duration_seconds_count{call=\"provision\",module=\"echo\",outcome=\"ok\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample("wasm_provisioner_module_reloads_total{module=\"echo\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample("wasm_provisioner_operations_in_flight{operation=\"provision\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample("wasm_provisioner_leader"),
        Some(1.0),
        "without election the host leads"
    );
    assert!(sample("wasm_provisioner_queue_depth{queue=\"claims\"}").is_some());
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// A module swapped while claims are being provisioned: a broken version is refused and
/// the old one keeps serving; the next good version serves new claims; every claim is
/// provisioned.
#[tokio::test]
async fn module_swapped_while_claims_are_provisioned() -> anyhow::Result<()> {
    let mut fx = Fixture::new("swap").await?;
    fx.install_module("test-echo", "echo");
    let class = fx
        .class("echo", &[("root", "/srv/minimal")], json!({}))
        .await?;
    let host = fx.host(&[]);
    for i in 0..5 {
        fx.claim(&format!("c{i}"), &class, "1Gi", json!({})).await?;
    }
    std::fs::write(fx.modules.join("echo.wasm"), b"not a component")?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 5..8 {
        fx.claim(&format!("c{i}"), &class, "1Gi", json!({})).await?;
    }
    // Version 2 of module "echo" is a different guest (the minimal example).
    fx.install_module("minimal", "echo");
    wait_for("version 2 in service", WAIT, || async {
        let reloads = host.metric("wasm_provisioner_module_reloads_total{module=\"echo\"}");
        Ok((reloads == Some(2.0)).then_some(()))
    })
    .await?;
    for i in 8..10 {
        fx.claim(&format!("c{i}"), &class, "1Gi", json!({})).await?;
    }
    let digest = |guest: &str| -> anyhow::Result<String> {
        use sha2::Digest as _;
        let bytes = std::fs::read(wasm_provisioner_tests::guests::module(guest))?;
        Ok(hex::encode(sha2::Sha256::digest(&bytes)))
    };
    let (v1_sha256, v2_sha256) = (digest("test-echo")?, digest("minimal")?);
    let mut served_by_v1 = 0;
    for i in 0..10 {
        let pv = fx.wait_bound(&format!("c{i}")).await?;
        let v1 = pv.annotations().contains_key("echo/volume-name");
        served_by_v1 += usize::from(v1);
        // The PV records the digest of the version that answered, not of the one
        // serving when the PV was saved.
        assert_eq!(
            pv.annotations().get("wasm-provisioner.dev/module-sha256"),
            Some(if v1 { &v1_sha256 } else { &v2_sha256 }),
            "c{i}"
        );
        if i >= 8 {
            assert!(
                !v1,
                "c{i} was created after the swap and must be served by version 2"
            );
        }
    }
    assert!(
        served_by_v1 >= 5,
        "claims made before the swap were served by version 1"
    );
    assert_eq!(
        host.metric("wasm_provisioner_module_refusals_total{module=\"echo\"}"),
        Some(1.0),
        "the broken version was refused\n{}",
        host.log_text()
    );
    assert_eq!(
        host.metric("wasm_provisioner_module_reloads_total{module=\"echo\"}"),
        Some(2.0)
    );
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// WaitForFirstConsumer and a vanished node. A claim whose selected node
/// does not exist is sent back to the scheduler at once — unless the module's last
/// answer for it was "in background": then a volume may still be in the making on that
/// node, so the annotation stays and the module is asked again; it goes only after a
/// final answer (here the module answers "reschedule").
#[tokio::test]
async fn selected_node_stays_while_the_module_works_in_the_background() -> anyhow::Result<()> {
    const SELECTED: &str = "volume.kubernetes.io/selected-node";
    let mut fx = Fixture::new("wffc-gone").await?;
    fx.install_module("test-echo", "echo");
    let outcome_file = fx.module_data("echo").join("outcome");
    std::fs::write(&outcome_file, "in-background")?;
    let node_a = format!("{}-a", fx.ctx.namespace);
    fx.node(&node_a).await?;
    let host = fx.host(&[]);
    let class = fx
        .class(
            "echo",
            &[("outcomeFile", "/volumes/outcome")],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    let selected = |node: &str| {
        json!({ "metadata": { "annotations": {
            SELECTED: node,
            "volume.kubernetes.io/storage-provisioner": fx.provisioner,
        } } })
    };
    // A node that never existed, and no provisioning started: rescheduled at once.
    fx.claim(
        "nowhere",
        &class,
        "1Mi",
        selected(&format!("{}-never", fx.ctx.namespace)),
    )
    .await?;
    fx.wait_claim("nowhere", "its selected node removed", |c| {
        c.is_some_and(|c| !c.annotations().contains_key(SELECTED))
    })
    .await?;

    fx.claim("background", &class, "1Mi", selected(&node_a))
        .await?;
    let note = fx
        .wait_claim_event("background", "ProvisioningFailed")
        .await?;
    assert!(note.contains("in-background"), "{note}");
    Api::<Node>::all(fx.ctx.client.clone())
        .delete(&node_a, &DeleteParams::default())
        .await?;
    // Retries come every second or two: several happen while the node is gone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let claim = fx.claims().get("background").await?;
    assert_eq!(
        claim.annotations().get(SELECTED),
        Some(&node_a),
        "the annotation stays while the module works in the background\n{}",
        host.log_text()
    );
    assert!(has_finalizer(&claim, FINALIZER_CLAIM));

    std::fs::write(&outcome_file, "reschedule")?;
    fx.wait_claim("background", "rescheduled after the final answer", |c| {
        c.is_some_and(|c| {
            !c.annotations().contains_key(SELECTED) && !has_finalizer(c, FINALIZER_CLAIM)
        })
    })
    .await?;
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// Claims are provisioned before the binder announces them (`--provision-before-binder`,
/// on by default), but never when an existing PV may be the claim's: an Available PV of
/// its class (static provisioning) or a PV whose claimRef names it (reserved). Those
/// claims wait for the binder, which binds them to that PV and never announces them,
/// so no volume is made for them. Once the static PV is taken, the next claim of the
/// class is provisioned.
#[tokio::test]
async fn a_static_or_reserved_volume_is_bound_before_anything_is_provisioned() -> anyhow::Result<()>
{
    let mut fx = Fixture::new("static-first").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class(
            "hostpath",
            &[("nodePath", "/var/lib/wasm-provisioner/hostpath")],
            json!({ "reclaimPolicy": "Delete" }),
        )
        .await?;
    let static_pv = |name: &str, claim: Option<&str>| -> anyhow::Result<PersistentVolume> {
        let mut pv = json!({
            "metadata": { "name": name },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "hostPath": { "path": format!("/srv/static/{name}") },
            },
        });
        if let Some(claim) = claim {
            pv["spec"]["claimRef"] = json!({
                "kind": "PersistentVolumeClaim",
                "namespace": fx.ctx.namespace,
                "name": claim,
            });
        }
        Ok(serde_json::from_value(pv)?)
    };
    let offered = format!("{}-offered", fx.ctx.namespace);
    let reserved = format!("{}-reserved", fx.ctx.namespace);
    let volumes = fx.volumes();
    volumes
        .create(&PostParams::default(), &static_pv(&offered, None)?)
        .await?;
    volumes
        .create(&PostParams::default(), &static_pv(&reserved, Some("mine"))?)
        .await?;
    wait_for("the static PVs to be Available", WAIT, || async {
        let mut available = 0;
        for name in [&offered, &reserved] {
            let pv = volumes.get(name).await?;
            available +=
                usize::from(pv.status.and_then(|s| s.phase).as_deref() == Some("Available"));
        }
        Ok((available == 2).then_some(()))
    })
    .await?;

    let host = fx.host(&[]);
    // A PV reserved for "mine" that is too small would still be the binder's to judge;
    // this one fits. Both claims exist before the binder may look at either.
    let mine = fx.claim("mine", &class, "1Gi", json!({})).await?;
    let any = fx.claim("any", &class, "512Mi", json!({})).await?;
    assert_eq!(fx.wait_bound("mine").await?.name_any(), reserved);
    assert_eq!(fx.wait_bound("any").await?.name_any(), offered);
    // Give a wrong provision time to land: none may have been made for either claim.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for claim in [&mine, &any] {
        let made = format!("pvc-{}", claim.uid().unwrap());
        let events = fx.events(&fx.ctx.namespace, &claim.name_any()).await?;
        assert!(
            volumes.get_opt(&made).await?.is_none()
                && !events
                    .iter()
                    .any(|(reason, _)| reason.starts_with("Provisioning")),
            "claim {} was provisioned although a static PV was its: {events:?}\n{}",
            claim.name_any(),
            host.log_text()
        );
    }

    // The class has no free PV left: the next claim is provisioned.
    let fresh = fx.claim("fresh", &class, "1Gi", json!({})).await?;
    let pv = fx.wait_bound("fresh").await?;
    assert_eq!(pv.name_any(), format!("pvc-{}", fresh.uid().unwrap()));

    for claim in ["mine", "any", "fresh"] {
        fx.claims().delete(claim, &DeleteParams::default()).await?;
    }
    fx.wait_volume_gone(&pv.name_any()).await?;
    for name in [&offered, &reserved] {
        volumes.delete(name, &DeleteParams::default()).await?;
    }
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// Guest log lines of `echo` for `call` (`provision`, `delete`, ...) of volume `volume`.
fn echo_calls(host: &wasm_provisioner_tests::host::Host, call: &str, volume: &str) -> usize {
    host.log_text()
        .lines()
        .filter(|line| line.contains(&format!("echo: {call}")) && line.contains(volume))
        .count()
}

/// A tenant of another namespace goes after a claim whose volume is being made: a claim
/// naming the victim's future PV (`pvc-<victim uid>`) in `spec.volumeName`, claims
/// carrying every annotation and the finalizer of the provisioner (storage-provisioner
/// GA and beta, selected-node, `wasm-provisioner.dev/module` and `-sha256`,
/// `wasm-provisioner.dev/provisioning`), one of them of another provisioner's class
/// (that names a module). The victim's PV is bound to the victim only; the squatter
/// gets nothing; the copycat gets a PV of its own uid; the other provisioner's claim
/// gets nothing from us; deleting the tenant's claims never deletes the victim's
/// backend volume.
#[tokio::test]
async fn a_tenant_claim_cannot_take_or_delete_another_namespaces_volume() -> anyhow::Result<()> {
    let mut fx = Fixture::new("theft").await?;
    fx.install_module("test-echo", "echo");
    let tenant = wasm_provisioner_tests::cluster::TestContext::new("theft-tenant").await?;
    let tenant_claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(tenant.client.clone(), &tenant.namespace);
    let host = fx.host(&[]);

    let outcome = fx.module_data("echo").join("outcome");
    std::fs::write(&outcome, "in-background")?;
    let class = fx
        .class("echo", &[("outcomeFile", "/volumes/outcome")], json!({}))
        .await?;
    let victim = fx.claim("victim", &class, "1Gi", json!({})).await?;
    let victim_uid = victim.uid().unwrap_or_default();
    let victim_pv = format!("pvc-{victim_uid}");
    fx.wait_claim("victim", "in flight (our finalizer)", |c| {
        c.is_some_and(|c| has_finalizer(c, FINALIZER_CLAIM))
    })
    .await?;

    let other: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(json!({
        "metadata": { "name": format!("other-{}", fx.ctx.namespace) },
        "provisioner": "someone-else.example.com",
        "parameters": { "module": "echo", "outcomeFile": "/volumes/outcome" },
    }))?;
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(fx.ctx.client.clone());
    classes.create(&PostParams::default(), &other).await?;
    let hostile = |name: &str, class: &str, volume_name: Option<&str>| {
        let mut claim = json!({
            "metadata": {
                "name": name,
                "annotations": {
                    "volume.kubernetes.io/storage-provisioner": fx.provisioner,
                    "volume.beta.kubernetes.io/storage-provisioner": fx.provisioner,
                    "wasm-provisioner.dev/module": "echo",
                    "wasm-provisioner.dev/module-sha256": "0".repeat(64),
                },
                "finalizers": [FINALIZER_CLAIM],
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": { "requests": { "storage": "1Gi" } },
            },
        });
        if let Some(volume_name) = volume_name {
            claim["spec"]["volumeName"] = json!(volume_name);
            claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] =
                json!("victim-node");
        }
        serde_json::from_value::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(claim)
    };
    let squatter = tenant_claims
        .create(
            &PostParams::default(),
            &hostile("squatter", &class, Some(&victim_pv))?,
        )
        .await?;
    let copycat = tenant_claims
        .create(&PostParams::default(), &hostile("copycat", &class, None)?)
        .await?;
    let foreign = tenant_claims
        .create(
            &PostParams::default(),
            &hostile("foreign", &other.name_any(), None)?,
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    std::fs::write(&outcome, "ok")?;
    let pv = fx.wait_bound("victim").await?;
    assert_eq!(pv.name_any(), victim_pv);
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.clone()).unwrap();
    assert_eq!(claim_ref.uid.as_deref(), Some(victim_uid.as_str()));
    assert_eq!(
        claim_ref.namespace.as_deref(),
        Some(fx.ctx.namespace.as_str())
    );
    assert_eq!(claim_ref.name.as_deref(), Some("victim"));

    // The copycat gets a volume of its own, named for its own uid.
    let copycat_pv = format!("pvc-{}", copycat.uid().unwrap_or_default());
    let bound = wait_for("the copycat's own volume", WAIT, || async {
        let claim = tenant_claims.get("copycat").await?;
        let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
        Ok((phase.as_deref() == Some("Bound"))
            .then(|| claim.spec.and_then(|s| s.volume_name))
            .flatten())
    })
    .await?;
    assert_eq!(bound, copycat_pv);
    let mine = fx.volumes().get(&copycat_pv).await?;
    let claim_ref = mine
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.clone())
        .unwrap();
    assert_eq!(
        claim_ref.namespace.as_deref(),
        Some(tenant.namespace.as_str())
    );
    assert_eq!(claim_ref.uid, copycat.uid());
    // Our annotations on a claim never reach a PV: the PV records the version that
    // made it.
    let recorded = mine
        .annotations()
        .get("wasm-provisioner.dev/module-sha256")
        .cloned()
        .unwrap_or_default();
    let echo_sha256 = {
        use sha2::Digest as _;
        let bytes = std::fs::read(wasm_provisioner_tests::guests::module("test-echo"))?;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    assert_eq!(recorded, echo_sha256);

    tokio::time::sleep(Duration::from_secs(3)).await;
    let squatter_now = tenant_claims.get("squatter").await?;
    assert_ne!(
        squatter_now
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref()),
        Some("Bound"),
        "the squatter was bound"
    );
    for uid in [squatter.uid(), foreign.uid()] {
        let name = format!("pvc-{}", uid.unwrap_or_default());
        assert!(
            fx.volumes().get_opt(&name).await?.is_none(),
            "{name} was provisioned"
        );
        assert_eq!(echo_calls(&host, "provision", &name), 0, "{name}");
    }
    let pv = fx.volumes().get(&victim_pv).await?;
    assert_eq!(
        pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.uid),
        Some(victim_uid.clone())
    );

    // The tenant deletes its claims (the one of another provisioner's class keeps our
    // finalizer: we never act on it, so the tenant removes it): the victim's volume
    // is never deleted.
    tenant_claims
        .patch(
            "foreign",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await?;
    for name in ["squatter", "copycat", "foreign"] {
        tenant_claims.delete(name, &DeleteParams::default()).await?;
    }
    wait_for("the tenant's claims gone", WAIT, || async {
        let left = tenant_claims.list(&Default::default()).await?.items.len();
        Ok((left == 0).then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", host.log_text()))?;
    fx.wait_volume_gone(&copycat_pv).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(echo_calls(&host, "delete", &victim_pv), 0);
    let victim_now = fx.claims().get("victim").await?;
    assert_eq!(
        victim_now.status.and_then(|s| s.phase).as_deref(),
        Some("Bound")
    );
    assert!(fx.volumes().get_opt(&victim_pv).await?.is_some());

    classes
        .delete(&other.name_any(), &DeleteParams::default())
        .await?;
    drop(host);
    tenant.cleanup().await;
    fx.cleanup().await;
    Ok(())
}

/// A claim deleted while the module is making its volume, and recreated at once with
/// the same name (a new uid): the volume made for the old claim is never bound to the
/// new one (its PV, if saved, names the old uid and is deleted with its backend), and
/// the new claim gets a volume of its own uid.
#[tokio::test]
async fn a_claim_recreated_mid_provision_gets_only_its_own_volume() -> anyhow::Result<()> {
    let mut fx = Fixture::new("recreate").await?;
    fx.write_grants(&["slow"])?;
    fx.install_module("test-slow", "slow");
    let host = fx.host(&[]);
    let class = fx
        .class("slow", &[("sleepMillis", "4000")], json!({}))
        .await?;
    let old = fx.claim("data", &class, "1Mi", json!({})).await?;
    let old_pv = format!("pvc-{}", old.uid().unwrap_or_default());
    fx.wait_claim_event("data", "Provisioning").await?;
    fx.claims().delete("data", &DeleteParams::default()).await?;
    fx.wait_claim("data", "gone", |c| c.is_none()).await?;
    let new = fx.claim("data", &class, "1Mi", json!({})).await?;
    let new_uid = new.uid().unwrap_or_default();

    let pv = fx
        .wait_bound("data")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", host.log_text()))?;
    assert_eq!(pv.name_any(), format!("pvc-{new_uid}"));
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.clone()),
        Some(new_uid.clone())
    );
    // The old claim's volume, if its PV was saved, is released and deleted.
    let published_for_old = host
        .log_text()
        .lines()
        .any(|line| line.contains("provisioned") && line.contains(&old_pv));
    eprintln!("the old claim's volume was published after the claim went: {published_for_old}");
    fx.wait_volume_gone(&old_pv)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", host.log_text()))?;
    let claim = fx.claims().get("data").await?;
    assert_eq!(claim.uid(), Some(new_uid));
    assert_eq!(claim.spec.and_then(|s| s.volume_name), Some(pv.name_any()));
    drop(host);
    fx.cleanup().await;
    Ok(())
}
