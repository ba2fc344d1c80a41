//! The host's API bill, counted by its own client
//! (`wasm_provisioner_kube_api_requests_total`) on the real control plane (issue 11.2):
//! a provisioned volume costs 5 writes (the claim finalizer added, the Provisioning
//! Event, the PV create, the ProvisioningSucceeded Event, the claim finalizer removed),
//! no read and no 409; its deletion 2 writes (the PV delete, the PV finalizer removed),
//! no read and no 409; a WaitForFirstConsumer claim waiting for its node costs nothing.

use std::time::Duration;

use futures::future::try_join_all;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
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
