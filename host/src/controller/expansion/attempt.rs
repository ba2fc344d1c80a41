//! One reconcile of a claim's expansion, as the act side keeps it: the claim as last
//! written, its PV and class from the caches, and what the steps learned (the module,
//! the writes done, the module's answer). [`Attempt::snapshot`] is the decision's view.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::decision::{Answer, Module, Rules, Snapshot};
use super::{finished, told};
use crate::controller::Context;
use crate::controller::calls::call_failure;
use crate::controller::claims::decision::Lookup;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{Capability, ExpandError};
use wasm_provisioner_runtime::{CallError, LoadedModule};

/// Why the volume's module cannot be had.
pub(super) struct NoModule {
    /// Its first version is still loading (not a failure).
    pub loading: bool,
    pub message: String,
}

pub(super) struct Attempt<'c> {
    pub ctx: &'c Context,
    /// The claim: as reconciled, then as this reconcile's writes left it.
    pub claim: Arc<PersistentVolumeClaim>,
    /// The retry key: the claim's UID.
    pub key: String,
    pub volume: Option<Arc<PersistentVolume>>,
    pub class: Option<Arc<StorageClass>>,
    pub module: Lookup<Result<Arc<LoadedModule>, NoModule>>,
    pub marked: bool,
    /// When the `expand` call started.
    pub started: Option<Instant>,
    pub answer: Option<Result<Result<u64, ExpandError>, CallError>>,
    pub volume_saved: bool,
}

impl<'c> Attempt<'c> {
    pub fn new(ctx: &'c Context, claim: Arc<PersistentVolumeClaim>) -> Self {
        let volume = ClaimView(&claim)
            .bound_volume()
            .and_then(|name| ctx.volume(name));
        let class = volume
            .as_ref()
            .and_then(|pv| pv.spec.as_ref()?.storage_class_name.clone())
            .and_then(|name| ctx.class(&name));
        Self {
            key: crate::controller::claims::key(&claim),
            ctx,
            claim,
            volume,
            class,
            module: Lookup::NotLooked,
            marked: false,
            started: None,
            answer: None,
            volume_saved: false,
        }
    }

    /// `namespace/name`, for errors and logs.
    pub fn claim_key(&self) -> String {
        ClaimView(&self.claim).key()
    }

    /// The module, once resolved.
    pub fn loaded_module(&self) -> Option<&Arc<LoadedModule>> {
        self.module.usable()
    }

    /// The module's name: as resolved, else as recorded on the PV, else its class's
    /// (empty if none says).
    pub fn module_name(&self) -> &str {
        if let Some(module) = self.loaded_module() {
            return module.name();
        }
        let recorded = self
            .volume
            .as_ref()
            .and_then(|pv| pv.metadata.annotations.as_ref()?.get(names::ANN_MODULE));
        let of_class = || {
            self.class
                .as_ref()
                .and_then(|c| c.parameters.as_ref()?.get(names::PARAM_MODULE))
        };
        recorded
            .or_else(of_class)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The PV's class name (the `class` label of the metrics).
    pub fn class_name(&self) -> String {
        self.volume
            .as_ref()
            .and_then(|pv| pv.spec.as_ref()?.storage_class_name.clone())
            .unwrap_or_default()
    }

    /// The claim's PV, which the decision found (every step after the first has it).
    pub fn pv(&self) -> &PersistentVolume {
        self.volume
            .as_deref()
            .expect("the decision acts only on a claim whose PV is cached")
    }

    /// The size the claim asks for, as it spells it.
    pub fn requested(&self) -> Quantity {
        storage(
            self.claim
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        )
    }

    /// The claim's status capacity, as it spells it.
    pub fn capacity(&self) -> Quantity {
        storage(self.claim.status.as_ref().and_then(|s| s.capacity.as_ref()))
    }

    /// The PV's capacity, as it spells it.
    pub fn volume_capacity(&self) -> Quantity {
        storage(
            self.volume
                .as_ref()
                .and_then(|pv| pv.spec.as_ref()?.capacity.as_ref()),
        )
    }

    /// The decision's view.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            claim: &self.claim,
            volume: self.volume.as_deref(),
            class: self.class.as_deref(),
            rules: Rules {
                provisioner_name: &self.ctx.settings.provisioner_name,
            },
            now: Instant::now(),
            retry: self.ctx.expansion_retries.record(&self.key),
            told: told::was_told(&self.key, &self.requested().0),
            finished: finished::was_finished(&self.key, &self.requested().0),
            module: self.module.as_ref().map(|module| match module {
                Ok(module) if module.has(Capability::Expand) => Module::Expands,
                Ok(_) => Module::CannotExpand,
                Err(problem) if problem.loading => Module::Loading,
                Err(_) => Module::Missing,
            }),
            marked: self.marked,
            answer: self.answer.as_ref().map(|answer| match answer {
                Ok(Ok(bytes)) => Answer::Expanded(*bytes),
                Ok(Err(ExpandError::Failed(_))) => Answer::Failed,
                Ok(Err(ExpandError::InBackground(_))) => Answer::InBackground,
                Ok(Err(ExpandError::Infeasible(_))) => Answer::Infeasible,
                Err(error) => Answer::CallFailed(call_failure(error)),
            }),
            volume_saved: self.volume_saved,
        }
    }
}

fn storage(resources: Option<&std::collections::BTreeMap<String, Quantity>>) -> Quantity {
    resources
        .and_then(|r| r.get(names::RESOURCE_STORAGE))
        .cloned()
        .unwrap_or_else(|| Quantity("0".into()))
}
