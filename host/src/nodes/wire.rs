//! What the leader and the instances say to each other: JSON over HTTP/2 over mutual
//! TLS. A call is the request the guest would get in process, with the leader's term.

use k8s_openapi::api::core::v1::PersistentVolume;
use serde::{Deserialize, Serialize};
use wasm_provisioner_rules::types::{
    CallContext, CapacityRequest, DeleteRequest, ExpandRequest, ProvisionRequest,
};
use wasm_provisioner_runtime::Call;

/// The path of guest calls on an instance.
pub const CALLS_PATH: &str = "/v1/calls";
/// The path of enrolment on the leader.
pub const ENROLL_PATH: &str = "/v1/enroll";

/// One guest call for a node, from the leader of `term`.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodeCall {
    pub term: i32,
    pub module: String,
    pub request: Request,
}

/// A guest call's request, or the publish check of a volume the guest answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    ShouldProvision(ProvisionRequest),
    Provision(ProvisionRequest),
    ShouldDelete(DeleteRequest),
    Delete(DeleteRequest),
    Expand(ExpandRequest),
    GetCapacity(CapacityRequest),
    /// [`wasm_provisioner_runtime::check_publishable`] on the volume's node.
    CheckPublishable {
        context: CallContext,
        volume_name: String,
        pv: Box<PersistentVolume>,
        module_mount_options: Vec<String>,
    },
}

impl Request {
    /// The node the call is for.
    pub fn context(&self) -> &CallContext {
        match self {
            Request::ShouldProvision(r) | Request::Provision(r) => &r.context,
            Request::ShouldDelete(r) | Request::Delete(r) => &r.context,
            Request::Expand(r) => &r.context,
            Request::GetCapacity(r) => &r.context,
            Request::CheckPublishable { context, .. } => context,
        }
    }

    /// The guest export it calls (the publish check counts as `provision`'s).
    pub fn call(&self) -> Call {
        match self {
            Request::ShouldProvision(_) => Call::ShouldProvision,
            Request::Provision(_) | Request::CheckPublishable { .. } => Call::Provision,
            Request::ShouldDelete(_) => Call::ShouldDelete,
            Request::Delete(_) => Call::Delete,
            Request::Expand(_) => Call::Expand,
            Request::GetCapacity(_) => Call::GetCapacity,
        }
    }
}

/// An instance asks the leader for its node's certificate.
#[derive(Debug, Serialize, Deserialize)]
pub struct Enrollment {
    /// The instance's projected ServiceAccount token (audience `wasm-provisioner`),
    /// bound to its pod.
    pub token: String,
}

/// The leader's answer: the node it found the pod on, and that node's key and
/// certificate for `term`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Enrolled {
    pub node: String,
    pub term: i32,
    pub identity: super::pki::Identity,
}
