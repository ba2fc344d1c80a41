//! Performing a step the decision named: each step is one thing done, by a function
//! named for it; nothing here chooses between steps.

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::attempt::Attempt;
use super::decision::Step;
use super::error::Error;
use super::{delete, outcome};

/// Performs a step that learns something (see [`Step::learns`]).
pub(super) async fn learn(attempt: &mut Attempt<'_>, step: &Step) -> Result<(), Error> {
    match step {
        Step::ResolveModule => delete::module(attempt),
        Step::EnterShare => delete::share(attempt),
        Step::AskShouldDelete => delete::ask_should_delete(attempt).await?,
        Step::Delete => delete::delete(attempt).await?,
        Step::BackendDeleted => delete::backend_deleted(attempt),
        Step::LetGo => delete::let_go(attempt).await?,
        Step::DeletePv => delete::delete_pv(attempt).await?,
        step => return Err(not_a(attempt, step, "step that learns")),
    }
    Ok(())
}

/// Performs a step that ends the reconcile.
pub(super) async fn conclude(attempt: &mut Attempt<'_>, step: Step) -> Result<Action, Error> {
    match step {
        Step::NotOurs | Step::AlreadyDone => Ok(Action::await_change()),
        Step::AddFinalizer => outcome::add_finalizer(attempt).await,
        Step::RemoveFinalizer => outcome::remove_finalizer(attempt).await,
        Step::Keep { reason, forget } => Ok(outcome::keep(attempt, reason, forget)),
        Step::ModuleLoading => Ok(outcome::module_loading(attempt)),
        Step::ModuleMissing | Step::DeleteFailed => Err(outcome::delete_failed(attempt).await),
        Step::WaitForShare => Ok(Action::requeue(crate::controller::shares::RECHECK)),
        Step::Declined => Ok(outcome::declined(attempt)),
        Step::Busy => Ok(outcome::busy(attempt)),
        Step::PoolFull => Ok(outcome::pool_full(attempt).await),
        Step::Ignored => Ok(outcome::ignored(attempt)),
        Step::InBackground { tell } => Ok(outcome::in_background(attempt, tell).await),
        Step::Finished => Ok(outcome::finished(attempt)),
        ref step => Err(not_a(attempt, step, "step that ends a reconcile")),
    }
}

/// The decision and the act side disagree on what kind of step this is: a bug, told
/// as an error (the volume is retried with back-off) rather than a panic.
fn not_a(attempt: &Attempt<'_>, step: &Step, kind: &str) -> Error {
    Error::Undecided {
        volume: attempt.pv.name_any(),
        steps: 0,
        last: format!("{step:?}, not a {kind}"),
    }
}
