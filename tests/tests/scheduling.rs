//! The real WaitForFirstConsumer flow: kube-scheduler (part of the test control plane)
//! places pods that use claims of a WaitForFirstConsumer class on Ready nodes and sets
//! each claim's selected node; the host provisions each volume for that node; the binder
//! binds the claims and the scheduler binds the pods. The test never sets a selected
//! node itself. (Pods never run: there is no kubelet.)

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{WAIT, scenario};
use wasm_provisioner_tests::nodes::{affinity_node, app_pod};

const NODES: usize = 3;
const PODS: usize = 6;

/// Creates the namespace's default ServiceAccount, which pod admission wants (no
/// controller makes it here).
async fn default_service_account(
    fx: &wasm_provisioner_tests::fixture::Fixture,
) -> anyhow::Result<()> {
    let default = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace)
        .create(&PostParams::default(), &default)
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_scheduler_selects_the_node_and_the_volume_is_made_for_it() {
    scenario("scheduling", async |fx| {
        let prefix = format!("sched-{}", fx.ctx.namespace);
        let nodes: Vec<String> = (0..NODES).map(|i| format!("{prefix}-{i}")).collect();
        for node in &nodes {
            fx.schedulable_node(node).await?;
        }
        let result = async {
            default_service_account(fx).await?;
            fx.install_module("hostpath", "hostpath");
            let host = fx.host(&[]);
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for i in 0..PODS {
                let claim = format!("data-{i}");
                fx.claim(&claim, &class, "1Mi", json!({})).await?;
                pods.create(&PostParams::default(), &app_pod(fx, &format!("app-{i}"), &claim, None)?)
                    .await?;
            }

            for i in 0..PODS {
                let (claim, pod_name) = (format!("data-{i}"), format!("app-{i}"));
                let pv = fx
                    .wait_bound(&claim)
                    .await
                    .with_context(|| host.log_tail())?;
                let bound = wait_for(&format!("pod {pod_name} to be bound to a node"), WAIT, || async {
                    let pod = pods.get(&pod_name).await?;
                    Ok(pod.spec.and_then(|s| s.node_name))
                })
                .await?;
                let claim_object = fx.claims().get(&claim).await?;
                let selected = claim_object
                    .annotations()
                    .get("volume.kubernetes.io/selected-node")
                    .cloned();
                ensure!(
                    selected.as_deref() == Some(bound.as_str()),
                    "claim {claim}: the scheduler selected {selected:?} but bound its pod to {bound}"
                );
                ensure!(
                    nodes.contains(&bound),
                    "pod {pod_name} was bound to {bound}, not a test node"
                );
                ensure!(
                    affinity_node(&pv).as_deref() == Some(bound.as_str()),
                    "claim {claim}: its PV {} is pinned to {:?}, its pod runs on {bound}",
                    pv.name_any(),
                    affinity_node(&pv)
                );
            }
            for i in 0..PODS {
                pods.delete(&format!("app-{i}"), &DeleteParams::default().grace_period(0))
                    .await?;
            }
            anyhow::Ok(())
        }
        .await;
        fx.delete_nodes(&prefix, NODES).await;
        result
    })
    .await;
}

