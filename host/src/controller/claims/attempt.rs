//! One reconcile of a claim, as the act side keeps it: what it observed at the start,
//! what its steps learned since (lookups, the module's answers, the results of writes
//! whose outcome matters), and what it holds (the module's worker, the journal entry,
//! the in-flight gauge). [`Attempt::snapshot`] is the decision's view of it.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;

use super::decision::{
    Answer, ClassVerdict, JournalHold, Lookup, Module, Publishing, Recorded, Rules, Share, Snapshot,
};
use super::key::{key, volume_name_for};
use crate::controller::calls::{InFlight, call_failure};
use crate::controller::classes::{ClassChecks, Verdict};
use crate::controller::shares::SharePermit;
use crate::controller::{Context, journal, storm};
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{
    DeleteError, DeleteRequest, ProvisionError, ProvisionRequest, Volume,
};
use wasm_provisioner_runtime::{CallError, LoadedModule, ResolveError};

/// Why the class's module cannot be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModuleProblem {
    #[error(
        "storage class {class:?} has no {:?} parameter; set it to the name of a module in the modules directory",
        names::PARAM_MODULE
    )]
    NoModuleParameter { class: String },
    #[error("storage class {class:?}: {source}")]
    Resolve {
        class: String,
        #[source]
        source: ResolveError,
    },
}

impl ModuleProblem {
    /// Its first version is still loading (not a failure).
    pub fn is_loading(&self) -> bool {
        matches!(self, ModuleProblem::Resolve { source, .. } if source.is_loading())
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            ModuleProblem::NoModuleParameter { .. } => "no_module_parameter",
            ModuleProblem::Resolve { source, .. } => source.metric_label(),
        }
    }
}

/// The module's answer to a `provision` call.
pub(super) type ProvisionAnswer = Result<Result<Volume, ProvisionError>, CallError>;

/// The module's answer to a `delete` call.
pub(super) type DeleteAnswer = Result<Result<(), DeleteError>, CallError>;

pub(super) struct Attempt<'c> {
    pub ctx: &'c Context,
    /// The claim as the reconcile got it.
    pub claim: Arc<PersistentVolumeClaim>,
    /// The claim as our last write left it (our finalizer added).
    pub fresh: Option<PersistentVolumeClaim>,
    pub key: String,
    /// The journal's copy of a claim gone from the API.
    pub gone: bool,
    pub journaled: bool,
    pub static_volume_may_bind: bool,
    pub cached_class: Option<Arc<StorageClass>>,
    pub live_class: Lookup<Arc<StorageClass>>,
    pub published: bool,
    pub module: Lookup<Result<Arc<LoadedModule>, ModuleProblem>>,
    /// The sha256 of the class's module in service when the reconcile started.
    pub module_sha256: Option<String>,
    /// The module's verdict on the class; `None`: it could not be asked now.
    pub verdict: Lookup<Option<Verdict>>,
    pub share: Share,
    /// A worker of the module's share, held until its provision call returns.
    pub share_permit: Option<SharePermit<PersistentVolumeClaim>>,
    /// The selected node, or (a provision under way) a node by that name that is gone.
    pub node: Lookup<Arc<PartialObjectMeta<Node>>>,
    pub request: Option<ProvisionRequest>,
    pub should_provision: Option<Result<bool, CallError>>,
    pub journal: JournalHold,
    pub journal_hold: Option<journal::Hold>,
    /// From `should-provision` until the intent is recorded: the journal's writer waits
    /// a little for this record before writing another alone.
    pub expected_record: Option<journal::Expected>,
    pub recorded: Recorded,
    pub in_flight: Option<InFlight>,
    pub storm: Option<storm::Provisioning<'c>>,
    /// When the provision call started.
    pub started: Option<Instant>,
    pub answer: Option<ProvisionAnswer>,
    /// How to delete the module's volume: as it answered it, or (once it could not be
    /// saved) as its PV says.
    pub delete_request: Option<DeleteRequest>,
    pub publishing: Publishing,
    pub pv: Option<PersistentVolume>,
    /// Why the volume could not be published or saved.
    pub unpublished_because: Option<String>,
    pub deleted: Option<DeleteAnswer>,
    pub live_volume: Lookup<bool>,
}

