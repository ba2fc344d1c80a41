//! Node-local mode: the capacity the scheduler sees. Every `--capacity-poll-interval`
//! the leader keeps one `CSIStorageCapacity` per (class of ours, node with an
//! instance) in its namespace, with its own low request budget ([`QPS`], [`BURST`]):
//! - a module with `report-capacity` is asked `get-capacity` on that node (by that
//!   node's instance): `capacity` is its available bytes, `maximumVolumeSize` its
//!   largest volume if it gives one;
//! - a module without it gets `maximumVolumeSize` [`UNBOUNDED`]: the scheduler (for a
//!   provisioner whose CSIDriver says `storageCapacity: true`) places a pod only where
//!   an object allows the claim's size, so a class that cannot tell must not be held back;
//! - a poll that fails (the node's instance down, the module's error) removes that
//!   object, so the scheduler sends no new pod to a node that cannot serve it.
//!
//! Objects are written only when they change; those of classes or nodes gone are
//! deleted; each carries the leader's DaemonSet as owner, so it goes with the install.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use wasm_provisioner_rules::quantity;
use wasm_provisioner_rules::request::class_of;
use wasm_provisioner_rules::types::{Capability, CapacityRequest, Node};
use wasm_provisioner_runtime::LoadedModule;

use super::Context;

/// The capacity writes' own request budget.
pub const QPS: u32 = 5;
pub const BURST: u32 = 10;

/// The `maximumVolumeSize` of a class whose module does not report capacity.
pub const UNBOUNDED: &str = "4Ei";

/// The label that marks this provisioner's objects (a hash of its name: a label value
/// has at most 63 characters).
const LABEL: &str = "wasm-provisioner.dev/capacity-of";

/// The node label a CSIStorageCapacity's topology selects.
const HOSTNAME: &str = "kubernetes.io/hostname";

/// How many `get-capacity` calls run at once.
const CONCURRENT_POLLS: usize = 16;

fn digest(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hex::encode(hash.finalize())
}

/// Until `stop`, in node-local mode: keeps the objects current.
pub(super) async fn run(ctx: &Arc<Context>, stop: &CancellationToken) {
    let Some(publishing) = ctx.backends.publishing() else {
        return;
    };
    tokio::select! {
        _ = ctx.caches_synced() => {}
        _ = stop.cancelled() => return,
    }
    let api: Api<CSIStorageCapacity> =
        Api::namespaced(publishing.client.clone(), &publishing.namespace);
    let mark = digest(&[&ctx.settings.provisioner_name])[..16].to_string();
    while !stop.is_cancelled() {
        tokio::select! {
            _ = publish(ctx, &api, &mark) => {}
            _ = stop.cancelled() => return,
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(ctx.settings.capacity_poll_interval) => {}
        }
    }
}

