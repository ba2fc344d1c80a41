//! A component linked against the contract version it was built for, and the calls into
//! one instance of it, in the rules' types whatever the version.
//!
//! The version is read from the component's exports: a 0.2 plugin exports the interface
//! `wasm-provisioner:plugin/provisioner@0.2.0` (and, for each optional capability it
//! has, that capability's interface); a 0.1 plugin exports `describe`, `provision`, ...
//! at its root. Both are linked by one linker (`sandbox::linker`).

use std::fmt;

use wasm_provisioner_rules::types::{
    BackendCapacity, Capability, CapacityRequest, Class, DeleteError, DeleteRequest, ExpandError,
    ExpandRequest, PluginInfo, ProvisionError, ProvisionRequest, Volume,
};
use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker};

use crate::bindings::{v1, v2};
use crate::contract::Mirror;
use crate::sandbox::GuestState;

/// The interface every 0.2 plugin exports.
const V2_PROVISIONER: &str = "wasm-provisioner:plugin/provisioner@0.2.0";

/// The export of an optional capability's interface.
fn v2_export(capability: Capability) -> String {
    format!("wasm-provisioner:plugin/{}@0.2.0", capability.interface())
}

/// The contract version a component was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContractVersion {
    V0_1,
    V0_2,
}

impl ContractVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "0.1.0",
            ContractVersion::V0_2 => "0.2.0",
        }
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A component, linked and checked against its contract version's world.
#[derive(Clone)]
pub(crate) enum GuestPre {
    V1(v1::ProvisionerPre<GuestState>),
    V2(Box<V2Pre>),
}

#[derive(Clone)]
pub(crate) struct V2Pre {
    instance: InstancePre<GuestState>,
    provisioner: v2::provisioner::GuestIndices,
    expander: Option<v2::expander::GuestIndices>,
    capacity_reporter: Option<v2::capacity_reporter::GuestIndices>,
    class_validator: Option<v2::class_validator::GuestIndices>,
}

impl GuestPre {
    /// Links `component`; fails when it imports what the host does not give or exports
    /// no contract version the host knows (or one of the wrong shape).
    pub(crate) fn new(
        linker: &Linker<GuestState>,
        component: &Component,
    ) -> wasmtime::Result<GuestPre> {
        let instance = linker.instantiate_pre(component)?;
        if component.get_export_index(None, V2_PROVISIONER).is_none() {
            return Ok(GuestPre::V1(v1::ProvisionerPre::new(instance)?));
        }
        let optional = |capability| {
            component
                .get_export_index(None, v2_export(capability))
                .map(|_| capability)
        };
        Ok(GuestPre::V2(Box::new(V2Pre {
            provisioner: v2::provisioner::GuestIndices::new(&instance)?,
            expander: optional(Capability::Expand)
                .map(|c| v2::expander::GuestIndices::new(&instance).map_err(|e| misshapen(c, e)))
                .transpose()?,
            capacity_reporter: optional(Capability::ReportCapacity)
                .map(|c| {
                    v2::capacity_reporter::GuestIndices::new(&instance).map_err(|e| misshapen(c, e))
                })
                .transpose()?,
            class_validator: optional(Capability::ValidateClass)
                .map(|c| {
                    v2::class_validator::GuestIndices::new(&instance).map_err(|e| misshapen(c, e))
                })
                .transpose()?,
            instance,
        })))
    }

    pub(crate) fn contract(&self) -> ContractVersion {
        match self {
            GuestPre::V1(_) => ContractVersion::V0_1,
            GuestPre::V2(_) => ContractVersion::V0_2,
        }
    }

    /// The optional capabilities the component exports, in the contract's order.
    pub(crate) fn capabilities(&self) -> Vec<Capability> {
        let GuestPre::V2(pre) = self else {
            return Vec::new();
        };
        let exported = [
            (Capability::Expand, pre.expander.is_some()),
            (Capability::ReportCapacity, pre.capacity_reporter.is_some()),
            (Capability::ValidateClass, pre.class_validator.is_some()),
        ];
        exported
            .into_iter()
            .filter_map(|(capability, exported)| exported.then_some(capability))
            .collect()
    }

    /// A fresh instance in `store`, every export it has checked against the contract.
    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<GuestState>,
    ) -> wasmtime::Result<Guest> {
        match self {
            GuestPre::V1(pre) => Ok(Guest::V1(pre.instantiate_async(&mut *store).await?)),
            GuestPre::V2(pre) => {
                let instance = pre.instance.instantiate_async(&mut *store).await?;
                let mut store = &mut *store;
                Ok(Guest::V2(Box::new(V2Guest {
                    provisioner: pre.provisioner.load(&mut store, &instance)?,
                    expander: match &pre.expander {
                        Some(indices) => Some(indices.load(&mut store, &instance)?),
                        None => None,
                    },
                    capacity_reporter: match &pre.capacity_reporter {
                        Some(indices) => Some(indices.load(&mut store, &instance)?),
                        None => None,
                    },
                    class_validator: match &pre.class_validator {
                        Some(indices) => Some(indices.load(&mut store, &instance)?),
                        None => None,
                    },
                })))
            }
        }
    }
}

