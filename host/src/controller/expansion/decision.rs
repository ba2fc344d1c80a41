//! The expansion controller's whole decision table, as one pure function over a
//! snapshot: [`decide`] reads what the controller knows of a claim ([`Snapshot`]) and
//! names the next [`Step`]; the controller performs it and, for a step that learns
//! something (a lookup, a write, the module's answer), decides again. The act side
//! holds no decision.
//!
//! The table: only a Bound claim whose PV (in the cache, bound to it by UID) we
//! provisioned; an expansion is wanted when the claim asks for more than its status
//! capacity. Then, as kubernetes-csi/external-resizer for a volume that needs no step on
//! a node: the claim is marked in progress, the module recorded on the PV is asked to
//! `expand`, the PV's capacity is saved, and the claim's status capacity set. A PV
//! already as large as asked only has the claim's status finished; a request below the
//! PV's size (but above the claim's capacity) is a shrink, refused; a module without
//! the `expand` capability, or a class that does not allow expansion, is told once per
//! request, without retries. Failures are retried with the claim controller's back-off,
//! an infeasible answer at the slow interval, at once when the request changes.
//!
//! No Kubernetes client, no async runtime, no sandbox here: plain data in, a step out.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::controller::claims::decision::{CallFailure, Lookup, RetryRecord};
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide;
use wasm_provisioner_rules::expand::{self, Sizes};
use wasm_provisioner_rules::names;

/// The module recorded on the PV (else its class's), as the runtime has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// In service, with the `expand` capability.
    Expands,
    /// In service, without it (a 0.1 guest, or a 0.2 one that does not export it).
    CannotExpand,
    /// Its first version is still compiling.
    Loading,
    /// Not recorded, or not in service.
    Missing,
}

/// The module's answer to `expand`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The volume's new size, in bytes.
    Expanded(u64),
    Failed,
    InBackground,
    Infeasible,
    CallFailed(CallFailure),
}

/// The settings the decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub provisioner_name: &'a str,
}

/// What the controller knows of a claim when it decides.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub claim: &'a PersistentVolumeClaim,
    /// The claim's PV, as the cache has it.
    pub volume: Option<&'a PersistentVolume>,
    /// The PV's class, as the cache has it.
    pub class: Option<&'a StorageClass>,
    pub rules: Rules<'a>,
    pub now: Instant,
    pub retry: RetryRecord,
    /// A refusal of this request (a shrink, a module that cannot expand, a class that
    /// does not allow it) was told already.
    pub told: bool,
    /// This process finished the expansion to this request already (the cache is
    /// behind its last write).
    pub finished: bool,
    pub module: Lookup<Module>,
    /// In this reconcile, the claim was marked in progress.
    pub marked: bool,
    pub answer: Option<Answer>,
    /// In this reconcile, the PV's capacity was saved as the module answered.
    pub volume_saved: bool,
}

/// The next thing to do about a claim's expansion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    // Steps that learn something; the controller decides again after each.
    /// The request changed since it was given up on, or since its infeasible answer:
    /// its failures are forgotten and it starts over.
    Forgive,
    /// A hold that no longer applies (expired, or the request changed since) goes.
    DropHold,
    /// The module recorded on the PV, else its class's.
    ResolveModule,
    /// Mark the claim's expansion in progress (status), with a Normal `Resizing` Event.
    MarkInProgress,
    /// Ask the module to expand the volume.
    Expand,
    /// Save the module's answer as the PV's capacity.
    SaveCapacity,

    // Steps that end the reconcile.
    /// Not ours to expand: not Bound, its PV not in the cache, not bound to it, not
    /// provisioned by us, or being deleted.
    LeaveAlone,
    /// The claim, or its PV, has a size that is not a quantity.
    Unreadable,
    /// Nothing to expand: its failures are forgotten.
    Settled,
    /// Nothing to expand, but an earlier expansion's marks are left on the claim: they go.
    ClearMarks,
    /// This process finished this request's expansion; the cache is behind.
    AlreadyDone,
    /// Waiting out a back-off while the request is unchanged.
    WaitHeld(Duration),
    /// The volume is as large as asked (expanded now, or before a crash): the claim's
    /// status capacity is set, its marks go; a Normal `VolumeResizeSuccessful` Event.
    Finish,
    /// The claim asks for less than the volume is: shrinking is not supported
    /// (a Warning, once per request when `tell`); no call, no retry.
    Shrink { tell: bool },
    /// The PV's class is gone: the module cannot be given its parameters; a Warning and
    /// a retry.
    ClassMissing,
    /// The class does not allow expansion (any more): a Warning once per request.
    NotAllowed { tell: bool },
    /// The module is still loading: no failed attempt, no Event; looked at again soon.
    ModuleLoading,
    /// No module to expand with: a Warning and a retry.
    ModuleMissing,
    /// The module has no `expand`: a Warning once per request, no retry.
    CannotExpand { tell: bool },
    /// The module was busy: nothing started; retried soon.
    Busy,
    /// The instance pool was full: a Warning Event; retried soon.
    PoolFull,
    /// The module answered failed (`mark`: the claim gets a `ControllerResizeError`
    /// condition), a call failed, or it answered less than asked: a Warning, a retry
    /// with back-off.
    Failed { mark: bool },
    /// Cannot succeed as asked: marked `ControllerResizeInfeasible`, a Warning, the slow
    /// retry, at once when the request changes.
    Infeasible,
    /// The module works in the background: asked again soon.
    InBackground,
}

