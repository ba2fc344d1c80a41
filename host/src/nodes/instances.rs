//! The leader's directory of instances: the DaemonSet's pods in the host's namespace
//! (`--instance-selector`), watched, so each node's instance is found by its pod's node
//! and IP, never by guessing an address.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// One node's instance as the leader reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub pod: String,
    pub uid: String,
    pub address: SocketAddr,
}

/// The instances' pods.
#[derive(Clone)]
pub struct Instances {
    pods: Store<Pod>,
    selector: String,
    port: u16,
}

impl Instances {
    /// Watches the pods matching `selector` in `namespace` until `stop`.
    pub fn watch(
        client: Client,
        namespace: &str,
        selector: &str,
        port: u16,
        stop: CancellationToken,
    ) -> Self {
        let (pods, writer) = reflector::store();
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let stream = watcher(api, watcher::Config::default().labels(selector))
            .default_backoff()
            .modify(|pod| pod.managed_fields_mut().clear())
            .reflect(writer)
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    item = stream.next() => match item {
                        Some(Err(error)) => warn!(%error, "watch of the instances' pods failed; retrying with back-off (check the host's RBAC: get, list, watch pods in its namespace)"),
                        Some(Ok(_)) => {}
                        None => break,
                    },
                }
            }
        });
        Self {
            pods,
            selector: selector.to_string(),
            port,
        }
    }

    /// The label selector the instances' pods match.
    pub fn selector(&self) -> &str {
        &self.selector
    }

    /// Waits for the first full list.
    pub async fn ready(&self) {
        let _ = self.pods.wait_until_ready().await;
    }

    /// The pod named `name`, if it is one of the instances.
    pub fn pod(&self, name: &str) -> Option<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .find(|pod| pod.name_any() == name)
    }

    /// The nodes the instances' live pods are on.
    pub fn nodes(&self) -> Vec<String> {
        self.pods
            .state()
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
            .collect()
    }

    /// The controller (the DaemonSet) of the pod on `node` at `ip`: the owner of what
    /// the leader publishes, so it goes away with the install.
    pub fn owner_of(&self, node: &str, ip: IpAddr) -> Option<OwnerReference> {
        let pod = self.pods.state().into_iter().find(|pod| {
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && pod.status.as_ref().and_then(|s| s.pod_ip.as_deref())
                    == Some(ip.to_string().as_str())
        })?;
        controller_of(&pod)
    }

    /// The controller (the DaemonSet) of the instances' pods: a controller that serves
    /// no node (`--node-local-role=controller`) owns what it publishes through them.
    pub fn owner_of_any(&self) -> Option<OwnerReference> {
        let mut pods = self.pods.state();
        pods.sort_by_key(|pod| pod.name_any());
        pods.iter().find_map(|pod| controller_of(pod))
    }

    /// The instance on `node`: its live pod with an IP there (the newest, during a
    /// rollout).
    pub fn of_node(&self, node: &str) -> Option<Instance> {
        self.pods
            .state()
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter_map(|pod| {
                let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
                let created = pod.metadata.creation_timestamp.clone();
                Some((created, pod, ip))
            })
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, pod, ip)| Instance {
                pod: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
                address: SocketAddr::new(ip, self.port),
            })
    }
}

/// A pod's controller as an owner reference of another object (not its controller).
fn controller_of(pod: &Pod) -> Option<OwnerReference> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|owner| owner.controller == Some(true))?
        .clone();
    Some(OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..owner
    })
}
