//! What a namespace tenant can do to the bundled guests' volumes, on the real control
//! plane: two claims choosing one nfs-subdir directory, and a volume
//! too large to delete in one call (deleted in chunks, the PV goes when done); see
//! docs/security.md.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT};

const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// A claim whose nfs-subdir directory is the annotation `dir`, as a tenant chooses it.
fn in_dir(dir: &str) -> serde_json::Value {
    json!({ "metadata": { "annotations": { "dir": dir } } })
}

/// Two tenants' claims expand `pathPattern` to the same directory. The second is
/// refused (it would read the first's data, and deleting either would delete both);
/// deleting the first deletes only its own volume, after which the second gets a fresh,
/// empty directory of its own.
#[tokio::test]
async fn nfs_subdir_claims_never_share_a_directory() -> anyhow::Result<()> {
    let mut fx = Fixture::new("nfs-collision").await?;
    fx.install_module("nfs-subdir", "nfs-subdir");
    let class = fx
        .class(
            "nfs-subdir",
            &[
                ("server", "nfs.example.com"),
                ("share", "/srv/nfs"),
                ("guestRoot", "/volumes"),
                ("pathPattern", "${.PVC.annotations.dir}"),
            ],
            json!({ "reclaimPolicy": "Delete" }),
        )
        .await?;
    let host = fx.host(&[]);
    let export = fx.module_data("nfs-subdir");

    fx.claim("first", &class, "1Gi", in_dir("shared")).await?;
    let first = fx.wait_bound("first").await?;
    let nfs = first.spec.as_ref().and_then(|s| s.nfs.clone()).unwrap();
    assert_eq!(nfs.path, "/srv/nfs/shared");
    std::fs::write(export.join("shared/first-secret"), "first's data")?;

    let second = fx.claim("second", &class, "1Gi", in_dir("shared")).await?;
    let note = fx.wait_claim_event("second", "ProvisioningFailed").await?;
    assert!(
        note.contains("shared") && note.contains("already belongs to another volume"),
        "the Event names the directory and the reason: {note}\n{}",
        host.log_text()
    );
    assert!(
        !note.contains(&first.name_any()),
        "the other tenant's volume is not disclosed: {note}"
    );
    let second_pv = format!("pvc-{}", second.uid().unwrap());
    assert!(
        fx.volumes().get_opt(&second_pv).await?.is_none(),
        "no PV may publish the first claim's directory for the second"
    );
    assert_eq!(
        std::fs::read_to_string(export.join("shared/first-secret"))?,
        "first's data"
    );

    // The first goes: its directory with it. The path is free, and the second claim
    // (retried) gets it fresh: nothing of the first is visible to it.
    fx.claims()
        .delete("first", &DeleteParams::default())
        .await?;
    fx.wait_volume_gone(&first.name_any()).await?;
    let bound = fx.wait_bound("second").await?;
    assert_eq!(bound.name_any(), second_pv);
    let left: Vec<_> = std::fs::read_dir(export.join("shared"))?.collect();
    assert!(left.is_empty(), "the second volume starts empty: {left:?}");
    std::fs::write(export.join("shared/second-data"), "second's data")?;

    // A third claim for the same directory is refused while the second holds it, and
    // the second's data survives that.
    fx.claim("third", &class, "1Gi", in_dir("shared")).await?;
    let note = fx.wait_claim_event("third", "ProvisioningFailed").await?;
    assert!(note.contains("already belongs to another volume"), "{note}");
    assert_eq!(
        std::fs::read_to_string(export.join("shared/second-data"))?,
        "second's data"
    );
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// A tenant filled its hostpath volume with more entries (and deeper) than one delete
/// call handles (`deleteChunkEntries: 2000`): the guest answers in-background after each
/// chunk, the host keeps the PV and its finalizer and asks again without a Warning or a
/// failed attempt, and the PV goes once the directory is gone.
#[tokio::test]
async fn a_large_volume_is_deleted_in_background_rounds() -> anyhow::Result<()> {
    let mut fx = Fixture::new("delete-chunks").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class(
            "hostpath",
            &[
                ("nodePath", "/var/lib/wasm-provisioner/hostpath"),
                ("deleteChunkEntries", "2000"),
            ],
            json!({ "reclaimPolicy": "Delete" }),
        )
        .await?;
    let host = fx.host(&[]);
    fx.claim("big", &class, "1Gi", json!({})).await?;
    let pv = fx.wait_bound("big").await?;
    let volume = pv.name_any();
    let dir = fx.module_data("hostpath").join(&volume);

    // 10 000 files, and a 3 000-deep chain (built by renames, as a pod could).
    for i in 0..10_000 {
        std::fs::File::create(dir.join(format!("f{i}")))?;
    }
    std::fs::create_dir(dir.join("d"))?;
    for _ in 0..3_000 {
        std::fs::create_dir(dir.join("up"))?;
        std::fs::rename(dir.join("d"), dir.join("up/d"))?;
        std::fs::rename(dir.join("up"), dir.join("d"))?;
    }

    fx.claims().delete("big", &DeleteParams::default()).await?;
    // While the rounds go on, the PV stays, protected by its finalizer.
    let volumes = fx.volumes();
    wait_for("a first in-background round", WAIT, || async {
        let rounds = host.metric(&in_background_rounds()).unwrap_or(0.0);
        Ok((rounds >= 1.0).then_some(()))
    })
    .await?;
    if let Some(live) = volumes.get_opt(&volume).await? {
        assert!(
            live.finalizers().iter().any(|f| f == FINALIZER_PV),
            "the PV keeps its finalizer while its volume is being deleted"
        );
    }
    wait_for(
        &format!("volume {volume} to be deleted"),
        Duration::from_secs(180),
        || async { Ok(volumes.get_opt(&volume).await?.is_none().then_some(())) },
    )
    .await?;

    assert!(!dir.exists(), "{} survived the delete", dir.display());
    let rounds = host.metric(&in_background_rounds()).unwrap_or(0.0);
    assert!(
        rounds >= 3.0,
        "16 000 entries at 2 000 per call take several rounds; saw {rounds}\n{}",
        host.log_text()
    );
    assert_eq!(
        host.metric(&format!(
            "controller_persistentvolume_delete_total{{class=\"{class}\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        host.metric(&format!(
            "controller_persistentvolume_delete_failed_total{{class=\"{class}\"}}"
        ))
        .unwrap_or(0.0),
        0.0,
        "an in-background round is not a failed attempt"
    );
    let events = fx.events("default", &volume).await?;
    assert!(
        !events
            .iter()
            .any(|(reason, _)| reason == "VolumeFailedDelete"),
        "no Warning for a delete making progress: {events:?}"
    );
    // One Normal Event says it is under way: one object, and no series (a repeat of
    // the same reason would have made one).
    let all: Api<Event> = Api::namespaced(fx.ctx.client.clone(), "default");
    let deleting: Vec<Event> = all
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("VolumeDeleting")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(volume.as_str())
        })
        .collect();
    assert_eq!(deleting.len(), 1, "{events:?}");
    assert_eq!(deleting[0].type_.as_deref(), Some("Normal"));
    assert!(
        deleting[0].series.is_none(),
        "announced once, not per chunk: {:?}",
        deleting[0].series
    );
    drop(host);
    fx.cleanup().await;
    Ok(())
}

fn in_background_rounds() -> String {
    "wasm_provisioner_guest_call_duration_seconds_count{call=\"delete\",module=\"hostpath\",outcome=\"in_background\"}".to_string()
}
