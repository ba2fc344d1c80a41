//! The guest contract's data types (the `types` interface of `wit/0.2.0/provisioner.wit`,
//! a superset of 0.1.0's) as plain Rust, so the rules can build requests and check answers without wasmtime.
//!
//! Each type has the name, fields and cases the WIT gives it (kebab-case made Rust); the
//! WIT documents each field. Why the types exist twice: docs/design.md, "Crates by
//! layer, and the contract's types twice". The runtime converts these to and from its
//! generated bindings field by field (`host/runtime/src/contract.rs`): a field added to
//! the WIT and not here, or here and not there, fails to compile.

/// A string map (labels, annotations, parameters), in no particular order.
pub type StringMap = Vec<(String, String)>;

/// What a plugin says about itself (`describe`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub supports_block: bool,
    pub data_source_kinds: Vec<String>,
    /// The optional capabilities (0.2): always empty for a 0.1 plugin.
    pub capabilities: Vec<Capability>,
}

/// An optional capability of a 0.2 plugin: one exported interface each.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Capability {
    Expand,
    ReportCapacity,
    ValidateClass,
}

impl Capability {
    /// Every capability, in the contract's order.
    pub const ALL: [Capability; 3] = [
        Capability::Expand,
        Capability::ReportCapacity,
        Capability::ValidateClass,
    ];

    /// The name of the capability in the WIT (and in `describe`'s list).
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Expand => "expand",
            Capability::ReportCapacity => "report-capacity",
            Capability::ValidateClass => "validate-class",
        }
    }

    /// The interface a component exports when it has the capability.
    pub fn interface(self) -> &'static str {
        match self {
            Capability::Expand => "expander",
            Capability::ReportCapacity => "capacity-reporter",
            Capability::ValidateClass => "class-validator",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kubernetes access modes of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod,
}

/// Whether a volume is a filesystem or a raw block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VolumeMode {
    Filesystem,
    Block,
}

/// The object a claim asks to be populated from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataSource {
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

/// One requirement of a claim's label selector.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// A claim's label selector.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LabelSelector {
    pub match_labels: StringMap,
    pub match_expressions: Vec<LabelRequirement>,
}

/// The claim a volume is made for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Claim {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub labels: StringMap,
    pub annotations: StringMap,
    pub access_modes: Vec<AccessMode>,
    pub requested_bytes: u64,
    pub limit_bytes: Option<u64>,
    pub volume_mode: VolumeMode,
    pub data_source: Option<DataSource>,
    pub selector: Option<LabelSelector>,
}

/// What happens to a volume when its claim is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReclaimPolicy {
    Delete,
    Retain,
    Recycle,
}

/// When a class's volumes are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BindingMode {
    Immediate,
    WaitForFirstConsumer,
}

/// One key and its allowed values in a class's allowed topologies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopologyRequirement {
    pub key: String,
    pub values: Vec<String>,
}

/// One term of a class's allowed topologies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopologyTerm {
    pub requirements: Vec<TopologyRequirement>,
}

/// The StorageClass a claim names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Class {
    pub name: String,
    pub parameters: StringMap,
    pub reclaim_policy: ReclaimPolicy,
    pub mount_options: Vec<String>,
    pub allowed_topologies: Vec<TopologyTerm>,
    pub binding_mode: BindingMode,
    pub allow_volume_expansion: bool,
}

/// The node the scheduler selected for a claim's first consumer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    pub name: String,
    pub labels: StringMap,
}

/// A Secret the class names and the module's grant allows, with its data decoded.
/// Its `Debug` shows names and keys, never values.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Secret {
    pub namespace: String,
    pub name: String,
    pub data: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.data.iter().map(|(key, _)| key.as_str()).collect();
        f.debug_struct("Secret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("keys", &keys)
            .finish()
    }
}

/// Where a call runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallContext {
    /// The node this call runs on, when known.
    pub node: Option<String>,
}

/// What `should-provision` and `provision` receive.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProvisionRequest {
    pub volume_name: String,
    pub claim: Claim,
    pub class: Class,
    pub selected_node: Option<Node>,
    pub secret: Option<Secret>,
    pub context: CallContext,
}

/// A directory on the node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostPathSource {
    pub path: String,
    pub path_type: Option<String>,
}

/// A local volume: a directory or device on one node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocalSource {
    pub path: String,
    pub fs_type: Option<String>,
}

/// An NFS export.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NfsSource {
    pub server: String,
    pub path: String,
    pub read_only: bool,
}

/// A volume a CSI driver attaches and mounts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
    pub fs_type: Option<String>,
    pub read_only: bool,
    pub volume_attributes: StringMap,
}

/// An iSCSI LUN.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IscsiSource {
    pub target_portal: String,
    pub iqn: String,
    pub lun: i32,
    pub iscsi_interface: Option<String>,
    pub fs_type: Option<String>,
    pub read_only: bool,
    pub portals: Vec<String>,
}

/// Where a volume's data is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VolumeSource {
    HostPath(HostPathSource),
    Local(LocalSource),
    Nfs(NfsSource),
    Csi(CsiSource),
    Iscsi(IscsiSource),
    /// Any other PV source, as the JSON of a PersistentVolumeSpec fragment.
    Json(String),
}

/// One requirement of a node selector term.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeSelectorRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// One term of a volume's node affinity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeSelectorTerm {
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

/// A plugin's answer to `provision`: the volume it made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Volume {
    pub capacity_bytes: u64,
    pub source: VolumeSource,
    pub node_affinity: Vec<NodeSelectorTerm>,
    pub labels: StringMap,
    pub annotations: StringMap,
    pub mount_options: Vec<String>,
    pub volume_mode: Option<VolumeMode>,
}

/// Why a plugin made no volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProvisionError {
    Ignored(String),
    Failed(String),
    InBackground(String),
    Reschedule(String),
    Infeasible(String),
}

/// A volume as published, given back to `should-delete` and `delete`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PublishedVolume {
    pub name: String,
    pub source: VolumeSource,
    pub capacity_bytes: u64,
    pub labels: StringMap,
    pub annotations: StringMap,
    pub node_affinity: Vec<NodeSelectorTerm>,
    pub claim_namespace: Option<String>,
    pub claim_name: Option<String>,
}

/// What `should-delete` and `delete` receive.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeleteRequest {
    pub volume: PublishedVolume,
    pub class_name: String,
    pub class_parameters: StringMap,
    pub secret: Option<Secret>,
    pub context: CallContext,
}

/// Why a plugin deleted nothing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DeleteError {
    Ignored(String),
    Failed(String),
    InBackground(String),
}

/// What `expand` receives (0.2).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpandRequest {
    pub volume: PublishedVolume,
    pub class_name: String,
    pub class_parameters: StringMap,
    pub requested_bytes: u64,
    pub secret: Option<Secret>,
    pub context: CallContext,
}

/// Why a plugin did not grow a volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExpandError {
    Failed(String),
    InBackground(String),
    Infeasible(String),
}

/// What `get-capacity` receives (0.2).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CapacityRequest {
    pub class: Class,
    pub node: Option<Node>,
    pub context: CallContext,
}

/// A backend's space, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackendCapacity {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub maximum_volume_bytes: Option<u64>,
}
