//! Node-local mode: the volumes of a Node that was deleted. Their data is on that
//! node's disk, which only that node's instance may touch, so no other node ever
//! deletes them: a PV whose recorded node (`wasm-provisioner.dev/node`) is gone gets
//! one Warning Event (`NodeGone`), and then `--node-gone-policy` decides:
//! - `keep` (the default): the PV stays for the admin (a Released one keeps failing
//!   its delete with back-off, naming the node);
//! - `remove`: once the node has been gone for `--node-gone-grace` (counted by this
//!   leader from when it first saw it gone), the PV object is removed — our finalizer
//!   lifted, the PV deleted — and a Warning Event (`VolumeAbandoned`) and
//!   `wasm_provisioner_volumes_abandoned_total` record that its backend was not cleaned.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use wasm_provisioner_rules::names;

use super::{Context, finalizers, recorded_node};

/// How often the leader looks for volumes of gone nodes.
const CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// `--node-gone-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Policy {
    #[default]
    Keep,
    Remove,
}

/// Until `stop`: in node-local mode, applies the policy to the PVs of gone nodes.
pub(super) async fn run(ctx: &Arc<Context>, stop: &CancellationToken) {
    if !ctx.backends.node_local_mode() {
        return;
    }
    tokio::select! {
        _ = ctx.caches_synced() => {}
        _ = stop.cancelled() => return,
    }
    // When each PV was first seen on a gone node (by UID).
    let mut seen: HashMap<String, Instant> = HashMap::new();
    while !stop.is_cancelled() {
        let gone = volumes_of_gone_nodes(ctx);
        let uids: HashSet<String> = gone.iter().filter_map(|pv| pv.uid()).collect();
        seen.retain(|uid, _| uids.contains(uid));
        for pv in gone {
            let (Some(uid), Some(node)) = (pv.uid(), recorded_node(&pv)) else {
                continue;
            };
            let since = match seen.get(&uid) {
                Some(since) => *since,
                None => {
                    tell(ctx, &pv, node).await;
                    *seen.entry(uid).or_insert_with(Instant::now)
                }
            };
            if ctx.settings.node_gone_policy == Policy::Remove
                && since.elapsed() >= ctx.settings.node_gone_grace
            {
                remove(ctx, &pv, node).await;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
    }
}

/// Our PVs whose recorded node no longer exists.
fn volumes_of_gone_nodes(ctx: &Context) -> Vec<Arc<PersistentVolume>> {
    let nodes: HashSet<String> = ctx.nodes.state().iter().map(|n| n.name_any()).collect();
    ctx.volumes
        .state()
        .into_iter()
        .filter(|pv| {
            pv.annotations().get(names::ANN_PROVISIONED_BY) == Some(&ctx.settings.provisioner_name)
        })
        .filter(|pv| recorded_node(pv).is_some_and(|node| !nodes.contains(node)))
        .collect()
}

async fn tell(ctx: &Context, pv: &PersistentVolume, node: &str) {
    let grace = humantime::format_duration(ctx.settings.node_gone_grace);
    let next = match ctx.settings.node_gone_policy {
        Policy::Keep => format!(
            "policy keep (--node-gone-policy): the PV stays for an admin; clean the node's disk if it returns, then delete the PV (lifting finalizer {} if it stays Terminating)",
            names::FINALIZER_PV_PROTECTION
        ),
        Policy::Remove => format!(
            "policy remove (--node-gone-policy): the PV object is removed after {grace} without cleaning the backend volume"
        ),
    };
    let note = format!(
        "node {node}, whose disk holds this volume, was deleted; no other node's instance will delete it: {next}"
    );
    warn!(volume = %pv.name_any(), %node, "{note}");
    ctx.events
        .volume_warning(pv, names::REASON_NODE_GONE, note)
        .await;
}

/// Removes the PV object of a gone node, recording that its backend was not cleaned.
async fn remove(ctx: &Context, pv: &PersistentVolume, node: &str) {
    let name = pv.name_any();
    let note = format!(
        "node {node} has been gone for {}: removing PV {name} without deleting its backend volume, which could not be cleaned (policy remove)",
        humantime::format_duration(ctx.settings.node_gone_grace)
    );
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let lifted = ctx
        .leadership
        .fenced(
            "PV finalizer removal (node gone)",
            finalizers::set(&api, pv, names::FINALIZER_PV_PROTECTION, false, None),
        )
        .await;
    let deleted = match lifted {
        Ok(Ok(_)) => {
            ctx.leadership
                .fenced(
                    "PV delete (node gone)",
                    api.delete(&name, &DeleteParams::default()),
                )
                .await
        }
        Ok(Err(error)) => {
            warn!(volume = %name, %error, "cannot lift our finalizer from the PV of a gone node; retrying");
            return;
        }
        Err(_) => return,
    };
    let deleted = match deleted {
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(Ok(())),
        Ok(result) => Ok(result.map(|_| ())),
        Err(fenced) => Err(fenced),
    };
    match deleted {
        Ok(Ok(())) => {
            warn!(volume = %name, %node, "{note}");
            ctx.metrics
                .volumes_abandoned
                .with_label_values(&["node_gone"])
                .inc();
            ctx.events
                .volume_warning(pv, names::REASON_VOLUME_ABANDONED, note)
                .await;
        }
        Ok(Err(error)) => {
            warn!(volume = %name, %error, "cannot delete the PV of a gone node; retrying")
        }
        Err(_) => {}
    }
}
