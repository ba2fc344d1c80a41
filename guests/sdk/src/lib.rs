//! Write wasm-provisioner plugins in plain Rust.
//!
//! A plugin is a type implementing [`Provisioner`], exported with [`export!`]:
//!
//! ```ignore
//! use wasm_provisioner_sdk::{self as sdk, prelude::*};
//!
//! struct Mine;
//! impl Provisioner for Mine {
//!     fn describe() -> PluginInfo { PluginInfo::new("mine", "0.1.0") }
//!     fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> { todo!() }
//!     fn delete(req: &DeleteRequest) -> Result<(), DeleteError> { todo!() }
//! }
//! sdk::export!(Mine);
//! ```
//!
//! Build the crate as a `cdylib` for `wasm32-wasip2`; the output is a component for the
//! `wasm-provisioner:plugin/provisioner` world (`wit/provisioner.wit`).
//!
//! Every call runs in a fresh instance: keep no state between calls. Every call may be
//! repeated: be idempotent by PV name. Claim names, labels and annotations are hostile
//! input: check them ([`path`]) before building a path from them.
//!
//! Natively (`cargo test` on the build machine) everything compiles: [`log`] lines go to
//! stderr instead of the host, so a plugin's logic can be unit-tested with plain
//! `#[test]`s and the request builders in [`testing`].

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "provisioner",
        pub_export_macro: true,
        export_macro_name: "__export_provisioner",
        default_bindings_module: "wasm_provisioner_sdk::bindings",
        additional_derives: [PartialEq, Eq],
    });
}

pub mod fs;
pub mod log;
pub mod params;
pub mod path;
pub mod testing;

pub use params::{ParamError, Params};

/// The data types of the contract, as generated from the WIT (`types` interface).
pub mod types {
    pub use crate::bindings::wasm_provisioner::plugin::types::*;
}

pub use types::{
    AccessMode, BindingMode, Claim, Class, CsiSource, DataSource, DeleteError, DeleteRequest,
    HostPathSource, IscsiSource, LabelRequirement, LabelSelector, LocalSource, NfsSource, Node,
    NodeSelectorRequirement, NodeSelectorTerm, PluginInfo, ProvisionError, ProvisionRequest,
    PublishedVolume, ReclaimPolicy, StringMap, TopologyRequirement, TopologyTerm, Volume,
    VolumeMode, VolumeSource,
};

/// Everything a plugin usually needs: `use wasm_provisioner_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::types::*;
    pub use crate::{ParamError, Params, Provisioner};
}

/// A provisioner plugin. All functions are associated functions: there is no instance
/// state, because every call runs in a fresh WebAssembly instance.
pub trait Provisioner {
    /// Who the plugin is. Called once when the host loads a module version; a plugin
    /// whose `describe` traps is refused.
    fn describe() -> PluginInfo;

    /// A veto before [`Provisioner::provision`]: false means "not for me" (no Warning
    /// Event, another provisioner may act). Defaults to true.
    fn should_provision(_request: &ProvisionRequest) -> bool {
        true
    }

    /// Makes the backend volume for `request.volume_name` (idempotently) and describes it.
    fn provision(request: &ProvisionRequest) -> Result<Volume, ProvisionError>;

    /// A veto before [`Provisioner::delete`]: false leaves the backend volume alone.
    /// Defaults to true.
    fn should_delete(_request: &DeleteRequest) -> bool {
        true
    }

    /// Deletes (or archives) the backend volume of a released PV. Deleting a volume that
    /// no longer exists must succeed.
    fn delete(request: &DeleteRequest) -> Result<(), DeleteError>;
}

/// Exports a [`Provisioner`] implementation as the component's `provisioner` world.
/// Use it once per plugin crate, at the crate root: `wasm_provisioner_sdk::export!(Mine);`.
#[macro_export]
macro_rules! export {
    ($ty:ty) => {
        const _: () = {
            struct __WasmProvisionerExport;

            impl $crate::bindings::Guest for __WasmProvisionerExport {
                fn describe() -> $crate::PluginInfo {
                    $crate::__private::enter();
                    <$ty as $crate::Provisioner>::describe()
                }
                fn should_provision(request: $crate::ProvisionRequest) -> bool {
                    $crate::__private::enter();
                    <$ty as $crate::Provisioner>::should_provision(&request)
                }
                fn provision(
                    request: $crate::ProvisionRequest,
                ) -> ::core::result::Result<$crate::Volume, $crate::ProvisionError> {
                    $crate::__private::enter();
                    <$ty as $crate::Provisioner>::provision(&request)
                }
                fn should_delete(request: $crate::DeleteRequest) -> bool {
                    $crate::__private::enter();
                    <$ty as $crate::Provisioner>::should_delete(&request)
                }
                fn delete(
                    request: $crate::DeleteRequest,
                ) -> ::core::result::Result<(), $crate::DeleteError> {
                    $crate::__private::enter();
                    <$ty as $crate::Provisioner>::delete(&request)
                }
            }

            $crate::bindings::__export_provisioner!(
                __WasmProvisionerExport with_types_in $crate::bindings
            );
        };
    };
}

