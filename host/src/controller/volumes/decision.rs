//! The volume controller's whole decision table, as one pure function over a
//! snapshot: [`decide`] reads what the controller knows of a PV ([`Snapshot`]) and names
//! the next [`Step`]; the controller performs it and, for a step that learns something
//! (a lookup, a guest call, a write), decides again. The act side holds no decision.
//!
//! The table: only PVs we provisioned; the HonorPVReclaimPolicy finalizer kept on
//! the live ones with policy Delete (and taken off when the policy changed, or the
//! finalizer is turned off); a Released PV with policy Delete has its backend volume
//! deleted by the module recorded on it (`should-delete`, then `delete`), then our
//! finalizer goes and the PV is deleted. A delete in the background is progress, not
//! failure. What this process already did for a PV (backend deleted, PV gone) is not
//! done twice.
//!
//! No Kubernetes client, no async runtime, no sandbox here: plain data in, a step out.

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::controller::claims::decision::{CallFailure, Lookup, Share};
use wasm_provisioner_rules::decide::{self, DeleteDecision, FinalizerAction, SkipDelete};
use wasm_provisioner_rules::names;

/// How far this process got with the PV's cleanup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The module deleted the backend volume; the PV object still has to go.
    BackendDeleted,
    /// The PV was deleted and our finalizer removed: nothing is left to do.
    Finished,
}

/// The module that made the PV (as recorded on it, else its class's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    Loaded,
    /// Its first version is still compiling.
    Loading,
    /// Not recorded, or not in service.
    Missing,
}

/// The module's answer to `delete`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Yes,
    Ignored,
    Failed,
    InBackground,
    CallFailed(CallFailure),
}

/// The settings the decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub provisioner_name: &'a str,
    /// `--volume-protection-finalizer`.
    pub protection_finalizer: bool,
}

/// What the controller knows of a PV when it decides.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub pv: &'a PersistentVolume,
    pub rules: Rules<'a>,
    pub stage: Option<Stage>,
    pub module: Lookup<Module>,
    pub share: Share,
    pub should_delete: Option<Result<bool, CallFailure>>,
    pub deleted: Option<Deleted>,
    /// This process told the PV already that its module deletes in the background.
    pub told_in_background: bool,
    /// In this reconcile, our finalizer was taken off the PV.
    pub finalizer_removed: bool,
    /// In this reconcile, the PV was deleted.
    pub pv_deleted: bool,
}

/// The next thing to do about a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    // Steps that learn something; the controller decides again after each.
    /// The module recorded on the PV, else its class's.
    ResolveModule,
    /// Take one of the module's volume workers.
    EnterShare,
    /// Ask the module's `should-delete`.
    AskShouldDelete,
    /// Ask the module to delete the backend volume.
    Delete,
    /// The backend volume is gone: counted, remembered (no second delete call if the
    /// cache still shows the PV).
    BackendDeleted,
    /// Our finalizer comes off, before the PV's delete (so it never races the
    /// pv-protection controller, which edits a PV only once it is being deleted).
    LetGo,
    /// Delete the PV object.
    DeletePv,

    // Steps that end the reconcile.
    /// Not provisioned by us.
    NotOurs,
    /// A live PV of ours with policy Delete lacks the protection finalizer.
    AddFinalizer,
    /// The finalizer must go: the policy is no longer Delete, or it is turned off.
    RemoveFinalizer,
    /// Not to be deleted (not Released, policy Retain, ...); `forget`: its failures are
    /// forgotten (it is not being deleted).
    Keep { reason: SkipDelete, forget: bool },
    /// This process finished its cleanup already; the cache is behind.
    AlreadyDone,
    /// The module is still loading: no failed attempt, no Event; looked at again soon.
    ModuleLoading,
    /// No module to delete with: VolumeFailedDelete, a retry; the PV stays.
    ModuleMissing,
    /// The module holds its whole share of the workers.
    WaitForShare,
    /// `should-delete` said no.
    Declined,
    /// The module was busy: nothing started; retried soon.
    Busy,
    /// The instance pool was full: a Warning Event; retried soon.
    PoolFull,
    /// A call failed, or the module answered failed: VolumeFailedDelete, a retry.
    DeleteFailed,
    /// The module answered ignored.
    Ignored,
    /// The module deletes in the background: progress; asked again soon, earlier
    /// failures forgotten; `tell`: the first time, a Normal Event.
    InBackground { tell: bool },
    /// The backend volume and the PV are gone.
    Finished,
}

