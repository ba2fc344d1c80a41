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
//! `wasm-provisioner:plugin/plugin@0.2.0` world (`wit/provisioner.wit` in this crate, the contract `wit/0.2.0/provisioner.wit` of the repository).
//!
//! Optional capabilities are traits ([`Expander`], [`CapacityReporter`],
//! [`ClassValidator`]) named in [`export!`], which exports their interfaces and lists
//! them in `describe`: `sdk::export!(Mine, capabilities: [expand, validate_class]);`.
//!
//! Every call runs in a fresh instance: keep no state between calls. Every call may be
//! repeated: be idempotent by PV name. Claim names, labels and annotations are hostile
//! input: check them ([`path`]) before building a path from them.
//!
//! Natively (`cargo test` on the build machine) everything compiles: [`log`] lines go to
//! stderr instead of the host, so a plugin's logic can be unit-tested with plain
//! `#[test]`s and the request builders in [`testing`].

/// The contract's world: the imports and the `provisioner` interface every plugin
/// exports.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin",
        default_bindings_module: "wasm_provisioner_sdk::bindings",
        additional_derives: [PartialEq, Eq],
    });
}

/// The optional capabilities' interfaces, each in bindings of its own with an export
/// macro of its own: a plugin exports (and describes to `wit-component`) only those it
/// names in [`export!`], because the section that tells `wit-component` about an export
/// is emitted where its macro is used. The types are the contract's, shared.
#[doc(hidden)]
pub mod capabilities {
    pub mod expander {
        wit_bindgen::generate!({
            path: "wit",
            inline: "package wasm-provisioner:sdk;
                     world expander { export wasm-provisioner:plugin/expander@0.2.0; }",
            world: "wasm-provisioner:sdk/expander",
            with: { "wasm-provisioner:plugin/types@0.2.0": crate::types },
            pub_export_macro: true,
            export_macro_name: "__export_expander",
            default_bindings_module: "wasm_provisioner_sdk::capabilities::expander",
        });
    }

    pub mod capacity_reporter {
        wit_bindgen::generate!({
            path: "wit",
            inline: "package wasm-provisioner:sdk;
                     world capacity-reporter { export wasm-provisioner:plugin/capacity-reporter@0.2.0; }",
            world: "wasm-provisioner:sdk/capacity-reporter",
            with: { "wasm-provisioner:plugin/types@0.2.0": crate::types },
            pub_export_macro: true,
            export_macro_name: "__export_capacity_reporter",
            default_bindings_module: "wasm_provisioner_sdk::capabilities::capacity_reporter",
        });
    }

    pub mod class_validator {
        wit_bindgen::generate!({
            path: "wit",
            inline: "package wasm-provisioner:sdk;
                     world class-validator { export wasm-provisioner:plugin/class-validator@0.2.0; }",
            world: "wasm-provisioner:sdk/class-validator",
            with: { "wasm-provisioner:plugin/types@0.2.0": crate::types },
            pub_export_macro: true,
            export_macro_name: "__export_class_validator",
            default_bindings_module: "wasm_provisioner_sdk::capabilities::class_validator",
        });
    }
}

pub mod filesystem;
pub mod fs;
pub mod log;
pub mod params;
pub mod path;
pub mod quantity;
pub mod testing;

pub use params::{ParamError, Params};
pub use quantity::{QuantityError, format_bytes, parse_quantity};

/// The data types of the contract, as generated from the WIT (`types` interface).
pub mod types {
    pub use crate::bindings::wasm_provisioner::plugin::types::*;
}

pub use types::{
    AccessMode, BackendCapacity, BindingMode, CallContext, Capability, CapacityRequest, Claim,
    Class, CsiSource, DataSource, DeleteError, DeleteRequest, ExpandError, ExpandRequest,
    HostPathSource, IscsiSource, LabelRequirement, LabelSelector, LocalSource, NfsSource, Node,
    NodeSelectorRequirement, NodeSelectorTerm, PluginInfo, ProvisionError, ProvisionRequest,
    PublishedVolume, ReclaimPolicy, Secret, StringMap, TopologyRequirement, TopologyTerm, Volume,
    VolumeMode, VolumeSource,
};

/// Everything a plugin usually needs: `use wasm_provisioner_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::types::*;
    pub use crate::{CapacityReporter, ClassValidator, Expander, ParamError, Params, Provisioner};
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

/// Capability `expand`: grows volumes of classes with `allowVolumeExpansion: true`.
pub trait Expander {
    /// Grows the backend volume `request.volume.name` to at least
    /// `request.requested_bytes` (idempotently: a volume already that big answers its
    /// size) and answers its new capacity in bytes.
    fn expand(request: &ExpandRequest) -> Result<u64, ExpandError>;
}

