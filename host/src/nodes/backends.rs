//! Where a guest call runs. In Deployment mode, always in this process. In node-local
//! mode, the call's node (the claim's selected node, the node recorded on the PV)
//! decides: this process's own node in process, any other node through that node's
//! instance ([`super::client::Remote`]). The request is the same either way.

use std::future::Future;

use k8s_openapi::api::core::v1::PersistentVolume;
use serde::de::DeserializeOwned;
use wasm_provisioner_rules::types::{
    BackendCapacity, CallContext, CapacityRequest, DeleteError, DeleteRequest, ExpandError,
    ExpandRequest, ProvisionError, ProvisionRequest, Volume,
};
use wasm_provisioner_runtime::{CallError, LoadedModule, check_publishable};

use super::client::Remote;
use super::wire::Request;

/// Where each call runs.
pub struct Backends {
    /// This host's node: the node of a call that names none.
    own_node: Option<String>,
    /// Node-local mode: whether this process serves its own node's calls itself (a
    /// controller does not: they go to the instance on its node).
    serves_own_node: bool,
    /// Node-local mode: how the leader reaches the other nodes.
    remote: Option<Remote>,
    /// Node-local mode: where the leader publishes each (class, node)'s capacity.
    publishing: Option<Publishing>,
}

/// Node-local mode: where CSIStorageCapacity objects go, and with which client.
pub struct Publishing {
    /// Its own low request budget: capacity updates never compete with provisioning.
    pub client: kube::Client,
    /// The host's namespace.
    pub namespace: String,
    /// This pod's IP (to find its DaemonSet, the objects' owner).
    pub pod_ip: std::net::IpAddr,
}

impl Backends {
    /// Deployment mode: every call here, with this host's node as the calls' node.
    pub fn deployment(own_node: Option<String>) -> Self {
        Self {
            own_node,
            serves_own_node: true,
            remote: None,
            publishing: None,
        }
    }

    /// Node-local mode: calls for `own_node` here, others through `remote`. A
    /// controller (`serves_own_node` false) runs no call for a node: each goes to that
    /// node's instance, its own node's too; only a call for no node at all (a
    /// controller told no `--node-name`) runs in its process.
    pub fn node_local(
        own_node: Option<String>,
        serves_own_node: bool,
        remote: Remote,
        publishing: Publishing,
    ) -> Self {
        Self {
            own_node,
            serves_own_node,
            remote: Some(remote),
            publishing: Some(publishing),
        }
    }

    /// Node-local mode: where capacity is published.
    pub fn publishing(&self) -> Option<&Publishing> {
        self.publishing.as_ref()
    }

