//! Performing a step the decision named: each step is one thing done, by a function
//! named for it; nothing here chooses between steps.

use kube::runtime::controller::Action;

use super::attempt::Attempt;
use super::decision::Step;
use super::error::Error;
use super::{expand, outcome};

/// Performs a step that learns something (see [`Step::learns`]).
pub(super) async fn learn(attempt: &mut Attempt<'_>, step: &Step) -> Result<(), Error> {
    let retries = &attempt.ctx.expansion_retries;
    match step {
        Step::Forgive => retries.forget(&attempt.key),
        Step::DropHold => retries.drop_hold(&attempt.key),
        Step::ResolveModule => expand::module(attempt),
        Step::MarkInProgress => expand::mark_in_progress(attempt).await?,
        Step::Expand => expand::expand(attempt).await?,
        Step::SaveCapacity => expand::save_capacity(attempt).await?,
        step => return Err(not_a(attempt, step, "step that learns")),
    }
    Ok(())
}

/// Performs a step that ends the reconcile.
pub(super) async fn conclude(attempt: &mut Attempt<'_>, step: Step) -> Result<Action, Error> {
    match step {
        Step::LeaveAlone | Step::AlreadyDone => Ok(Action::await_change()),
        Step::Unreadable => Ok(outcome::unreadable(attempt)),
        Step::Settled => Ok(outcome::settled(attempt)),
        Step::ClearMarks => outcome::clear_marks(attempt).await,
        Step::WaitHeld(wait) => Ok(Action::requeue(wait)),
        Step::Finish => outcome::finish(attempt).await,
        Step::Shrink { tell } => Ok(outcome::shrink(attempt, tell).await),
        Step::NotAllowed { tell } => Ok(outcome::not_allowed(attempt, tell).await),
        Step::CannotExpand { tell } => Ok(outcome::cannot_expand(attempt, tell).await),
        Step::ModuleLoading => Ok(outcome::module_loading(attempt)),
        Step::Busy => Ok(outcome::busy(attempt)),
        Step::PoolFull => Ok(outcome::pool_full(attempt).await),
        Step::InBackground => Ok(outcome::in_background(attempt)),
        Step::Infeasible => Err(outcome::infeasible(attempt).await?),
        Step::Failed { mark } => Err(outcome::failed(attempt, mark).await?),
        Step::ClassMissing | Step::ModuleMissing => Err(outcome::failed(attempt, false).await?),
        ref step => Err(not_a(attempt, step, "step that ends a reconcile")),
    }
}

/// The decision and the act side disagree on what kind of step this is: a bug, told
/// as an error (the claim is retried with back-off) rather than a panic.
fn not_a(attempt: &Attempt<'_>, step: &Step, kind: &str) -> Error {
    Error::Undecided {
        claim: attempt.claim_key(),
        steps: 0,
        last: format!("{step:?}, not a {kind}"),
    }
}
