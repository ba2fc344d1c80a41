//! The volume controller: keeps the HonorPVReclaimPolicy finalizer on our PVs and
//! deletes the backend volume of a released PV whose policy says Delete, then the PV.
//!
//! It decides, then acts, as the claim controller does: each reconcile asks the pure
//! [`decision`] for the next step, performs it ([`act`]) and, for a step that learns
//! something, decides again.
//!
//! The module that deletes is the one recorded on the PV when it was made
//! (`wasm-provisioner.dev/module`), falling back to its class's `module`: a class
//! changed or deleted since never strands a volume. A module missing at delete time is a
//! VolumeFailedDelete Event and a retry, never a lost volume: the PV and its finalizer
//! stay until the backend delete succeeds.
//!
//! A plugin may delete a large volume in bounded chunks, answering `in-background`
//! after each: that is progress, not failure. The PV and its finalizer stay, the delete
//! is asked again after [`IN_BACKGROUND_REQUEUE`] without back-off, failure count or
//! Warning Event, and one Normal `VolumeDeleting` Event per volume says it is under way
//! ([`told`]).
//!
//! - [`decision`]: the whole decision table, pure;
//! - [`act`]: a step performed, by [`delete`] or [`outcome`];
//! - [`error`]: why a reconcile did not finish, and how the volume is retried;
//! - [`key`], [`finalizer`], [`told`]: the PV's queue key, our finalizer on it, the
//!   in-background deletes told.

mod act;
mod attempt;
pub mod decision;
mod delete;
mod error;
mod finalizer;
mod key;
mod outcome;
mod told;

pub use error::{Error, error_policy};
pub(super) use key::key;
pub use outcome::IN_BACKGROUND_REQUEUE;
pub(super) use told::retain as retain_announced;

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tokio_util::sync::CancellationToken;
use tracing::trace;

use super::{Context, Feed};
use attempt::Attempt;

/// The most steps one reconcile takes (a delete and the PV's removal take 7): past it
/// the decision is looping, a bug.
const MAX_STEPS: usize = 16;

/// Reconciles one PV (kube-runtime's reconciler): decides and acts until a step ends
/// the reconcile.
pub async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let mut attempt = Attempt::new(&ctx, pv);
    let mut last = String::new();
    for _ in 0..MAX_STEPS {
        let step = decision::decide(&attempt.snapshot());
        trace!(volume = %attempt.pv.name_any(), ?step, "decided");
        if !step.learns() {
            return act::conclude(&mut attempt, step).await;
        }
        act::learn(&mut attempt, &step).await?;
        last = format!("{step:?}");
    }
    Err(Error::Undecided {
        volume: attempt.pv.name_any(),
        steps: MAX_STEPS,
        last,
    })
}

/// Runs the volume controller over `feed` until `shutdown`, then lets its in-flight
/// reconciles finish.
pub async fn start(ctx: Arc<Context>, feed: Feed<PersistentVolume>, shutdown: CancellationToken) {
    super::run_controller(
        "volume",
        ctx.clone(),
        ctx.volumes.clone(),
        feed,
        shutdown,
        reconcile,
        error_policy,
    )
    .await;
}