impl Step {
    /// Whether the controller decides again after performing this step.
    pub fn learns(&self) -> bool {
        matches!(
            self,
            Step::Forgive
                | Step::DropHold
                | Step::ResolveModule
                | Step::MarkInProgress
                | Step::Expand
                | Step::SaveCapacity
        )
    }
}

/// What a held or given-up expansion waits on: the size asked for. Another request
/// starts it over at once.
pub fn fingerprint(requested: u64) -> u64 {
    requested
}

/// The claim's PV, if the claim is Bound to a PV of ours that is bound to it.
fn our_volume<'a>(s: &Snapshot<'a>) -> Option<&'a PersistentVolume> {
    let phase = s.claim.status.as_ref().and_then(|st| st.phase.as_deref());
    if ClaimView(s.claim).is_deleting() || phase != Some(names::PHASE_BOUND) {
        return None;
    }
    let pv = s.volume?;
    let bound_to_it = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.claim_ref.as_ref())
        .is_some_and(|r| r.uid.is_some() && r.uid == s.claim.metadata.uid);
    (bound_to_it && decide::provisioned_by(pv, s.rules.provisioner_name)).then_some(pv)
}

/// The next step for the claim of `snapshot`.
pub fn decide(s: &Snapshot) -> Step {
    let Some(pv) = our_volume(s) else {
        return Step::LeaveAlone;
    };
    let sizes = match expand::sizes(s.claim, pv) {
        Ok(Some(sizes)) => sizes,
        Ok(None) => return Step::LeaveAlone,
        Err(_) => return Step::Unreadable,
    };
    if sizes.requested <= sizes.capacity {
        return if expand::carries_marks(s.claim) {
            Step::ClearMarks
        } else {
            Step::Settled
        };
    }
    if s.finished {
        return Step::AlreadyDone;
    }
    retries(s, sizes)
        .or_else(|| volume(s, sizes))
        .or_else(|| module(s))
        .unwrap_or_else(|| expanding(s, sizes))
}

/// Forgiveness and holds, as the claim controller's: a request changed since it was
/// given up on or found infeasible starts over; one held and unchanged waits.
fn retries(s: &Snapshot, sizes: Sizes) -> Option<Step> {
    let print = fingerprint(sizes.requested);
    if s.retry.given_up.is_some_and(|at| at != print) {
        return Some(Step::Forgive);
    }
    if s.retry
        .infeasible_under
        .as_ref()
        .is_some_and(|under| *under != print.to_string())
    {
        return Some(Step::Forgive);
    }
    let (at, until) = s.retry.held?;
    if at == print && until > s.now {
        return Some(Step::WaitHeld(until - s.now));
    }
    Some(Step::DropHold)
}

/// What the volume's size says: saved as large as asked in this reconcile, or already
/// that large (finished but for the claim's status), or larger: a shrink, unless this
/// request's expansion is in progress (the module answered more than asked).
fn volume(s: &Snapshot, sizes: Sizes) -> Option<Step> {
    if s.volume_saved {
        return Some(Step::Finish);
    }
    match sizes.volume.cmp(&sizes.requested) {
        std::cmp::Ordering::Equal => Some(Step::Finish),
        // The module made it larger than asked, and the claim's status was not written
        // after the PV's (a crash): this request's expansion is done.
        std::cmp::Ordering::Greater if expand::in_progress(s.claim, sizes.requested) => {
            Some(Step::Finish)
        }
        std::cmp::Ordering::Greater => Some(Step::Shrink { tell: !s.told }),
        std::cmp::Ordering::Less => None,
    }
}

/// The class must allow expansion and give the module its parameters; the module must
/// be there and able to expand.
fn module(s: &Snapshot) -> Option<Step> {
    match s.class {
        None => return Some(Step::ClassMissing),
        Some(class) if class.allow_volume_expansion != Some(true) => {
            return Some(Step::NotAllowed { tell: !s.told });
        }
        Some(_) => {}
    }
    match s.module {
        Lookup::NotLooked => Some(Step::ResolveModule),
        Lookup::Found(Module::Expands) => None,
        Lookup::Found(Module::CannotExpand) => Some(Step::CannotExpand { tell: !s.told }),
        Lookup::Found(Module::Loading) => Some(Step::ModuleLoading),
        Lookup::Found(Module::Missing) | Lookup::Missing => Some(Step::ModuleMissing),
    }
}

/// Marked in progress, asked, saved.
fn expanding(s: &Snapshot, sizes: Sizes) -> Step {
    if !s.marked && !expand::in_progress(s.claim, sizes.requested) {
        return Step::MarkInProgress;
    }
    match s.answer {
        None => Step::Expand,
        Some(Answer::Expanded(bytes)) if bytes < sizes.requested => Step::Failed { mark: true },
        Some(Answer::Expanded(_)) => Step::SaveCapacity,
        Some(Answer::Failed) => Step::Failed { mark: true },
        Some(Answer::Infeasible) => Step::Infeasible,
        Some(Answer::InBackground) => Step::InBackground,
        Some(Answer::CallFailed(CallFailure::Busy)) => Step::Busy,
        Some(Answer::CallFailed(CallFailure::PoolFull)) => Step::PoolFull,
        Some(Answer::CallFailed(CallFailure::Failed)) => Step::Failed { mark: false },
    }
}

#[cfg(test)]
mod tests;