impl<'c> Attempt<'c> {
    /// What the controller knows of `claim` at the start of a reconcile: from the
    /// caches and this process's memory, no request.
    pub fn observe(ctx: &'c Context, claim: Arc<PersistentVolumeClaim>, gone: bool) -> Self {
        let key = key(&claim);
        let view = ClaimView(&claim);
        let class_name = view.class_name();
        let cached_class = class_name.as_deref().and_then(|name| ctx.class(name));
        let module_sha256 = cached_class
            .as_deref()
            .and_then(ClassChecks::module_name)
            .and_then(|module| ctx.runtime.module(module))
            .map(|module| module.sha256().to_string());
        let static_volume_may_bind = ctx.settings.provision_before_binder
            && view.provisioner().is_none()
            && class_name
                .as_deref()
                .is_some_and(|class| ctx.static_volumes.may_bind(&claim, class));
        // The cache may lag our own create (and the binder's edits of the claim that
        // trigger this reconcile come first): a PV this process created counts.
        let pv_name = volume_name_for(&claim);
        let published = match ctx.volume(&pv_name) {
            Some(pv) => decide::existing_pv_is_this_claims(&pv, &claim),
            None => ctx.recent.was_created(&pv_name),
        };
        Self {
            journaled: ctx.journal.contains(&key),
            ctx,
            claim,
            fresh: None,
            key,
            gone,
            static_volume_may_bind,
            cached_class,
            live_class: Lookup::NotLooked,
            published,
            module: Lookup::NotLooked,
            module_sha256,
            verdict: Lookup::NotLooked,
            share: Share::NotTried,
            share_permit: None,
            node: Lookup::NotLooked,
            request: None,
            should_provision: None,
            journal: JournalHold::NotTaken,
            journal_hold: None,
            expected_record: None,
            recorded: Recorded::Nowhere,
            in_flight: None,
            storm: None,
            started: None,
            answer: None,
            delete_request: None,
            publishing: Publishing::Unchecked,
            pv: None,
            unpublished_because: None,
            deleted: None,
            live_volume: Lookup::NotLooked,
        }
    }

    /// The claim as this reconcile last saw it.
    pub fn claim(&self) -> &PersistentVolumeClaim {
        self.fresh.as_ref().unwrap_or(&self.claim)
    }

    /// `namespace/name`: how logs, Events and errors name the claim.
    pub fn claim_key(&self) -> String {
        ClaimView(self.claim()).key()
    }

    /// The claim's class: the cache's, else the API's.
    pub fn class(&self) -> Option<&Arc<StorageClass>> {
        self.cached_class
            .as_ref()
            .or(self.live_class.as_ref().found())
    }

    /// The class's module, once resolved.
    pub fn loaded_module(&self) -> Option<&Arc<LoadedModule>> {
        self.module.usable()
    }

    /// The decision's view.
    pub fn snapshot(&self) -> Snapshot<'_> {
        let settings = &self.ctx.settings;
        Snapshot {
            claim: self.claim(),
            gone: self.gone,
            rules: Rules {
                provisioner_name: &settings.provisioner_name,
                provision_before_binder: settings.provision_before_binder,
            },
            now: Instant::now(),
            journaled: self.journaled,
            static_volume_may_bind: self.static_volume_may_bind,
            retry: self.ctx.claim_retries.record(&self.key),
            cached_class: self.cached_class.as_deref(),
            live_class: self.live_class.as_ref().map(|class| class.as_ref()),
            published: self.published,
            module: self.module.as_ref().map(|module| match module {
                Ok(loaded) => Module::Loaded(loaded.info()),
                Err(problem) if problem.is_loading() => Module::Loading,
                Err(_) => Module::Unavailable,
            }),
            module_sha256: self.module_sha256.as_deref(),
            verdict: self.verdict.as_ref().map(|verdict| match verdict {
                Some(Verdict::Valid) => ClassVerdict::Valid,
                Some(Verdict::Rejected(_)) => ClassVerdict::Rejected,
                Some(Verdict::Failed(_)) => ClassVerdict::Failed,
                None => ClassVerdict::NotNow,
            }),
            share: self.share,
            node: self.node.as_ref().map(drop),
            should_provision: self
                .should_provision
                .as_ref()
                .map(|answer| answer.as_ref().copied().map_err(call_failure)),
            journal: self.journal,
            recorded: self.recorded,
            answer: self.answer.as_ref().map(answer),
            publishing: self.publishing,
            deleted: self
                .deleted
                .as_ref()
                .map(|answer| matches!(answer, Ok(Ok(())))),
            live_volume_is_the_claims: self.live_volume,
        }
    }
}

fn answer(answer: &ProvisionAnswer) -> Answer {
    match answer {
        Ok(Ok(_)) => Answer::Volume,
        Ok(Err(ProvisionError::Ignored(_))) => Answer::Ignored,
        Ok(Err(ProvisionError::Failed(_))) => Answer::Failed,
        Ok(Err(ProvisionError::InBackground(_))) => Answer::InBackground,
        Ok(Err(ProvisionError::Reschedule(_))) => Answer::Reschedule,
        Ok(Err(ProvisionError::Infeasible(_))) => Answer::Infeasible,
        Err(error) => Answer::CallFailed(call_failure(error)),
    }
}
