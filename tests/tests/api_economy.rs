//! The host's API bill, counted by its own client
//! (`wasm_provisioner_kube_api_requests_total`) on the real control plane (issue 11.2):
//! a provisioned volume costs 5 writes (the claim finalizer added, the Provisioning
//! Event, the PV create, the ProvisioningSucceeded Event, the claim finalizer removed),
//! no read and no 409; its deletion 2 writes (the PV delete, the PV finalizer removed),
//! no read and no 409; a WaitForFirstConsumer claim waiting for its node costs nothing.
//! The claim finalizer is removed only once the binder has bound the claim, so the edit
//! neither races the binder's update nor makes it sync a Pending claim again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::load::{host_requests, settled_requests};

#[tokio::test]
async fn a_volume_costs_five_writes_and_its_deletion_two_with_no_read_and_no_conflict()
-> anyhow::Result<()> {
    const CLAIMS: usize = 20;
    let mut fx = Fixture::new("economy").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class("hostpath", &[("nodePath", "/srv/economy")], json!({}))
        .await?;
    let host = fx.host(&[]);
    let before = settled_requests(&host, Duration::from_secs(2)).await?;
    let states = record_claim_states(&fx).await?;

    let names: Vec<String> = (0..CLAIMS).map(|i| format!("economy-{i:02}")).collect();
    try_join_all(
        names
            .iter()
            .map(|name| fx.claim(name, &class, "1Gi", json!({}))),
    )
    .await?;
    let mut volumes = Vec::new();
    for name in &names {
        volumes.push(fx.wait_bound(name).await?.name_any());
    }
    let provisioned = settled_requests(&host, Duration::from_secs(2)).await?;
    let provisioning = provisioned.since(&before);
    let per_volume = |n: f64| n / CLAIMS as f64;
    assert_eq!(
        (
            per_volume(provisioning.writes()),
            provisioning.reads(),
            provisioning.conflicts()
        ),
        (5.0, 0.0, 0.0),
        "provisioning: writes per volume, reads, 409s; by kind: {:?}",
        provisioning.by_kind()
    );

    // Every state the watch showed: once our finalizer was on, it stayed on until the
    // claim was Bound, and it was gone after.
    for (claim, seen) in states.lock().unwrap().iter() {
        let added = seen.iter().position(|(finalizer, _)| *finalizer);
        let added =
            added.unwrap_or_else(|| panic!("{claim}: our finalizer was never seen: {seen:?}"));
        let removed_early = seen[added..]
            .iter()
            .any(|(finalizer, phase)| !finalizer && phase != "Bound");
        assert!(
            !removed_early,
            "{claim}: the finalizer went before the claim was Bound (finalizer, phase): {seen:?}"
        );
        assert_eq!(
            seen.last()
                .map(|(finalizer, phase)| (*finalizer, phase.as_str())),
            Some((false, "Bound")),
            "{claim}: (finalizer, phase) at the end: {seen:?}"
        );
    }

    let claims = fx.claims();
    let delete = DeleteParams::default();
    try_join_all(names.iter().map(|name| claims.delete(name, &delete))).await?;
    for volume in &volumes {
        fx.wait_volume_gone(volume).await?;
    }
    let deletion = settled_requests(&host, Duration::from_secs(2))
        .await?
        .since(&provisioned);
    assert_eq!(
        (
            per_volume(deletion.writes()),
            deletion.reads(),
            deletion.conflicts()
        ),
        (2.0, 0.0, 0.0),
        "deletion: writes per volume, reads, 409s; by kind: {:?}",
        deletion.by_kind()
    );
    for volume in &volumes {
        assert!(
            !fx.module_data("hostpath").join(volume).exists(),
            "the backend volume {volume} was deleted"
        );
    }
    fx.cleanup().await;
    Ok(())
}

/// Each claim's states as the watch shows them, in order: (our finalizer on, phase).
type ClaimStates = Arc<Mutex<BTreeMap<String, Vec<(bool, String)>>>>;

/// Watches the fixture's claims from now on (listed first, so no state is missed).
async fn record_claim_states(fx: &Fixture) -> anyhow::Result<ClaimStates> {
    let states = ClaimStates::default();
    let recorded = states.clone();
    let (listed, ready) = tokio::sync::oneshot::channel();
    let mut listed = Some(listed);
    let mut stream = watcher(fx.claims(), watcher::Config::default()).boxed();
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let claim: PersistentVolumeClaim = match event {
                Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => claim,
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let finalizer = claim.finalizers().iter().any(|f| f == FINALIZER_CLAIM);
            let phase = claim
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let mut states = recorded.lock().unwrap();
            let seen = states.entry(claim.name_any()).or_default();
            if seen.last() != Some(&(finalizer, phase.clone())) {
                seen.push((finalizer, phase));
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), ready).await??;
    Ok(states)
}

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";

#[tokio::test]
async fn a_claim_waiting_for_its_node_costs_no_request() -> anyhow::Result<()> {
    let mut fx = Fixture::new("economy-wffc").await?;
    fx.install_module("test-echo", "echo");
    fx.node("economy-wffc-node").await.ok();
    let class = fx
        .class(
            "echo",
            &[],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    // Resynced every second: each resync is a reconcile of the waiting claim.
    let host = fx.host(&["--resync-period=1s"]);
    // Already announced to this provisioner, as a claim is once it was scheduled and
    // sent back to the scheduler (the binder keeps the annotation): the host's claim,
    // waiting for a node.
    fx.claim(
        "waiting",
        &class,
        "1Gi",
        json!({ "metadata": { "annotations": {
            "volume.kubernetes.io/storage-provisioner": fx.provisioner } } }),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = host_requests(&host)?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let spent = host_requests(&host)?.since(&before);
    assert_eq!(
        spent.total(),
        0.0,
        "a claim waiting for its node made requests: {:?}",
        spent.by_kind()
    );

    // It was the host's all along: once a node is selected it is provisioned.
    fx.claims()
        .patch(
            "waiting",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                "volume.kubernetes.io/selected-node": "economy-wffc-node" } } })),
        )
        .await?;
    fx.wait_bound("waiting").await?;
    fx.cleanup().await;
    Ok(())
}