/// One round: poll every (class, node), then write what changed.
async fn publish(ctx: &Context, api: &Api<CSIStorageCapacity>, mark: &str) {
    let existing = match api
        .list(&ListParams::default().labels(&format!("{LABEL}={mark}")))
        .await
    {
        Ok(list) => list
            .items
            .into_iter()
            .map(|object| (object.name_any(), object))
            .collect::<BTreeMap<_, _>>(),
        Err(error) => {
            warn!(%error, "cannot list the CSIStorageCapacity objects (check the host's RBAC: csistoragecapacities in its namespace); retrying next poll");
            return;
        }
    };
    let owner = ctx.backends.owner();
    let pairs: Vec<(Arc<StorageClass>, Arc<LoadedModule>, String)> = ctx
        .classes
        .state()
        .into_iter()
        .filter_map(|class| Some((ctx.class_checks.module_of(&class)?, class)))
        .flat_map(|(module, class)| {
            ctx.backends
                .nodes()
                .into_iter()
                .map(move |node| (class.clone(), module.clone(), node))
        })
        .collect();
    let wanted: BTreeMap<String, CSIStorageCapacity> = futures::stream::iter(pairs)
        .map(|(class, module, node)| async move {
            let answer = capacity(ctx, &class, &module, &node).await;
            (class, module, node, answer)
        })
        .buffer_unordered(CONCURRENT_POLLS)
        .filter_map(|(class, module, node, answer)| {
            let owner = owner.clone();
            async move {
                let (capacity, maximum) = match answer {
                    Ok(limits) => limits,
                    Err(error) => {
                        warn!(class = %class.name_any(), module = module.name(), %node, "capacity poll failed; the node's CSIStorageCapacity is withdrawn until it answers: {error}");
                        ctx.metrics
                            .capacity_poll_failures
                            .with_label_values(&[class.name_any().as_str(), module.name()])
                            .inc();
                        return None;
                    }
                };
                let object = object(ctx, mark, &class.name_any(), &node, capacity, maximum, owner);
                Some((object.name_any(), object))
            }
        })
        .collect()
        .await;
    for (name, object) in &wanted {
        let write = match existing.get(name) {
            Some(have) if same(have, object) => continue,
            Some(have) => {
                let mut object = object.clone();
                object.metadata.resource_version = have.resource_version();
                let api = api.clone();
                ctx.leadership
                    .fenced("CSIStorageCapacity update", async move {
                        api.replace(name, &PostParams::default(), &object)
                            .await
                            .map(|_| ())
                    })
                    .await
            }
            None => {
                ctx.leadership
                    .fenced("CSIStorageCapacity create", async {
                        api.create(&PostParams::default(), object).await.map(|_| ())
                    })
                    .await
            }
        };
        match write {
            Ok(Ok(())) => debug!(%name, "CSIStorageCapacity written"),
            Ok(Err(error)) => {
                warn!(%name, %error, "cannot write a CSIStorageCapacity; retrying next poll")
            }
            Err(_) => return,
        }
    }
    for name in existing.keys().filter(|name| !wanted.contains_key(*name)) {
        let deleted = ctx
            .leadership
            .fenced(
                "CSIStorageCapacity delete",
                api.delete(name, &DeleteParams::default()),
            )
            .await;
        match deleted {
            Ok(Ok(_)) => debug!(%name, "CSIStorageCapacity withdrawn"),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
            Ok(Err(error)) => {
                warn!(%name, %error, "cannot delete a CSIStorageCapacity; retrying next poll")
            }
            Err(_) => return,
        }
    }
}

/// `(capacity, maximumVolumeSize)` of `class` on `node`.
async fn capacity(
    ctx: &Context,
    class: &StorageClass,
    module: &LoadedModule,
    node: &str,
) -> Result<(Option<Quantity>, Option<Quantity>), String> {
    if !module.has(Capability::ReportCapacity) {
        return Ok((None, Some(Quantity(UNBOUNDED.into()))));
    }
    let labels = ctx
        .node(node)
        .map(|meta| {
            meta.labels()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let request = CapacityRequest {
        class: class_of(class).map_err(|error| error.to_string())?,
        node: Some(Node {
            name: node.to_string(),
            labels,
        }),
        context: ctx.backends.context(Some(node)),
    };
    match ctx.backends.get_capacity(module, &request).await {
        Ok(Ok(capacity)) => Ok((
            Some(Quantity(capacity.available_bytes.to_string())),
            capacity
                .maximum_volume_bytes
                .map(|max| Quantity(max.to_string())),
        )),
        Ok(Err(message)) => Err(format!("the module answered: {message}")),
        Err(error) => Err(error.to_string()),
    }
}

/// The object for `class` on `node`.
fn object(
    ctx: &Context,
    mark: &str,
    class: &str,
    node: &str,
    capacity: Option<Quantity>,
    maximum: Option<Quantity>,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> CSIStorageCapacity {
    let hostname = ctx
        .node(node)
        .and_then(|meta| meta.labels().get(HOSTNAME).cloned())
        .unwrap_or_else(|| node.to_string());
    let name = format!(
        "wasm-provisioner-{}",
        &digest(&[&ctx.settings.provisioner_name, class, node])[..20]
    );
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(BTreeMap::from([(LABEL.to_string(), mark.to_string())])),
            owner_references: owner.map(|owner| vec![owner]),
            ..Default::default()
        },
        storage_class_name: class.to_string(),
        node_topology: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(HOSTNAME.to_string(), hostname)])),
            ..Default::default()
        }),
        capacity,
        maximum_volume_size: maximum,
    }
}

/// Whether `have` already says what `want` says (quantities by value: the API server
/// stores them in canonical form).
fn same(have: &CSIStorageCapacity, want: &CSIStorageCapacity) -> bool {
    let bytes = |quantity: &Option<Quantity>| {
        quantity
            .as_ref()
            .map(|q| quantity::quantity_bytes(q).map_err(|_| q.0.clone()))
    };
    have.storage_class_name == want.storage_class_name
        && have.node_topology == want.node_topology
        && bytes(&have.capacity) == bytes(&want.capacity)
        && bytes(&have.maximum_volume_size) == bytes(&want.maximum_volume_size)
        && have.metadata.owner_references == want.metadata.owner_references
}