#[doc(hidden)]
pub mod __private {
    /// Runs at the start of every exported call: routes panic messages to the host's log
    /// (at error level) before the panic traps, so "plugin trapped" comes with a reason.
    pub fn enter() {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                let message = info.payload_as_str().unwrap_or("(no message)");
                let message = match info.location() {
                    Some(at) => format!("panic: {message} (at {at})"),
                    None => format!("panic: {message}"),
                };
                crate::log::log(crate::log::Level::Error, &message, &[]);
            }))
        });
    }
}

impl PluginInfo {
    /// A plugin that supports no block volumes and no data sources.
    pub fn new(name: &str, version: &str) -> Self {
        PluginInfo {
            name: name.to_string(),
            version: version.to_string(),
            supports_block: false,
            data_source_kinds: Vec::new(),
        }
    }
}

impl Volume {
    /// A volume of `capacity_bytes` at `source`, with no node affinity, labels,
    /// annotations or mount options, in the claim's volume mode.
    pub fn new(capacity_bytes: u64, source: VolumeSource) -> Self {
        Volume {
            capacity_bytes,
            source,
            node_affinity: Vec::new(),
            labels: Vec::new(),
            annotations: Vec::new(),
            mount_options: Vec::new(),
            volume_mode: None,
        }
    }

    /// Restricts the volume to one node: `kubernetes.io/hostname In [node]`.
    pub fn on_node(mut self, node: &str) -> Self {
        self.node_affinity = hostname_affinity(node);
        self
    }

    /// Adds an annotation to the PV.
    pub fn annotate(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }
}

impl VolumeSource {
    /// A `hostPath` source with the given hostPath type (such as `"Directory"`).
    pub fn host_path(path: impl Into<String>, path_type: Option<&str>) -> Self {
        VolumeSource::HostPath(HostPathSource {
            path: path.into(),
            path_type: path_type.map(str::to_string),
        })
    }
}

/// The node affinity `kubernetes.io/hostname In [node]`.
pub fn hostname_affinity(node: &str) -> Vec<NodeSelectorTerm> {
    vec![NodeSelectorTerm {
        match_expressions: vec![NodeSelectorRequirement {
            key: "kubernetes.io/hostname".to_string(),
            operator: "In".to_string(),
            values: vec![node.to_string()],
        }],
    }]
}

/// The value of `key` in a string map (parameters, labels, annotations), if present.
/// Kubernetes maps have unique keys; if a map repeats one, the first wins.
pub fn lookup<'a>(map: &'a [(String, String)], key: &str) -> Option<&'a str> {
    map.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

impl ProvisionError {
    /// The message, whatever the outcome.
    pub fn message(&self) -> &str {
        match self {
            ProvisionError::Ignored(m)
            | ProvisionError::Failed(m)
            | ProvisionError::InBackground(m)
            | ProvisionError::Reschedule(m)
            | ProvisionError::Infeasible(m) => m,
        }
    }
}

impl DeleteError {
    /// The message, whatever the outcome.
    pub fn message(&self) -> &str {
        match self {
            DeleteError::Ignored(m) | DeleteError::Failed(m) | DeleteError::InBackground(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_first() {
        let map = vec![
            ("a".to_string(), "1".to_string()),
            ("a".to_string(), "2".to_string()),
        ];
        assert_eq!(lookup(&map, "a"), Some("1"));
        assert_eq!(lookup(&map, "b"), None);
    }

    #[test]
    fn volume_builders() {
        let v = Volume::new(5, VolumeSource::host_path("/x", Some("Directory")))
            .on_node("n1")
            .annotate("k", "v");
        assert_eq!(v.capacity_bytes, 5);
        assert_eq!(v.node_affinity[0].match_expressions[0].values, vec!["n1"]);
        assert_eq!(v.annotations, vec![("k".to_string(), "v".to_string())]);
    }
}