/// One instance of a plugin.
pub(crate) enum Guest {
    V1(v1::Provisioner),
    V2(Box<V2Guest>),
}

pub(crate) struct V2Guest {
    provisioner: v2::provisioner::Guest,
    expander: Option<v2::expander::Guest>,
    capacity_reporter: Option<v2::capacity_reporter::Guest>,
    class_validator: Option<v2::class_validator::Guest>,
}

/// The error of an optional export that is not the contract's.
fn misshapen(capability: Capability, error: wasmtime::Error) -> wasmtime::Error {
    error.context(format!(
        "its export {} does not match the contract",
        v2_export(capability)
    ))
}

/// The error of a call to a capability the plugin does not have: the host checks the
/// capabilities before calling, so this is a host bug if it is ever seen.
fn missing(capability: Capability) -> wasmtime::Error {
    wasmtime::format_err!(
        "the plugin does not export {} (capability {capability})",
        v2_export(capability)
    )
}

impl Guest {
    pub(crate) async fn describe(
        &self,
        store: &mut Store<GuestState>,
    ) -> wasmtime::Result<PluginInfo> {
        Ok(match self {
            Guest::V1(p) => p.call_describe(store).await?.mirror(),
            Guest::V2(g) => g.provisioner.call_describe(store).await?.mirror(),
        })
    }

    pub(crate) async fn should_provision(
        &self,
        store: &mut Store<GuestState>,
        request: ProvisionRequest,
    ) -> wasmtime::Result<bool> {
        match self {
            Guest::V1(p) => p.call_should_provision(store, &request.mirror()).await,
            Guest::V2(g) => {
                let request: v2::types::ProvisionRequest = request.mirror();
                g.provisioner.call_should_provision(store, &request).await
            }
        }
    }

    pub(crate) async fn provision(
        &self,
        store: &mut Store<GuestState>,
        request: ProvisionRequest,
    ) -> wasmtime::Result<Result<Volume, ProvisionError>> {
        let answer = match self {
            Guest::V1(p) => {
                let answer = p.call_provision(store, &request.mirror()).await?;
                answer.map(Mirror::mirror).map_err(Mirror::mirror)
            }
            Guest::V2(g) => {
                let request: v2::types::ProvisionRequest = request.mirror();
                let answer = g.provisioner.call_provision(store, &request).await?;
                answer.map(Mirror::mirror).map_err(Mirror::mirror)
            }
        };
        Ok(answer)
    }

    pub(crate) async fn should_delete(
        &self,
        store: &mut Store<GuestState>,
        request: DeleteRequest,
    ) -> wasmtime::Result<bool> {
        match self {
            Guest::V1(p) => p.call_should_delete(store, &request.mirror()).await,
            Guest::V2(g) => {
                let request: v2::types::DeleteRequest = request.mirror();
                g.provisioner.call_should_delete(store, &request).await
            }
        }
    }

    pub(crate) async fn delete(
        &self,
        store: &mut Store<GuestState>,
        request: DeleteRequest,
    ) -> wasmtime::Result<Result<(), DeleteError>> {
        let answer = match self {
            Guest::V1(p) => p
                .call_delete(store, &request.mirror())
                .await?
                .map_err(Mirror::mirror),
            Guest::V2(g) => {
                let request: v2::types::DeleteRequest = request.mirror();
                g.provisioner
                    .call_delete(store, &request)
                    .await?
                    .map_err(Mirror::mirror)
            }
        };
        Ok(answer)
    }

    fn v2(&self, capability: Capability) -> wasmtime::Result<&V2Guest> {
        match self {
            Guest::V1(_) => Err(missing(capability)),
            Guest::V2(g) => Ok(g),
        }
    }

    pub(crate) async fn expand(
        &self,
        store: &mut Store<GuestState>,
        request: ExpandRequest,
    ) -> wasmtime::Result<Result<u64, ExpandError>> {
        let capability = Capability::Expand;
        let expander =
            (self.v2(capability)?.expander.as_ref()).ok_or_else(|| missing(capability))?;
        let request: v2::types::ExpandRequest = request.mirror();
        Ok(expander
            .call_expand(store, &request)
            .await?
            .map_err(Mirror::mirror))
    }

    pub(crate) async fn get_capacity(
        &self,
        store: &mut Store<GuestState>,
        request: CapacityRequest,
    ) -> wasmtime::Result<Result<BackendCapacity, String>> {
        let capability = Capability::ReportCapacity;
        let reporter =
            (self.v2(capability)?.capacity_reporter.as_ref()).ok_or_else(|| missing(capability))?;
        let request: v2::types::CapacityRequest = request.mirror();
        Ok(reporter
            .call_get_capacity(store, &request)
            .await?
            .map(Mirror::mirror))
    }

    pub(crate) async fn validate_class(
        &self,
        store: &mut Store<GuestState>,
        class: Class,
    ) -> wasmtime::Result<Result<(), String>> {
        let capability = Capability::ValidateClass;
        let validator =
            (self.v2(capability)?.class_validator.as_ref()).ok_or_else(|| missing(capability))?;
        let class: v2::types::Class = class.mirror();
        validator.call_validate_class(store, &class).await
    }
}