    /// Node-local mode: the owner of what the leader publishes (its DaemonSet).
    pub fn owner(&self) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        let (remote, publishing) = (self.remote.as_ref()?, self.publishing.as_ref()?);
        match self.own_node.as_deref().filter(|_| self.serves_own_node) {
            Some(node) => remote.instances().owner_of(node, publishing.pod_ip),
            None => remote.instances().owner_of_any(),
        }
    }

    /// Node-local mode: the nodes an instance serves (this one, unless it is a
    /// controller, and those the instances' pods are on); none in Deployment mode.
    pub fn nodes(&self) -> Vec<String> {
        let Some(remote) = &self.remote else {
            return Vec::new();
        };
        let mut nodes = remote.instances().nodes();
        nodes.extend(self.own_node.clone().filter(|_| self.serves_own_node));
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Whether calls go to the node they are for (node-local mode); the host then
    /// records that node on each PV it makes.
    pub fn node_local_mode(&self) -> bool {
        self.remote.is_some()
    }

    /// The context of a call for `node`: in node-local mode that node (this one when
    /// none is given); in Deployment mode always this host's node.
    pub fn context(&self, node: Option<&str>) -> CallContext {
        let node = match (self.node_local_mode(), node) {
            (true, Some(node)) => Some(node.to_string()),
            _ => self.own_node.clone(),
        };
        CallContext { node }
    }

    /// The remote end of a call for `context`'s node, unless it runs here.
    fn remote_for(&self, context: &CallContext) -> Option<(&Remote, String)> {
        let remote = self.remote.as_ref()?;
        let node = context.node.as_deref()?;
        let here = self.serves_own_node && Some(node) == self.own_node.as_deref();
        (!here).then(|| (remote, node.to_string()))
    }

    async fn route<T: DeserializeOwned>(
        &self,
        module: &LoadedModule,
        request: Request,
        local: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        match self.remote_for(request.context()) {
            Some((remote, node)) => remote.call(module, &node, request).await,
            None => local.await,
        }
    }

    pub async fn should_provision(
        &self,
        module: &LoadedModule,
        request: &ProvisionRequest,
    ) -> Result<bool, CallError> {
        let remote = Request::ShouldProvision(request.clone());
        self.route(module, remote, module.should_provision(request))
            .await
    }

    pub async fn provision(
        &self,
        module: &LoadedModule,
        request: &ProvisionRequest,
    ) -> Result<Result<Volume, ProvisionError>, CallError> {
        let remote = Request::Provision(request.clone());
        self.route(module, remote, module.provision(request)).await
    }

    pub async fn should_delete(
        &self,
        module: &LoadedModule,
        request: &DeleteRequest,
    ) -> Result<bool, CallError> {
        let remote = Request::ShouldDelete(request.clone());
        self.route(module, remote, module.should_delete(request))
            .await
    }

    pub async fn delete(
        &self,
        module: &LoadedModule,
        request: &DeleteRequest,
    ) -> Result<Result<(), DeleteError>, CallError> {
        let remote = Request::Delete(request.clone());
        self.route(module, remote, module.delete(request)).await
    }

    pub async fn expand(
        &self,
        module: &LoadedModule,
        request: &ExpandRequest,
    ) -> Result<Result<u64, ExpandError>, CallError> {
        let remote = Request::Expand(request.clone());
        self.route(module, remote, module.expand(request)).await
    }

    pub async fn get_capacity(
        &self,
        module: &LoadedModule,
        request: &CapacityRequest,
    ) -> Result<Result<BackendCapacity, String>, CallError> {
        let remote = Request::GetCapacity(request.clone());
        self.route(module, remote, module.get_capacity(request))
            .await
    }

    /// The publish check of `pv` ([`check_publishable`]) on its node: there the grants
    /// and the directory are that node's. `Err` says why it may not be published.
    pub async fn check_publishable(
        &self,
        module: &LoadedModule,
        context: &CallContext,
        volume_name: &str,
        pv: &PersistentVolume,
        module_mount_options: &[String],
    ) -> Result<(), String> {
        let local = async {
            Ok(
                check_publishable(module, volume_name, pv, module_mount_options)
                    .await
                    .map_err(|refused| refused.to_string()),
            )
        };
        let remote = Request::CheckPublishable {
            context: context.clone(),
            volume_name: volume_name.to_string(),
            pv: Box::new(pv.clone()),
            module_mount_options: module_mount_options.to_vec(),
        };
        match self.route(module, remote, local).await {
            Ok(answer) => answer,
            Err(error) => Err(format!("its node could not check it: {error}")),
        }
    }
}

/// Runs `request` with `module` in this process: what an instance does with a call
/// from the leader. The answer is the JSON of what [`Backends`] would have returned.
pub async fn execute(module: &LoadedModule, request: Request) -> serde_json::Value {
    fn json<T: serde::Serialize>(answer: T) -> serde_json::Value {
        serde_json::to_value(answer).unwrap_or_else(|error| {
            serde_json::Value::String(format!("the answer could not be encoded: {error}"))
        })
    }
    match request {
        Request::ShouldProvision(r) => json(module.should_provision(&r).await),
        Request::Provision(r) => json(module.provision(&r).await),
        Request::ShouldDelete(r) => json(module.should_delete(&r).await),
        Request::Delete(r) => json(module.delete(&r).await),
        Request::Expand(r) => json(module.expand(&r).await),
        Request::GetCapacity(r) => json(module.get_capacity(&r).await),
        Request::CheckPublishable {
            volume_name,
            pv,
            module_mount_options,
            ..
        } => {
            let checked = check_publishable(module, &volume_name, &pv, &module_mount_options)
                .await
                .map_err(|refused| refused.to_string());
            json(Ok::<_, CallError>(checked))
        }
    }
}