impl Step {
    /// Whether the controller decides again after performing this step.
    pub fn learns(&self) -> bool {
        matches!(
            self,
            Step::ResolveModule
                | Step::EnterShare
                | Step::AskShouldDelete
                | Step::Delete
                | Step::BackendDeleted
                | Step::LetGo
                | Step::DeletePv
        )
    }
}

/// The next step for the PV of `snapshot`.
pub fn decide(s: &Snapshot) -> Step {
    let name = s.rules.provisioner_name;
    if !decide::provisioned_by(s.pv, name) {
        return Step::NotOurs;
    }
    match decide::pv_finalizer_action(s.pv, name, s.rules.protection_finalizer) {
        FinalizerAction::Add => return Step::AddFinalizer,
        FinalizerAction::Remove => return Step::RemoveFinalizer,
        FinalizerAction::None => {}
    }
    if let DeleteDecision::Skip(reason) = decide::should_delete(s.pv, name) {
        let forget = s.pv.metadata.deletion_timestamp.is_none();
        return Step::Keep { reason, forget };
    }
    match s.stage {
        Some(Stage::Finished) => Step::AlreadyDone,
        Some(Stage::BackendDeleted) => remove(s),
        None => delete(s),
    }
}

/// The module's delete, after its `should-delete`.
fn delete(s: &Snapshot) -> Step {
    match s.module {
        Lookup::NotLooked => return Step::ResolveModule,
        Lookup::Found(Module::Loading) => return Step::ModuleLoading,
        Lookup::Found(Module::Missing) | Lookup::Missing => return Step::ModuleMissing,
        Lookup::Found(Module::Loaded) => {}
    }
    // A worker of the module's share, before any API request or call for the volume.
    match s.share {
        Share::NotTried => return Step::EnterShare,
        Share::Full => return Step::WaitForShare,
        Share::Entered => {}
    }
    match s.should_delete {
        None => return Step::AskShouldDelete,
        Some(Ok(true)) => {}
        Some(Ok(false)) => return Step::Declined,
        Some(Err(failure)) => return call_failed(failure),
    }
    match s.deleted {
        None => Step::Delete,
        Some(Deleted::Yes) => Step::BackendDeleted,
        Some(Deleted::Ignored) => Step::Ignored,
        Some(Deleted::Failed) => Step::DeleteFailed,
        Some(Deleted::InBackground) => Step::InBackground {
            tell: !s.told_in_background,
        },
        Some(Deleted::CallFailed(failure)) => call_failed(failure),
    }
}

fn call_failed(failure: CallFailure) -> Step {
    match failure {
        CallFailure::Busy => Step::Busy,
        CallFailure::PoolFull => Step::PoolFull,
        CallFailure::Failed => Step::DeleteFailed,
    }
}

/// The backend is gone: our finalizer off, then the PV deleted (unless it is being
/// deleted already). A PV left Released without our finalizer (a crash in between) is
/// deleted again from the top: the module's delete of a deleted volume succeeds.
fn remove(s: &Snapshot) -> Step {
    let ours = wasm_provisioner_rules::object::has_finalizer(
        &s.pv.metadata,
        names::FINALIZER_PV_PROTECTION,
    );
    if ours && !s.finalizer_removed {
        return Step::LetGo;
    }
    if s.pv.metadata.deletion_timestamp.is_none() && !s.pv_deleted {
        return Step::DeletePv;
    }
    Step::Finished
}

#[cfg(test)]
mod tests;