/// What node-local mode's capacity publishing relies on, checked on the real scheduler:
/// for a provisioner name that has a CSIDriver object with `storageCapacity: true`, the
/// volume-binding plugin places a pod with a WaitForFirstConsumer claim only on a node
/// whose `CSIStorageCapacity` for the claim's class has room for it.
#[tokio::test]
async fn the_scheduler_places_a_claim_only_where_capacity_is_published() {
    scenario("capacity-scheduling", async |fx| {
        let prefix = format!("cap-{}", fx.ctx.namespace);
        let nodes: Vec<String> = (0..NODES).map(|i| format!("{prefix}-{i}")).collect();
        for node in &nodes {
            fx.schedulable_node(node).await?;
        }
        let drivers: Api<CSIDriver> = Api::all(fx.ctx.client.clone());
        let result = async {
            default_service_account(fx).await?;
            let driver: CSIDriver = serde_json::from_value(json!({
                "metadata": { "name": fx.provisioner },
                "spec": { "storageCapacity": true, "attachRequired": false },
            }))?;
            drivers.create(&PostParams::default(), &driver).await?;
            fx.install_module("hostpath", "hostpath");
            let host = fx.host(&[]);
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            // Too little on the first two nodes, room on the last.
            let capacities: Api<CSIStorageCapacity> =
                Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for (i, node) in nodes.iter().enumerate() {
                let room = if i + 1 == NODES { "10Gi" } else { "1Mi" };
                let capacity: CSIStorageCapacity = serde_json::from_value(json!({
                    "metadata": { "name": format!("capacity-{i}") },
                    "storageClassName": class,
                    "nodeTopology": { "matchLabels": { "kubernetes.io/hostname": node } },
                    "capacity": room,
                }))?;
                capacities.create(&PostParams::default(), &capacity).await?;
            }
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for i in 0..PODS {
                let claim = format!("big-{i}");
                fx.claim(&claim, &class, "1Gi", json!({})).await?;
                pods.create(
                    &PostParams::default(),
                    &app_pod(fx, &format!("app-{i}"), &claim, None)?,
                )
                .await?;
            }
            for i in 0..PODS {
                let pod_name = format!("app-{i}");
                fx.wait_bound(&format!("big-{i}"))
                    .await
                    .with_context(|| host.log_tail())?;
                let bound = wait_for(&format!("pod {pod_name} to be bound"), WAIT, || async {
                    Ok(pods.get(&pod_name).await?.spec.and_then(|s| s.node_name))
                })
                .await?;
                ensure!(
                    bound == nodes[NODES - 1],
                    "pod {pod_name} went to {bound}, whose published capacity is too small"
                );
            }
            anyhow::Ok(())
        }
        .await;
        let _ = drivers
            .delete(&fx.provisioner, &DeleteParams::default())
            .await;
        fx.delete_nodes(&prefix, NODES).await;
        result
    })
    .await;
}

/// A host that knows its node (`--node-name`, as the manifests set it) in Deployment
/// mode: hostpath makes the volume of a pod scheduled onto that node, and refuses,
/// saying why, the volume of a pod scheduled onto another node, whose directory it would
/// make on the wrong machine.
#[tokio::test]
async fn hostpath_refuses_a_volume_for_another_node_than_its_own() {
    scenario("other-node", async |fx| {
        let prefix = format!("other-{}", fx.ctx.namespace);
        let nodes: Vec<String> = (0..2).map(|i| format!("{prefix}-{i}")).collect();
        for node in &nodes {
            fx.schedulable_node(node).await?;
        }
        let result = async {
            default_service_account(fx).await?;
            fx.install_module("hostpath", "hostpath");
            let host = fx.host(&[&format!("--node-name={}", nodes[0])]);
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for (i, node) in nodes.iter().enumerate() {
                let claim = format!("data-{i}");
                fx.claim(&claim, &class, "1Mi", json!({})).await?;
                let mut pod = app_pod(fx, &format!("app-{i}"), &claim, None)?;
                if let Some(selector) = pod.spec.as_mut().and_then(|s| s.node_selector.as_mut()) {
                    selector.insert("kubernetes.io/hostname".into(), node.clone());
                }
                pods.create(&PostParams::default(), &pod).await?;
            }
            // Its own node: made and bound.
            fx.wait_bound("data-0")
                .await
                .with_context(|| host.log_tail())?;
            // Another node: refused, with the reason, and never bound.
            let note = fx
                .wait_claim_event("data-1", "ProvisioningFailed")
                .await
                .with_context(|| host.log_tail())?;
            ensure!(
                note.contains(&format!("for node {}", nodes[1]))
                    && note.contains(&format!("runs on node {}", nodes[0])),
                "the refusal does not say why: {note}"
            );
            let claim = fx.claims().get("data-1").await?;
            let phase = claim.status.and_then(|s| s.phase).unwrap_or_default();
            ensure!(phase == "Pending", "claim data-1 is {phase}");
            let leftover = fx.module_data("hostpath");
            let made: Vec<String> = std::fs::read_dir(&leftover)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            ensure!(made.len() == 1, "directories made: {made:?}");
            anyhow::Ok(())
        }
        .await;
        fx.delete_nodes(&prefix, 2).await;
        result
    })
    .await;
}
