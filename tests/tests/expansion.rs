//! Volume expansion on the real control plane: a Bound claim of a class with
//! `allowVolumeExpansion: true` asks for more storage; kube-controller-manager's expand
//! controller tells it `ExternalExpanding`, and the host grows the volume through the
//! module that made it, as kubernetes-csi/external-resizer does for a volume that needs
//! no step on a node (the claim marked `Resizing` and `ControllerResizeInProgress`,
//! the PV's capacity, then the claim's status capacity, the marks cleared).

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use wasm_provisioner_rules::types::{Capability, ExpandError, ExpandRequest, PublishedVolume};
use wasm_provisioner_tests::access::{Access, deploy_rules};
use wasm_provisioner_tests::fixture::{Fixture, WAIT, scenario};
use wasm_provisioner_tests::guests;
use wasm_provisioner_tests::host::Host;

const NODE_PATH: &str = "/var/lib/wasm-provisioner/hostpath";

/// Asks for `size` on the claim `name`.
async fn request(fx: &Fixture, name: &str, size: &str) -> anyhow::Result<()> {
    let patch = json!({ "spec": { "resources": { "requests": { "storage": size } } } });
    fx.claims()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("asking for {size} on claim {name}"))?;
    Ok(())
}

fn capacity(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .map(|q| q.0.as_str())
}

fn storage_status(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get("storage")
        .map(String::as_str)
}

fn condition_types(claim: &PersistentVolumeClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().map(|c| c.type_.clone()).collect())
        .unwrap_or_default()
}

/// The PV's `spec.capacity.storage`.
async fn volume_capacity(fx: &Fixture, name: &str) -> anyhow::Result<String> {
    let pv = fx.volumes().get(name).await?;
    Ok(pv
        .spec
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("storage").map(|q| q.0.clone()))
        .unwrap_or_default())
}

/// The Events with `reason` on the claim `claim`: (note, how many times it happened).
async fn claim_events(
    fx: &Fixture,
    claim: &str,
    reason: &str,
) -> anyhow::Result<Vec<(String, i32)>> {
    let events: Api<Event> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (e.note.unwrap_or_default(), count)
        })
        .collect())
}

/// How many expansions of module `hostpath` in `class` ended with `outcome`.
fn expansions(host: &Host, class: &str, outcome: &str) -> f64 {
    host.metric(&format!(
        "wasm_provisioner_volume_expansions_total{{class=\"{class}\",module=\"hostpath\",outcome=\"{outcome}\"}}"
    ))
    .unwrap_or_default()
}

/// A hostpath class that allows expansion, with these extra parameters.
async fn expandable_class(fx: &mut Fixture, parameters: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut all = vec![("nodePath", NODE_PATH)];
    all.extend_from_slice(parameters);
    fx.class("hostpath", &all, json!({ "allowVolumeExpansion": true }))
        .await
}

/// The whole expansion: kube-controller-manager's `ExternalExpanding`, then the host's
/// `Resizing` and `VolumeResizeSuccessful`, the PV and the claim's status at the new
/// size, no resize condition or status left, the expansion counted. The host leads
/// (leader election on) and runs with exactly the RBAC of `deploy/rbac.yaml`.
#[tokio::test]
async fn a_hostpath_volume_is_expanded() {
    scenario("expand", async |fx| {
        let (cluster_rules, leader_rules) = deploy_rules()?;
        let access = Access::grant(fx, cluster_rules, leader_rules).await?;
        fx.install_module("hostpath", "hostpath");
        let class = expandable_class(fx, &[("maxSize", "4Gi")]).await?;
        let namespace_flag = format!("--leader-election-namespace={}", fx.ctx.namespace);
        let host = Host::start(&access.host_config(fx, &["--leader-elect=true", &namespace_flag]))?;
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv = fx.wait_bound("data").await?;
        let pv = pv.metadata.name.clone().unwrap_or_default();

        request(fx, "data", "2Gi").await?;
        let note = fx
            .wait_claim_event("data", "ExternalExpanding")
            .await
            .context("kube-controller-manager's expand controller")?;
        ensure!(
            note.contains("waiting for an external controller to expand this PVC"),
            "{note}"
        );
        let resizing = fx
            .wait_claim_event("data", "Resizing")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            resizing.contains("hostpath") && resizing.contains("to 2Gi"),
            "{resizing}"
        );
        let done = fx
            .wait_claim_event("data", "VolumeResizeSuccessful")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(done.contains("2Gi"), "{done}");
        fx.wait_claim("data", "status capacity 2Gi, no resize marks", |c| {
            c.is_some_and(|c| {
                capacity(c) == Some("2Gi")
                    && condition_types(c).is_empty()
                    && storage_status(c).is_none()
            })
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(volume_capacity(fx, &pv).await? == "2Gi");
        let claim = fx.claims().get("data").await?;
        let allocated = claim
            .status
            .as_ref()
            .and_then(|s| s.allocated_resources.as_ref())
            .and_then(|a| a.get("storage"))
            .map(|q| q.0.clone());
        ensure!(allocated.as_deref() == Some("2Gi"), "{allocated:?}");
        ensure!(
            expansions(&host, &class, "ok") == 1.0,
            "expansions counted: {}",
            host.log_tail()
        );
        let failed = claim_events(fx, "data", "VolumeResizeFailed").await?;
        ensure!(failed.is_empty(), "{failed:?}");
        // Once: the echoes of the host's own writes (the claim's status, the PV) do not
        // expand it, or finish it, again.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let calls = host.metric(
            "wasm_provisioner_guest_call_duration_seconds_count{call=\"expand\",module=\"hostpath\",outcome=\"ok\"}",
        );
        ensure!(calls == Some(1.0), "expand called {calls:?} times\n{}", host.log_tail());
        let succeeded = claim_events(fx, "data", "VolumeResizeSuccessful").await?;
        ensure!(
            succeeded.len() == 1 && succeeded[0].1 == 1,
            "{succeeded:?}"
        );
        drop(host);
        access.revoke().await?;
        Ok(())
    })
    .await;
}

