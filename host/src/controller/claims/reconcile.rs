//! One reconcile of a claim: observe, decide, act, until a step ends it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use tracing::trace;

use super::act;
use super::attempt::Attempt;
use super::decision::decide;
use super::error::Error;
use crate::controller::Context;

/// The most steps one reconcile takes (the longest path, a volume that cannot be
/// published, takes 15): past it the decision is looping, a bug.
const MAX_STEPS: usize = 32;

/// Reconciles one claim (kube-runtime's reconciler).
pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let mut attempt = Attempt::observe(&ctx, claim, false);
    settle(&mut attempt).await
}

/// Decides and acts until a step ends the reconcile.
pub(super) async fn settle(attempt: &mut Attempt<'_>) -> Result<Action, Error> {
    let mut last = String::new();
    for _ in 0..MAX_STEPS {
        let step = decide(&attempt.snapshot());
        trace!(claim = %attempt.claim_key(), ?step, "decided");
        if !step.learns() {
            return act::conclude(attempt, step).await;
        }
        act::learn(attempt, &step).await?;
        last = format!("{step:?}");
    }
    Err(Error::Undecided {
        claim: attempt.claim_key(),
        steps: MAX_STEPS,
        last,
    })
}
