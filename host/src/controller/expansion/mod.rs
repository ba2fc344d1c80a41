//! The expansion controller: grows the volume of a Bound claim of ours that asks for
//! more than its capacity, through the module that made it, as kubernetes-csi/
//! external-resizer does for a volume that needs no step on a node.
//!
//! kube-controller-manager's expand controller sees the claim's request raised, finds
//! no in-tree plugin for our PVs and tells the claim `ExternalExpanding` ("waiting for an
//! external controller to expand this PVC"); this controller is that external one. For a
//! claim Bound to a PV we provisioned (`pv.kubernetes.io/provisioned-by`), whose class
//! allows expansion: the claim's status is marked in progress (the `Resizing` condition,
//! `allocatedResources`, `ControllerResizeInProgress`, a Normal `Resizing` Event), the
//! module recorded on the PV is asked to `expand` (capability `expand` of contract 0.2)
//! with the PV as published and the size asked for, the PV's capacity becomes the
//! module's answer, then the claim's status capacity (the marks cleared, a Normal
//! `VolumeResizeSuccessful` Event). Failures are `VolumeResizeFailed` Warnings, retried
//! with the claim controller's back-off; an infeasible answer marks the claim
//! `ControllerResizeInfeasible` and waits the slow interval, or until the claim asks for
//! another size. A shrink, a module without `expand`, and a class that does not allow
//! expansion are told once per request and not retried.
//!
//! It decides, then acts, as the other controllers: each reconcile asks the pure
//! [`decision`] for the next step, performs it ([`act`]) and, for a step that learns
//! something, decides again. Its queue is fed from the claim and volume watches (a
//! Bound claim changed, a PV of ours changed: its claim), after the caches hold the
//! change; it reads only the caches.
//!
//! - [`decision`]: the whole decision table, pure;
//! - [`act`]: a step performed, by [`expand`] or [`outcome`]; the writes in [`status`];
//! - [`error`]: why a reconcile did not finish, and how the claim is retried;
//! - [`told`], [`finished`]: the refusals told, one per request; the expansions this
//!   process finished that the cache may not show yet.

mod act;
mod attempt;
pub mod decision;
mod error;
mod expand;
mod finished;
mod outcome;
mod status;
mod told;

pub use error::{Error, error_policy};
pub(super) use finished::retain as retain_finished;
pub use outcome::IN_BACKGROUND_REQUEUE;
pub(super) use told::retain as retain_told;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing::trace;

use super::{Context, Feed};
use attempt::Attempt;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::{decide, names};

/// The most steps one reconcile takes (an expansion takes 6): past it the decision is
/// looping, a bug.
const MAX_STEPS: usize = 16;

/// Reconciles one claim's expansion (kube-runtime's reconciler): decides and acts until
/// a step ends the reconcile.
pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let mut attempt = Attempt::new(&ctx, claim);
    let mut last = String::new();
    for _ in 0..MAX_STEPS {
        let step = decision::decide(&attempt.snapshot());
        trace!(claim = %attempt.claim_key(), ?step, "expansion decided");
        if !step.learns() {
            return act::conclude(&mut attempt, step).await;
        }
        act::learn(&mut attempt, &step).await?;
        last = format!("{step:?}");
    }
    Err(Error::Undecided {
        claim: attempt.claim_key(),
        steps: MAX_STEPS,
        last,
    })
}

/// A claim the expansion controller looks at when the claim watch shows it: a Bound
/// one (only those can be expanded).
pub(super) fn claim_trigger(
    claim: &PersistentVolumeClaim,
) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    (phase == Some(names::PHASE_BOUND) && !ClaimView(claim).is_deleting())
        .then(|| ObjectRef::from_obj(claim))
}

/// The claim the expansion controller looks at when the volume watch shows a PV of
/// ours bound to it (its capacity, as the expansion compares it, may have changed).
pub(super) fn volume_trigger(
    pv: &PersistentVolume,
    provisioner_name: &str,
) -> Option<ObjectRef<PersistentVolumeClaim>> {
    if !decide::provisioned_by(pv, provisioner_name) {
        return None;
    }
    let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(ObjectRef::new(claim.name.as_deref()?).within(claim.namespace.as_deref()?))
}

/// Runs the expansion controller over `feed` until `shutdown`, then lets its in-flight
/// reconciles finish.
pub async fn start(
    ctx: Arc<Context>,
    feed: Feed<PersistentVolumeClaim>,
    shutdown: CancellationToken,
) {
    super::run_controller(
        "expansion",
        ctx.clone(),
        ctx.claims.clone(),
        feed,
        shutdown,
        reconcile,
        error_policy,
    )
    .await;
}