/// Beyond the class's `maxSize`, hostpath answers infeasible: a `VolumeResizeFailed`
/// Warning with its message, the claim marked `ControllerResizeInfeasible`, the PV
/// unchanged; retried at the slow interval only, and at once when the claim asks for
/// another size (within `maxSize`: then expanded). A claim asking for less than its PV
/// is (but more than its capacity) is a shrink: refused, without a guest call.
#[tokio::test]
async fn beyond_max_size_and_shrinks_are_refused() {
    scenario("expand-refused", async |fx| {
        fx.install_module("hostpath", "hostpath");
        let class = expandable_class(fx, &[("maxSize", "2Gi")]).await?;
        let host = fx.host(&[]);
        fx.claim("big", &class, "1Gi", json!({})).await?;
        fx.claim("shrink", &class, "1Gi", json!({})).await?;
        let pv = fx.wait_bound("big").await?;
        let pv = pv.metadata.name.clone().unwrap_or_default();

        request(fx, "big", "3Gi").await?;
        let note = fx
            .wait_claim_event("big", "VolumeResizeFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("maxSize") && note.contains("infeasible") && note.contains("hostpath"),
            "the guest's message: {note}"
        );
        fx.wait_claim("big", "marked infeasible", |c| {
            c.is_some_and(|c| {
                storage_status(c) == Some("ControllerResizeInfeasible")
                    && condition_types(c).contains(&"ControllerResizeError".to_string())
            })
        })
        .await?;
        ensure!(
            volume_capacity(fx, &pv).await? == "1Gi",
            "the PV is unchanged"
        );
        // The slow interval (--retry-interval-max, 5 s here), not the back-off (1 s).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let infeasible = expansions(&host, &class, "infeasible");
        ensure!(
            infeasible == 1.0,
            "asked {infeasible} times within 3 s of an infeasible answer\n{}",
            host.log_tail()
        );

        // Another size, within maxSize: asked at once, and expanded.
        request(fx, "big", "2Gi").await?;
        fx.wait_claim("big", "expanded to 2Gi, no resize marks", |c| {
            c.is_some_and(|c| {
                capacity(c) == Some("2Gi")
                    && condition_types(c).is_empty()
                    && storage_status(c).is_none()
            })
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(volume_capacity(fx, &pv).await? == "2Gi");

        // A PV larger than the claim asks for (an admin's edit): a shrink, refused.
        let small = fx.wait_bound("shrink").await?;
        let small = small.metadata.name.clone().unwrap_or_default();
        let larger = json!({ "spec": { "capacity": { "storage": "4Gi" } } });
        fx.volumes()
            .patch(&small, &PatchParams::default(), &Patch::Merge(&larger))
            .await?;
        let ok_before = expansions(&host, &class, "ok");
        request(fx, "shrink", "2Gi").await?;
        let note = fx
            .wait_claim_event("shrink", "VolumeResizeFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("shrinking a volume is not supported"),
            "{note}"
        );
        ensure!(volume_capacity(fx, &small).await? == "4Gi");
        ensure!(
            expansions(&host, &class, "ok") == ok_before
                && expansions(&host, &class, "shrink") == 1.0,
            "a shrink calls no guest\n{}",
            host.log_tail()
        );
        Ok(())
    })
    .await;
}

/// A host killed right after it wrote an expanded volume's PV capacity, before the
/// claim's status: the next host finishes the claim from the PV, without asking the
/// module again.
#[tokio::test]
async fn a_crash_after_the_pv_capacity_is_finished_without_another_call() {
    scenario("expand-crash", async |fx| {
        fx.install_module("hostpath", "hostpath");
        let class = expandable_class(fx, &[]).await?;
        let mut crashing = fx.host(&["--fault-exit-after=pv-capacity"]);
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv = fx.wait_bound("data").await?;
        let pv = pv.metadata.name.clone().unwrap_or_default();
        request(fx, "data", "2Gi").await?;
        let status = crashing.wait(WAIT)?;
        ensure!(status.code() == Some(137), "the fault hook exits like kill -9: {status:?}");
        ensure!(volume_capacity(fx, &pv).await? == "2Gi", "the PV was written");
        let claim = fx.claims().get("data").await?;
        ensure!(
            capacity(&claim) == Some("1Gi")
                && storage_status(&claim) == Some("ControllerResizeInProgress"),
            "the claim's status was not: {:?}",
            claim.status
        );

        let host = fx.host(&[]);
        fx.wait_claim("data", "finished at 2Gi, no resize marks", |c| {
            c.is_some_and(|c| {
                capacity(c) == Some("2Gi")
                    && condition_types(c).is_empty()
                    && storage_status(c).is_none()
            })
        })
        .await
        .with_context(|| host.log_tail())?;
        fx.wait_claim_event("data", "VolumeResizeSuccessful").await?;
        let calls = host
            .metric(
                "wasm_provisioner_guest_call_duration_seconds_count{call=\"expand\",module=\"hostpath\",outcome=\"ok\"}",
            )
            .unwrap_or_default();
        ensure!(calls == 0.0, "the module was asked again: {calls}\n{}", host.log_tail());
        Ok(())
    })
    .await;
}

/// A module without the `expand` capability (the 0.1 build of hostpath): one clear
/// `VolumeResizeFailed` naming the module, no retries, the volume unchanged. Once a
/// version that can expand is deployed, the next resync expands it.
#[tokio::test]
async fn a_module_without_expand_says_so_once() {
    scenario("expand-unsupported", async |fx| {
        std::fs::copy(
            guests::fixture("hostpath-0.1.0"),
            fx.modules.join("hostpath.wasm"),
        )?;
        let class = expandable_class(fx, &[]).await?;
        let host = fx.host(&["--resync-period=8s"]);
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv = fx.wait_bound("data").await?;
        let pv = pv.metadata.name.clone().unwrap_or_default();

        request(fx, "data", "2Gi").await?;
        let note = fx
            .wait_claim_event("data", "VolumeResizeFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("module hostpath cannot expand volumes"),
            "{note}"
        );
        // The claim edited (a label) and the PV too: reconciled again, not told again.
        let label = json!({ "metadata": { "labels": { "edited": "yes" } } });
        fx.claims()
            .patch("data", &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        let volumes = fx.volumes();
        volumes
            .patch(&pv, &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let told = claim_events(fx, "data", "VolumeResizeFailed").await?;
        ensure!(
            told.len() == 1 && told[0].1 == 1,
            "told {told:?}\n{}",
            host.log_tail()
        );
        ensure!(expansions(&host, &class, "unsupported") == 1.0);
        let claim = fx.claims().get("data").await?;
        ensure!(capacity(&claim) == Some("1Gi"));
        ensure!(
            storage_status(&claim).is_none(),
            "nothing marked in progress"
        );
        let volume = volumes.get(&pv).await?;
        let size = volume
            .spec
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").map(|q| q.0.clone()));
        ensure!(size.as_deref() == Some("1Gi"), "{size:?}");

        // The 0.2 build replaces it (hot reload): expanded at the next resync.
        fx.install_module("hostpath", "hostpath");
        fx.wait_claim("data", "expanded to 2Gi by the new version", |c| {
            c.is_some_and(|c| capacity(c) == Some("2Gi") && storage_status(c).is_none())
        })
        .await
        .with_context(|| host.log_tail())?;
        let told = claim_events(fx, "data", "VolumeResizeFailed").await?;
        ensure!(told.len() == 1 && told[0].1 == 1, "told {told:?}");
        Ok(())
    })
    .await;
}

/// How many `expand` calls of module `echo` answered `outcome` (`ok`, or the error).
fn echo_expands(host: &Host, outcome: &str) -> f64 {
    host.metric(&format!(
        "wasm_provisioner_guest_call_duration_seconds_count{{call=\"expand\",module=\"echo\",outcome=\"{outcome}\"}}"
    ))
    .unwrap_or_default()
}

/// A module expanding in the background is asked again soon, the claim still in
/// progress and nothing told as a failure; a failure is a `VolumeResizeFailed` Warning
/// with its message and a `ControllerResizeError` condition, retried with back-off;
/// the next success clears it all. (The echo guest answers what a file says.)
#[tokio::test]
async fn an_expansion_in_the_background_or_failing_is_asked_again() {
    scenario("expand-again", async |fx| {
        fx.install_module("test-echo", "echo");
        let outcome = fx.module_data("echo").join("expand");
        std::fs::write(&outcome, "in-background")?;
        let class = fx
            .class(
                "echo",
                &[("expandOutcomeFile", "/volumes/expand")],
                json!({ "allowVolumeExpansion": true }),
            )
            .await?;
        let host = fx.host(&[]);
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv = fx.wait_bound("data").await?;
        let pv = pv.metadata.name.clone().unwrap_or_default();
        request(fx, "data", "2Gi").await?;

        wait_for_answers(&host, "in_background", 2.0).await?;
        let claim = fx.claims().get("data").await?;
        ensure!(
            storage_status(&claim) == Some("ControllerResizeInProgress"),
            "{:?}",
            claim.status
        );
        let failed = claim_events(fx, "data", "VolumeResizeFailed").await?;
        ensure!(
            failed.is_empty(),
            "in the background is no failure: {failed:?}"
        );
        ensure!(volume_capacity(fx, &pv).await? == "1Gi");

        std::fs::write(&outcome, "failed")?;
        let note = fx
            .wait_claim_event("data", "VolumeResizeFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(note.contains("echo: failed"), "{note}");
        fx.wait_claim("data", "a ControllerResizeError condition", |c| {
            c.is_some_and(|c| condition_types(c).contains(&"ControllerResizeError".to_string()))
        })
        .await?;

        std::fs::write(&outcome, "ok")?;
        fx.wait_claim("data", "expanded to 2Gi, no resize marks", |c| {
            c.is_some_and(|c| {
                capacity(c) == Some("2Gi")
                    && condition_types(c).is_empty()
                    && storage_status(c).is_none()
            })
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(volume_capacity(fx, &pv).await? == "2Gi");
        ensure!(echo_expands(&host, "ok") == 1.0, "{}", host.log_tail());
        Ok(())
    })
    .await;
}

/// Waits until the echo module's `expand` answered `outcome` at least `count` times.
async fn wait_for_answers(host: &Host, outcome: &str, count: f64) -> anyhow::Result<()> {
    wasm_provisioner_tests::cluster::wait_for(
        &format!("{count} expand answers {outcome}"),
        WAIT,
        || async { Ok((echo_expands(host, outcome) >= count).then_some(())) },
    )
    .await
    .with_context(|| host.log_tail())
}

/// The nfs-subdir guest expands too, through the runtime: the size within the class's
/// `maxSize` is answered (recorded, nothing to enforce on NFS), beyond it infeasible.
#[tokio::test]
async fn nfs_subdir_expands_within_its_max_size() {
    let granted = tempfile::tempdir().unwrap();
    let runtime = guests::runtime(&format!(
        "allow: {{ directories: [{dir}] }}\nmodules: {{ nfs: {{ directories: [{{ host: {dir}, guest: /export, mode: read-write }}] }} }}",
        dir = granted.path().display(),
    ));
    let nfs = guests::load(&runtime, "nfs", "nfs-subdir").await;
    assert!(nfs.has(Capability::Expand), "{:?}", nfs.info());
    let parameters = [
        ("server", "nfs.example.com"),
        ("share", "/srv/nfs"),
        ("maxSize", "2Gi"),
    ];
    let request = guests::provision_request(&parameters);
    let volume = nfs.provision(&request).await.unwrap().expect("provisioned");
    let expand = |requested_bytes: u64| ExpandRequest {
        volume: PublishedVolume {
            name: request.volume_name.clone(),
            source: volume.source.clone(),
            capacity_bytes: volume.capacity_bytes,
            labels: volume.labels.clone(),
            annotations: volume.annotations.clone(),
            node_affinity: volume.node_affinity.clone(),
            claim_namespace: Some(request.claim.namespace.clone()),
            claim_name: Some(request.claim.name.clone()),
        },
        class_name: request.class.name.clone(),
        class_parameters: request.class.parameters.clone(),
        requested_bytes,
        secret: None,
        context: Default::default(),
    };
    assert_eq!(nfs.expand(&expand(1 << 30)).await.unwrap(), Ok(1 << 30));
    match nfs.expand(&expand(3 << 30)).await.unwrap() {
        Err(ExpandError::Infeasible(message)) => {
            assert!(message.contains("maxSize"), "{message}")
        }
        other => panic!("an expansion past maxSize answered {other:?}"),
    }
}
