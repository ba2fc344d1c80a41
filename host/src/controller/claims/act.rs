//! Performing a step the decision named: each step is one thing done, by a function
//! named for it; nothing here chooses between steps.

use kube::runtime::controller::Action;

use super::attempt::Attempt;
use super::decision::Step;
use super::error::Error;
use super::{cleanup, finish, lookup, outcome, provision};

/// Performs a step that learns something (see [`Step::learns`]).
pub(super) async fn learn(attempt: &mut Attempt<'_>, step: &Step) -> Result<(), Error> {
    match *step {
        Step::LookUpClass => lookup::class(attempt).await?,
        Step::Forgive => lookup::forgive(attempt),
        Step::DropHold => lookup::drop_hold(attempt),
        Step::ResolveModule => lookup::module(attempt),
        Step::EnterShare => lookup::share(attempt),
        Step::ValidateClass => lookup::verdict(attempt).await,
        Step::LookUpNode => lookup::node(attempt).await?,
        Step::AskShouldProvision { node_vanished } => {
            provision::ask_should_provision(attempt, node_vanished).await?
        }
        Step::BeginProvisioning => provision::begin(attempt),
        Step::RecordInJournal => provision::record_in_journal(attempt).await?,
        Step::RecordOnClaim => provision::record_on_claim(attempt).await?,
        Step::Provision => provision::provision(attempt).await?,
        Step::CheckVolume => provision::check_volume(attempt).await?,
        Step::SaveVolume => provision::save(attempt).await?,
        Step::Discard(of) => provision::discard(attempt, of).await?,
        Step::HoldJournal => cleanup::hold_journal(attempt),
        Step::ReadVolume => cleanup::read_volume(attempt).await?,
        Step::AskAgain => cleanup::ask_again(attempt).await?,
        Step::DeleteAgain => cleanup::delete_again(attempt).await?,
        ref step => return Err(not_a(attempt, step, "step that learns")),
    }
    Ok(())
}

/// Performs a step that ends the reconcile.
pub(super) async fn conclude(attempt: &mut Attempt<'_>, step: Step) -> Result<Action, Error> {
    let resync = Action::requeue(attempt.ctx.settings.resync_period);
    match step {
        Step::LeaveAlone => Ok(resync),
        Step::ForgetDeleted => Ok(finish::forget_deleted(attempt)),
        Step::AwaitBinder => Ok(Action::await_change()),
        Step::ReleaseBound => finish::release_bound(attempt).await,
        Step::WaitHeld(wait) => Ok(Action::requeue(wait)),
        Step::AlreadyPublished => Ok(finish::already_published(attempt)),
        Step::ModuleLoading => Err(finish::module_loading(attempt)),
        Step::ModuleUnavailable => Err(finish::module_unavailable(attempt).await),
        Step::Skip {
            reason,
            warn,
            retry,
        } => finish::skip(attempt, reason, warn, retry).await,
        Step::ClassRejected => Err(finish::class_rejected(attempt).await),
        Step::WaitForShare | Step::JournalBusy | Step::ClassUnchecked => {
            Ok(Action::requeue(crate::controller::shares::RECHECK))
        }
        Step::Reschedule => Err(finish::reschedule(attempt).await?),
        Step::ClaimGone => Ok(finish::claim_gone(attempt)),
        Step::Declined => Ok(outcome::declined(attempt)),
        Step::Busy { clear_journal } => Ok(outcome::busy(attempt, clear_journal)),
        Step::PoolFull { clear_journal } => Ok(outcome::pool_full(attempt, clear_journal).await),
        Step::ShouldProvisionFailed => Err(outcome::call_failed(attempt).await),
        Step::ProvisionCallFailed => Err(outcome::provision_call_failed(attempt).await?),
        Step::Ignored => outcome::ignored(attempt).await,
        Step::ModuleFailed | Step::InBackground | Step::ModuleReschedules | Step::Infeasible => {
            Err(outcome::refused(attempt, step).await?)
        }
        Step::Published => Ok(outcome::published(attempt).await),
        Step::SaveConflict => Err(outcome::save_conflict(attempt).await?),
        Step::Discarded => Err(outcome::discarded(attempt).await?),
        Step::DiscardFailed => Err(outcome::discard_failed(attempt).await?),
        Step::CleanupPublished | Step::NothingLeft => cleanup::done(attempt).await,
        Step::CleanupClassGone { tell } => Err(cleanup::class_gone(attempt, tell).await),
        Step::CleanupModuleUnavailable => Err(cleanup::module_missing(attempt).await),
        Step::CleanedUp => cleanup::cleaned_up(attempt).await,
        Step::StillInBackground => Err(cleanup::still_in_background(attempt)),
        Step::CleanupFailed => Err(cleanup::failed(attempt)),
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
