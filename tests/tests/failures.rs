//! Failures end to end, on the real control plane: the host runs with exactly the RBAC of
//! `deploy/rbac.yaml` (and with less of it), PVs that cannot be saved, backend deletes
//! that fail, and a module missing when its volume must be deleted. In every case no
//! backend volume is lost or leaked silently: it is deleted, or kept behind a finalizer
//! with a Warning Event saying why.

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::access::{Access, deploy_rules, without_verb};
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT, scenario};
use wasm_provisioner_tests::host::Host;

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";
const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn has_finalizer<K: ResourceExt>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// How many calls `call` of `module` ended with `outcome` (0 before the first).
fn guest_calls(host: &Host, call: &str, module: &str, outcome: &str) -> f64 {
    host.metric(&format!(
        "wasm_provisioner_guest_call_duration_seconds_count{{call=\"{call}\",module=\"{module}\",outcome=\"{outcome}\"}}"
    ))
    .unwrap_or_default()
}

/// Waits for an Event with `reason` about `name` in `namespace` whose note passes `check`;
/// returns the note.
async fn wait_event(
    fx: &Fixture,
    namespace: &str,
    name: &str,
    reason: &str,
    check: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    wait_for(
        &format!("Event {reason} on {namespace}/{name}"),
        WAIT,
        || async {
            let events = fx.events(namespace, name).await?;
            Ok(events
                .into_iter()
                .find(|(r, note)| r == reason && check(note))
                .map(|(_, note)| note))
        },
    )
    .await
}

/// Removes our finalizer from a claim by hand, as an admin would; conflicts (the PVC
/// protection controller edits finalizers too) are retried on a fresh copy.
async fn remove_claim_finalizer_by_hand(fx: &Fixture, name: &str) -> anyhow::Result<()> {
    let claims = fx.claims();
    wait_for(
        &format!("our finalizer removed by hand from claim {name}"),
        WAIT,
        || async {
            let Some(claim) = claims.get_opt(name).await? else {
                return Ok(Some(()));
            };
            if !has_finalizer(&claim, FINALIZER_CLAIM) {
                return Ok(Some(()));
            }
            let finalizers: Vec<&String> = claim
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER_CLAIM)
                .collect();
            let patch = json!({ "metadata": {
                "resourceVersion": claim.resource_version(),
                "finalizers": finalizers,
            }});
            match claims
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
                Err(error) => Err(error.into()),
            }
        },
    )
    .await
}

