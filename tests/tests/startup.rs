//! Starting in a full cluster: no reconcile may decide before the claims,
//! volumes, classes and nodes stores are all filled. With 2000 Nodes the node list
//! arrives well after the claim list; a host that reconciled then would find every
//! selected node "missing" and strip `volume.kubernetes.io/selected-node` from
//! WaitForFirstConsumer claims whose node exists.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use serde_json::json;
use wasm_provisioner_tests::fixture::Fixture;

const NODES: usize = 2000;
const CLAIMS: usize = 20;
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

async fn run(fx: &mut Fixture, prefix: &str) -> anyhow::Result<()> {
    fx.create_nodes(prefix, NODES).await?;

    fx.install_module("test-echo", "echo");
    let class = fx
        .class(
            "echo",
            &[],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    let selected = format!("{prefix}-{}", NODES - 1);
    for i in 0..CLAIMS {
        fx.claim(
            &format!("data-{i}"),
            &class,
            "1Mi",
            json!({ "metadata": { "annotations": {
                SELECTED_NODE: selected,
                "volume.kubernetes.io/storage-provisioner": fx.provisioner,
            } } }),
        )
        .await?;
    }
    let host = fx.host(&[]);
    for i in 0..CLAIMS {
        fx.wait_bound(&format!("data-{i}"))
            .await
            .with_context(|| host.log_text())?;
    }
    let log = host.log_text();
    ensure!(
        !log.contains("does not exist"),
        "a selected node was taken for missing at start:\n{log}"
    );
    for claim in fx.claims().list(&Default::default()).await? {
        ensure!(
            claim.annotations().get(SELECTED_NODE) == Some(&selected),
            "claim {} lost its selected node",
            claim.name_any()
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_full_cluster_start_keeps_every_selected_node() {
    let mut fx = Fixture::new("full-start").await.expect("a fixture");
    let prefix = format!("node-{}", fx.ctx.namespace);
    let result = run(&mut fx, &prefix).await;
    // The nodes are cluster-wide: always removed.
    fx.delete_nodes(&prefix, NODES).await;
    match result {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}
