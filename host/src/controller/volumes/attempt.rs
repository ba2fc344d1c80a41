//! One reconcile of a volume, as the act side keeps it: what its steps learned (the
//! module, the module's answers, the writes done) and what it holds (the module's
//! worker). [`Attempt::snapshot`] is the decision's view of it.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;

use super::decision::{Deleted, Module, Rules, Snapshot, Stage};
use super::key::key;
use super::told;
use crate::controller::Context;
use crate::controller::calls::call_failure;
use crate::controller::claims::decision::{Lookup, Share};
use crate::controller::recent::VolumeStage;
use crate::controller::shares::SharePermit;
use wasm_provisioner_rules::types::{DeleteError, DeleteRequest};
use wasm_provisioner_runtime::{CallError, LoadedModule};

/// Why the volume's module cannot be had.
pub(super) struct NoModule {
    /// Its first version is still loading (not a failure).
    pub loading: bool,
    pub message: String,
}

pub(super) struct Attempt<'c> {
    pub ctx: &'c Context,
    pub pv: Arc<PersistentVolume>,
    pub key: String,
    pub module: Lookup<Result<Arc<LoadedModule>, NoModule>>,
    pub share: Share,
    /// A worker of the module's share, held until its delete call returns.
    pub share_permit: Option<SharePermit<PersistentVolume>>,
    pub request: Option<DeleteRequest>,
    pub should_delete: Option<Result<bool, CallError>>,
    /// When the delete call started.
    pub started: Option<Instant>,
    pub deleted: Option<Result<Result<(), DeleteError>, CallError>>,
    pub finalizer_removed: bool,
    pub pv_deleted: bool,
}

impl<'c> Attempt<'c> {
    pub fn new(ctx: &'c Context, pv: Arc<PersistentVolume>) -> Self {
        Self {
            key: key(&pv),
            ctx,
            pv,
            module: Lookup::NotLooked,
            share: Share::NotTried,
            share_permit: None,
            request: None,
            should_delete: None,
            started: None,
            deleted: None,
            finalizer_removed: false,
            pv_deleted: false,
        }
    }

    /// The module, once resolved.
    pub fn loaded_module(&self) -> Option<&Arc<LoadedModule>> {
        self.module.usable()
    }

    /// The decision's view.
    pub fn snapshot(&self) -> Snapshot<'_> {
        let settings = &self.ctx.settings;
        Snapshot {
            pv: &self.pv,
            rules: Rules {
                provisioner_name: &settings.provisioner_name,
                protection_finalizer: settings.volume_protection_finalizer,
            },
            stage: self
                .ctx
                .recent
                .volume_stage(&self.key)
                .map(|stage| match stage {
                    VolumeStage::BackendDeleted => Stage::BackendDeleted,
                    VolumeStage::Finished => Stage::Finished,
                }),
            module: self.module.as_ref().map(|module| match module {
                Ok(_) => Module::Loaded,
                Err(problem) if problem.loading => Module::Loading,
                Err(_) => Module::Missing,
            }),
            share: self.share,
            should_delete: self
                .should_delete
                .as_ref()
                .map(|answer| answer.as_ref().copied().map_err(call_failure)),
            deleted: self.deleted.as_ref().map(|answer| match answer {
                Ok(Ok(())) => Deleted::Yes,
                Ok(Err(DeleteError::Ignored(_))) => Deleted::Ignored,
                Ok(Err(DeleteError::Failed(_))) => Deleted::Failed,
                Ok(Err(DeleteError::InBackground(_))) => Deleted::InBackground,
                Err(error) => Deleted::CallFailed(call_failure(error)),
            }),
            told_in_background: told::was_told(&self.key),
            finalizer_removed: self.finalizer_removed,
            pv_deleted: self.pv_deleted,
        }
    }
}