/// The host with exactly the RBAC of `deploy/rbac.yaml`, leader election on: it takes
/// the Lease, provisions, records Events, adds the PV finalizer and deletes the volume,
/// and the API never refuses it anything.
#[tokio::test]
async fn deploy_rbac_is_enough() {
    scenario("deploy-rbac", async |fx| {
        let (cluster_rules, leader_rules) = deploy_rules()?;
        let access = Access::grant(fx, cluster_rules, leader_rules).await?;
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[], json!({ "reclaimPolicy": "Delete" }))
            .await?;
        let namespace_flag = format!("--leader-election-namespace={}", fx.ctx.namespace);
        let config = access.host_config(fx, &["--leader-elect=true", &namespace_flag]);
        ensure!(
            !config.args.iter().any(|a| a == "--leader-elect=false"),
            "{:?}",
            config.args
        );
        let host = Host::start(&config)?;

        wait_for("the host to lead", WAIT, || async {
            Ok((host.metric("wasm_provisioner_leader") == Some(1.0)).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        let lease = Api::<Lease>::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace)
            .get(&fx.provisioner.replace('/', "-"))
            .await
            .context("the leader Lease in the fixture namespace")?;
        let holder = lease.spec.and_then(|s| s.holder_identity);
        ensure!(
            holder.as_deref().is_some_and(|h| !h.is_empty()),
            "the Lease has a holder: {holder:?}"
        );

        let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv = fx
            .wait_bound("data")
            .await
            .with_context(|| host.log_tail())?;
        let pv_name = pv.name_any();
        ensure!(pv_name == format!("pvc-{}", claim.uid().unwrap_or_default()));
        let note = fx
            .wait_claim_event("data", "ProvisioningSucceeded")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(note.contains(&pv_name), "{note}");
        fx.wait_claim("data", "our finalizer removed", |c| {
            c.is_some_and(|c| !has_finalizer(c, FINALIZER_CLAIM))
        })
        .await?;
        let volumes = fx.volumes();
        wait_for("the PV protection finalizer", WAIT, || async {
            Ok(has_finalizer(&volumes.get(&pv_name).await?, FINALIZER_PV).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;

        fx.claims().delete("data", &DeleteParams::default()).await?;
        fx.wait_volume_gone(&pv_name)
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            guest_calls(&host, "delete", "echo", "ok") == 1.0,
            "the backend volume was deleted through the plugin\n{}",
            host.log_tail()
        );

        // Nothing was refused on the way, Events included (a refused Event is only
        // logged, never fails an operation).
        let log = host.log_text();
        for refused in ["forbidden", "could not record an event"] {
            ensure!(
                !log.to_lowercase().contains(refused),
                "the host was refused something ({refused:?}): the deploy RBAC is not enough\n{}",
                host.log_tail()
            );
        }
        drop(host);
        access.revoke().await
    })
    .await;
}

/// The PV create is forbidden: after `--pv-save-retries` tries the host deletes the
/// backend volume the plugin made, says so in a Warning Event, and lets the claim go.
/// `--failed-provision-threshold=2` makes the host give up after three such rounds, so
/// the end state is stable when it is checked (while retrying, a round may be making
/// the directory again).
#[tokio::test]
async fn pv_that_cannot_be_saved_is_cleaned_up() {
    scenario("pv-unsaved", async |fx| {
        let (mut cluster_rules, leader_rules) = deploy_rules()?;
        without_verb(&mut cluster_rules, "persistentvolumes", "create")?;
        let access = Access::grant(fx, cluster_rules, leader_rules).await?;
        fx.install_module("hostpath", "hostpath");
        let class = fx
            .class("hostpath", &[("nodePath", "/srv/x")], json!({}))
            .await?;
        let host = Host::start(&access.host_config(
            fx,
            &[
                "--pv-save-retries=2",
                "--pv-save-interval=1s",
                "--failed-provision-threshold=2",
            ],
        ))?;
        let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
        let uid = claim.uid().unwrap_or_default();
        let pv_name = format!("pvc-{uid}");
        let dir = fx.module_data("hostpath").join(&pv_name);

        let note = wait_event(fx, &fx.ctx.namespace, "data", "ProvisioningFailed", |n| {
            n.contains("backend volume was deleted")
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(note.contains(&pv_name), "the note names the volume: {note}");
        ensure!(note.contains("2 tries"), "two tries to save the PV: {note}");
        ensure!(
            note.to_lowercase().contains("forbidden"),
            "the note says why the PV was not saved: {note}"
        );
        let note = wait_event(fx, &fx.ctx.namespace, "data", "ProvisioningFailed", |n| {
            n.contains("gave up")
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(note.contains("3 failed attempts"), "{note}");

        // The plugin made the directory each round and the host deleted it each round.
        let made = guest_calls(&host, "provision", "hostpath", "ok");
        let deleted = guest_calls(&host, "delete", "hostpath", "ok");
        ensure!(
            made >= 1.0 && made == deleted,
            "every volume made was deleted: {made} provisioned, {deleted} deleted\n{}",
            host.log_tail()
        );
        ensure!(
            !dir.exists(),
            "{} survived a PV that could not be saved\n{}",
            dir.display(),
            host.log_tail()
        );
        ensure!(
            std::fs::read_dir(fx.module_data("hostpath"))?
                .next()
                .is_none(),
            "nothing is left in the hostpath data directory"
        );
        ensure!(
            fx.volumes().get_opt(&pv_name).await?.is_none(),
            "no PV {pv_name} exists"
        );
        fx.wait_claim("data", "our finalizer removed after the cleanup", |c| {
            c.is_some_and(|c| !has_finalizer(c, FINALIZER_CLAIM))
        })
        .await
        .with_context(|| host.log_tail())?;
        let claim = fx.claims().get("data").await?;
        ensure!(
            claim.spec.and_then(|s| s.volume_name).is_none(),
            "the claim is not bound"
        );

        drop(host);
        access.revoke().await
    })
    .await;
}

/// The PV is stored although the host's creates all failed (as when the last create
/// timed out after the server stored it; here someone else creates it while the host's
/// creates are forbidden): the host looks once more before deleting the backend volume,
/// finds this claim's live PV and keeps the volume, which that PV owns.
#[tokio::test]
async fn a_pv_stored_despite_failed_saves_keeps_its_backend_volume() {
    scenario("pv-last-look", async |fx| {
        let (mut cluster_rules, leader_rules) = deploy_rules()?;
        without_verb(&mut cluster_rules, "persistentvolumes", "create")?;
        let access = Access::grant(fx, cluster_rules, leader_rules).await?;
        fx.install_module("hostpath", "hostpath");
        let class = fx
            .class("hostpath", &[("nodePath", "/srv/x")], json!({}))
            .await?;
        let host = Host::start(
            &access.host_config(fx, &["--pv-save-retries=2", "--pv-save-interval=4s"]),
        )?;
        let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
        let uid = claim.uid().unwrap_or_default();
        let pv_name = format!("pvc-{uid}");
        let dir = fx.module_data("hostpath").join(&pv_name);
        wait_for("the host's first failed PV save", WAIT, || async {
            Ok(host
                .log_text()
                .contains("could not save the PV")
                .then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        // Stored meanwhile, for this very claim (its UID in claimRef).
        let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
            "metadata": { "name": pv_name, "annotations": {
                "pv.kubernetes.io/provisioned-by": fx.provisioner,
            } },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "hostPath": { "path": format!("/srv/x/{pv_name}") },
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "namespace": fx.ctx.namespace,
                    "name": "data",
                    "uid": uid,
                },
            },
        }))?;
        fx.volumes().create(&PostParams::default(), &pv).await?;
        fx.wait_bound("data")
            .await
            .with_context(|| host.log_tail())?;
        fx.wait_claim("data", "our finalizer removed", |c| {
            c.is_some_and(|c| !has_finalizer(c, FINALIZER_CLAIM))
        })
        .await
        .with_context(|| host.log_tail())?;
        // Past the last try and the last look: the volume is still there.
        tokio::time::sleep(Duration::from_secs(6)).await;
        ensure!(
            dir.is_dir(),
            "{} was deleted under a live PV\n{}",
            dir.display(),
            host.log_tail()
        );
        let deleted = guest_calls(&host, "delete", "hostpath", "ok");
        ensure!(deleted == 0.0, "no backend delete: {deleted}");
        drop(host);
        fx.volumes()
            .delete(&pv_name, &DeleteParams::default())
            .await?;
        access.revoke().await
    })
    .await;
}

/// The PV create is forbidden and the plugin's delete fails too: the host warns with
/// ProvisioningCleanupFailed and keeps our finalizer, so the deleted claim cannot vanish
/// while its backend volume may exist.
#[tokio::test]
async fn cleanup_failure_keeps_the_claim_protected() {
    scenario("cleanup-failed", async |fx| {
        let (mut cluster_rules, leader_rules) = deploy_rules()?;
        without_verb(&mut cluster_rules, "persistentvolumes", "create")?;
        let access = Access::grant(fx, cluster_rules, leader_rules).await?;
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[("deleteOutcome", "failed")], json!({}))
            .await?;
        let host = Host::start(
            &access.host_config(fx, &["--pv-save-retries=2", "--pv-save-interval=1s"]),
        )?;
        fx.claim("data", &class, "1Gi", json!({})).await?;

        let note = fx
            .wait_claim_event("data", "ProvisioningCleanupFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("please delete") || note.contains("delete the volume manually"),
            "the note tells the user what to do: {note}"
        );
        ensure!(
            note.contains("echo: failed"),
            "the note has the cause: {note}"
        );
        let claim = fx.claims().get("data").await?;
        ensure!(
            has_finalizer(&claim, FINALIZER_CLAIM),
            "the claim keeps our finalizer while its backend volume exists"
        );

        fx.claims().delete("data", &DeleteParams::default()).await?;
        // The host keeps trying to clean up the deleted claim...
        wait_for("the host to retry the cleanup", WAIT, || async {
            Ok(host
                .log_text()
                .contains("is being deleted; cleaning up its backend volume")
                .then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        // ...and the claim stays, protected, all along.
        let watched = Instant::now();
        while watched.elapsed() < Duration::from_secs(4) {
            let claim = fx.claims().get_opt("data").await?.ok_or_else(|| {
                anyhow!(
                    "the claim vanished with its backend volume\n{}",
                    host.log_tail()
                )
            })?;
            ensure!(
                claim.metadata.deletion_timestamp.is_some(),
                "the claim is being deleted"
            );
            ensure!(
                has_finalizer(&claim, FINALIZER_CLAIM),
                "the deleted claim keeps our finalizer\n{}",
                host.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // An admin who deleted the volume by hand lets the claim go.
        remove_claim_finalizer_by_hand(fx, "data").await?;
        fx.wait_claim("data", "gone once the finalizer is removed", |c| {
            c.is_none()
        })
        .await?;
        drop(host);
        access.revoke().await
    })
    .await;
}

/// The plugin fails to delete a released volume: a VolumeFailedDelete Event on the PV,
/// retries, and the PV kept with its finalizer; past `--failed-delete-threshold` (2
/// retries: the third failure) one Warning says it was given up (and counted), the
/// volume still kept; switching it to Retain releases it.
#[tokio::test]
async fn failed_delete_is_reported_and_retried() {
    scenario("delete-failed", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx
            .class(
                "echo",
                &[("deleteOutcome", "failed")],
                json!({ "reclaimPolicy": "Delete" }),
            )
            .await?;
        let host = fx.host(&["--failed-delete-threshold=2"]);
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv_name = fx
            .wait_bound("data")
            .await
            .with_context(|| host.log_tail())?
            .name_any();
        let volumes = fx.volumes();
        wait_for("the PV protection finalizer", WAIT, || async {
            Ok(has_finalizer(&volumes.get(&pv_name).await?, FINALIZER_PV).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;

        fx.claims().delete("data", &DeleteParams::default()).await?;
        let note = wait_event(fx, "default", &pv_name, "VolumeFailedDelete", |_| true)
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("echo: failed"),
            "the note has the plugin's message: {note}"
        );
        wait_for("the delete to be retried", WAIT, || async {
            Ok((guest_calls(&host, "delete", "echo", "failed") >= 2.0).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        let note = wait_event(fx, "default", &pv_name, "VolumeFailedDelete", |n| {
            n.contains("gave up")
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("gave up after 3 failed attempts (--failed-delete-threshold)")
                && note.contains("echo: failed")
                && note.contains("The volume is kept"),
            "the give-up note: {note}"
        );
        ensure!(
            host.metric("wasm_provisioner_given_up_total{queue=\"volumes\"}") == Some(1.0),
            "given up counted once: {:?}",
            host.metric("wasm_provisioner_given_up_total{queue=\"volumes\"}")
        );
        let pv = volumes.get(&pv_name).await?;
        let phase = pv.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(
            phase.as_deref() == Some("Released"),
            "the PV is kept, Released: {phase:?}"
        );
        ensure!(
            has_finalizer(&pv, FINALIZER_PV),
            "the PV keeps the protection finalizer"
        );
        ensure!(
            pv.metadata.deletion_timestamp.is_none(),
            "the PV is not being deleted"
        );

        // Retain: the backend volume must be left alone and the PV free to go.
        volumes
            .patch(
                &pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "persistentVolumeReclaimPolicy": "Retain" } })),
            )
            .await?;
        wait_for("the host to remove the PV finalizer", WAIT, || async {
            Ok((!has_finalizer(&volumes.get(&pv_name).await?, FINALIZER_PV)).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        // No delete is attempted any more (a retry already scheduled finds Retain).
        let failed = guest_calls(&host, "delete", "echo", "failed");
        tokio::time::sleep(Duration::from_secs(6)).await;
        ensure!(
            guest_calls(&host, "delete", "echo", "failed") == failed,
            "a Retain volume must not be deleted\n{}",
            host.log_tail()
        );
        ensure!(guest_calls(&host, "delete", "echo", "ok") == 0.0);

        volumes.delete(&pv_name, &DeleteParams::default()).await?;
        fx.wait_volume_gone(&pv_name).await?;
        drop(host);
        Ok(())
    })
    .await;
}

/// The module that made a volume is gone when the volume must be deleted: the PV stays
/// with a VolumeFailedDelete Event naming the module, and once the module is back the
/// volume is deleted.
#[tokio::test]
async fn module_missing_at_delete_time_keeps_the_volume() {
    scenario("module-missing", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[], json!({ "reclaimPolicy": "Delete" }))
            .await?;
        let host = fx.host(&[]);
        fx.claim("data", &class, "1Gi", json!({})).await?;
        let pv_name = fx
            .wait_bound("data")
            .await
            .with_context(|| host.log_tail())?
            .name_any();
        let volumes = fx.volumes();
        wait_for("the PV protection finalizer", WAIT, || async {
            Ok(has_finalizer(&volumes.get(&pv_name).await?, FINALIZER_PV).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;

        fx.remove_module("echo");
        wait_for(
            "the reload to drop module echo",
            Duration::from_secs(10),
            || async {
                let removals =
                    host.metric("wasm_provisioner_module_removals_total{module=\"echo\"}");
                Ok((removals == Some(1.0)).then_some(()))
            },
        )
        .await
        .with_context(|| host.log_tail())?;

        fx.claims().delete("data", &DeleteParams::default()).await?;
        let note = wait_event(fx, "default", &pv_name, "VolumeFailedDelete", |_| true)
            .await
            .with_context(|| host.log_tail())?;
        ensure!(note.contains("echo"), "the note names the module: {note}");
        // Kept while the module is missing, through more than one retry.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pv = volumes
            .get_opt(&pv_name)
            .await?
            .ok_or_else(|| anyhow!("the PV of a volume nobody could delete vanished"))?;
        ensure!(
            has_finalizer(&pv, FINALIZER_PV),
            "the PV keeps its finalizer"
        );
        ensure!(guest_calls(&host, "delete", "echo", "ok") == 0.0);

        fx.install_module("test-echo", "echo");
        fx.wait_volume_gone(&pv_name)
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            guest_calls(&host, "delete", "echo", "ok") == 1.0,
            "the module that came back deleted the backend volume\n{}",
            host.log_tail()
        );
        drop(host);
        Ok(())
    })
    .await;
}

/// A PV named `pvc-<uid>` that is another claim's (made by hand, or copied) makes every
/// save of this claim's volume a conflict. When the claim is then deleted, its backend
/// volume is nobody's: it must be deleted through the module, not left behind because
/// "a PV of that name exists".
#[tokio::test]
async fn foreign_pv_with_our_name_does_not_leak_the_backend_volume() {
    scenario("foreign-pv", async |fx| {
        fx.install_module("hostpath", "hostpath");
        let class = fx
            .class("hostpath", &[("nodePath", "/srv/x")], json!({}))
            .await?;
        let claim = fx.claim("data", &class, "1Mi", json!({})).await?;
        let pv_name = format!("pvc-{}", claim.uid().unwrap_or_default());
        let foreign: k8s_openapi::api::core::v1::PersistentVolume =
            serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": { "name": pv_name },
                "spec": {
                    "capacity": { "storage": "1Mi" },
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": { "path": "/srv/foreign", "type": "Directory" },
                    "claimRef": { "namespace": fx.ctx.namespace, "name": "someone-else",
                        "uid": "11111111-2222-4333-8444-555555555555" },
                },
            }))?;
        fx.volumes()
            .create(&PostParams::default(), &foreign)
            .await?;
        let host = fx.host(&[]);
        let dir = fx.module_data("hostpath").join(&pv_name);

        wait_event(fx, &fx.ctx.namespace, "data", "ProvisioningFailed", |n| {
            n.contains("not this claim's live volume")
        })
        .await
        .with_context(|| host.log_tail())?;
        ensure!(
            dir.is_dir(),
            "the module made the backend volume {}",
            dir.display()
        );

        fx.claims().delete("data", &DeleteParams::default()).await?;
        fx.wait_claim("data", "gone", |c| c.is_none())
            .await
            .with_context(|| host.log_tail())?;
        wait_for("the backend volume deleted", WAIT, || async {
            Ok((!dir.exists()).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        // The foreign PV is untouched.
        ensure!(fx.volumes().get_opt(&pv_name).await?.is_some());
        let _ = fx
            .volumes()
            .delete(&pv_name, &DeleteParams::default())
            .await;
        Ok(())
    })
    .await;
}

/// `--volume-protection-finalizer=false` (the rollback switch, docs/configuration.md): new PVs get no finalizer, and PVs
/// made earlier with it lose it (the library's rollback path), so a PV switched to Retain
/// and deleted is never stuck Terminating.
#[tokio::test]
async fn the_volume_protection_finalizer_can_be_turned_off_and_rolled_back() {
    scenario("pv-finalizer-off", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx.class("echo", &[], json!({})).await?;
        let mut host = fx.host(&[]);
        fx.claim("before", &class, "1Mi", json!({})).await?;
        let before = fx.wait_bound("before").await?;
        ensure!(
            has_finalizer(&before, FINALIZER_PV),
            "by default our PVs carry {FINALIZER_PV}"
        );
        host.terminate(Duration::from_secs(30))?;

        let host = fx.host(&["--volume-protection-finalizer=false"]);
        fx.claim("after", &class, "1Mi", json!({})).await?;
        let after = fx.wait_bound("after").await?;
        ensure!(
            !has_finalizer(&after, FINALIZER_PV),
            "with the flag off a new PV has no finalizer: {:?}",
            after.finalizers()
        );
        let volumes = fx.volumes();
        let name = before.name_any();
        wait_for("the earlier PV's finalizer removed", WAIT, || async {
            let pv = volumes.get(&name).await?;
            Ok((!has_finalizer(&pv, FINALIZER_PV)).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        Ok(())
    })
    .await;
}