/// Capability `report-capacity`: the backend's space, for metrics and the scheduler.
pub trait CapacityReporter {
    fn get_capacity(request: &CapacityRequest) -> Result<BackendCapacity, String>;
}

/// Capability `validate-class`: refuses a StorageClass whose parameters this plugin
/// cannot serve, before a claim of it fails. The message is shown to the admin.
pub trait ClassValidator {
    fn validate_class(class: &Class) -> Result<(), String>;
}

/// Exports a [`Provisioner`] implementation, and the optional capabilities it has, as
/// the component's contract. Use it once per plugin crate, at the crate root:
/// `wasm_provisioner_sdk::export!(Mine);`, or with capabilities (each one a trait the
/// type implements): `export!(Mine, capabilities: [expand, report_capacity,
/// validate_class]);`. `describe`'s capability list is filled in to match.
#[macro_export]
macro_rules! export {
    ($ty:ty) => {
        $crate::export!($ty, capabilities: []);
    };
    ($ty:ty, capabilities: [$($capability:ident),* $(,)?]) => {
        const _: () = {
            struct __WasmProvisionerExport;

            impl $crate::bindings::exports::wasm_provisioner::plugin::provisioner::Guest
                for __WasmProvisionerExport
            {
                fn describe() -> $crate::PluginInfo {
                    $crate::__private::enter();
                    let mut info = <$ty as $crate::Provisioner>::describe();
                    info.capabilities = ::std::vec![$($crate::__capability!($capability)),*];
                    info
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

            $crate::bindings::__export_plugin!(
                __WasmProvisionerExport with_types_in $crate::bindings
            );

            $($crate::__export_capability!($capability, $ty, __WasmProvisionerExport);)*
        };
    };
}

/// The [`Capability`] a name in [`export!`] stands for.
#[doc(hidden)]
#[macro_export]
macro_rules! __capability {
    (expand) => {
        $crate::Capability::Expand
    };
    (report_capacity) => {
        $crate::Capability::ReportCapacity
    };
    (validate_class) => {
        $crate::Capability::ValidateClass
    };
    ($other:ident) => {
        ::core::compile_error!(concat!(
            "unknown capability `",
            stringify!($other),
            "`: use expand, report_capacity or validate_class"
        ))
    };
}

/// Exports one optional capability's interface, implemented by the plugin's trait.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_capability {
    (expand, $ty:ty, $export:ident) => {
        impl $crate::capabilities::expander::exports::wasm_provisioner::plugin::expander::Guest
            for $export
        {
            fn expand(
                request: $crate::ExpandRequest,
            ) -> ::core::result::Result<u64, $crate::ExpandError> {
                $crate::__private::enter();
                <$ty as $crate::Expander>::expand(&request)
            }
        }
        $crate::capabilities::expander::__export_expander!(
            $export with_types_in $crate::capabilities::expander
        );
    };
    (report_capacity, $ty:ty, $export:ident) => {
        impl $crate::capabilities::capacity_reporter::exports::wasm_provisioner::plugin::capacity_reporter::Guest
            for $export
        {
            fn get_capacity(
                request: $crate::CapacityRequest,
            ) -> ::core::result::Result<$crate::BackendCapacity, ::std::string::String> {
                $crate::__private::enter();
                <$ty as $crate::CapacityReporter>::get_capacity(&request)
            }
        }
        $crate::capabilities::capacity_reporter::__export_capacity_reporter!(
            $export with_types_in $crate::capabilities::capacity_reporter
        );
    };
    (validate_class, $ty:ty, $export:ident) => {
        impl $crate::capabilities::class_validator::exports::wasm_provisioner::plugin::class_validator::Guest
            for $export
        {
            fn validate_class(
                class: $crate::Class,
            ) -> ::core::result::Result<(), ::std::string::String> {
                $crate::__private::enter();
                <$ty as $crate::ClassValidator>::validate_class(&class)
            }
        }
        $crate::capabilities::class_validator::__export_class_validator!(
            $export with_types_in $crate::capabilities::class_validator
        );
    };
    ($other:ident, $ty:ty, $export:ident) => {};
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
            capabilities: Vec::new(),
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

/// The one node an affinity pins a volume to (`kubernetes.io/hostname In [node]`, as
/// [`hostname_affinity`] makes it), if it is that.
pub fn pinned_node(affinity: &[NodeSelectorTerm]) -> Option<&str> {
    let [term] = affinity else { return None };
    let [requirement] = term.match_expressions.as_slice() else {
        return None;
    };
    let [node] = requirement.values.as_slice() else {
        return None;
    };
    (requirement.key == "kubernetes.io/hostname" && requirement.operator == "In")
        .then_some(node.as_str())
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

impl ExpandError {
    /// The message, whatever the outcome.
    pub fn message(&self) -> &str {
        match self {
            ExpandError::Failed(m) | ExpandError::InBackground(m) | ExpandError::Infeasible(m) => m,
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
