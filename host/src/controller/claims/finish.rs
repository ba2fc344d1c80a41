//! The steps that end a reconcile before the module is asked to provision: not ours,
//! deleted, bound, held, published already, no module, a rule says no, waiting for a
//! worker or the journal, a vanished node.

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::info;

use super::attempt::{Attempt, ModuleProblem};
use super::error::Error;
use super::reschedule::remove_selected_node;
use super::{intent, tell};
use crate::controller::classes::{Verdict, failed_note, rejected_note};
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;

/// Bound: whatever was started is published; the intent goes.
pub(super) async fn release_bound(attempt: &Attempt<'_>) -> Result<Action, Error> {
    let ctx = attempt.ctx;
    intent::release(ctx, attempt.claim()).await?;
    ctx.claim_retries.forget(&attempt.key);
    Ok(Action::requeue(ctx.settings.resync_period))
}

/// Its PV exists: the binder binds it next. A journal entry of an attempt cut short
/// after the PV create goes now.
pub(super) fn already_published(attempt: &Attempt<'_>) -> Action {
    let ctx = attempt.ctx;
    ctx.journal.clear(&attempt.key);
    ctx.claim_retries.forget(&attempt.key);
    Action::requeue(ctx.settings.resync_period)
}

/// Being deleted, with nothing of ours under way.
pub(super) fn forget_deleted(attempt: &Attempt<'_>) -> Action {
    attempt.ctx.claim_retries.forget(&attempt.key);
    Action::await_change()
}

/// The module is still loading: the claim waits for it (no failed attempt, no Event).
pub(super) fn module_loading(attempt: &Attempt<'_>) -> Error {
    Error::ModuleLoading {
        claim: attempt.claim_key(),
        problem: module_problem(attempt),
    }
}

/// The claim went (or is going) while its intent was being recorded.
pub(super) fn claim_gone(attempt: &Attempt<'_>) -> Action {
    info!(claim = %attempt.claim_key(), "the claim is gone or being deleted; not provisioning");
    Action::await_change()
}

/// Why the class's module cannot be had (the decision asks for it only then).
pub(super) fn module_problem(attempt: &Attempt<'_>) -> ModuleProblem {
    match &attempt.module {
        super::decision::Lookup::Found(Err(problem)) => problem.clone(),
        _ => ModuleProblem::NoModuleParameter {
            class: attempt.class().map(|c| c.name_any()).unwrap_or_default(),
        },
    }
}

/// No module to ask: a Warning Event (the admin may be adding it right now), a retry.
pub(super) async fn module_unavailable(attempt: &Attempt<'_>) -> Error {
    let problem = module_problem(attempt);
    attempt
        .ctx
        .events
        .claim_warning(
            attempt.claim(),
            names::REASON_PROVISIONING_FAILED,
            problem.to_string(),
        )
        .await;
    Error::Module {
        claim: attempt.claim_key(),
        problem,
    }
}

pub(super) async fn skip(
    attempt: &Attempt<'_>,
    reason: wasm_provisioner_rules::decide::SkipProvision,
    warn: bool,
    retry: bool,
) -> Result<Action, Error> {
    let ctx = attempt.ctx;
    if warn {
        ctx.events
            .claim_warning(
                attempt.claim(),
                names::REASON_PROVISIONING_FAILED,
                reason.to_string(),
            )
            .await;
    }
    if retry {
        return Err(Error::Skipped {
            claim: attempt.claim_key(),
            reason,
        });
    }
    Ok(Action::requeue(ctx.settings.resync_period))
}

/// The class's module rejects the class (or could not validate it): the claim fails at
/// once with the module's message, without `provision`; retried slowly, and at once
/// when the class or the module's version changes.
pub(super) async fn class_rejected(attempt: &Attempt<'_>) -> Error {
    let ctx = attempt.ctx;
    let class = attempt.class().cloned().expect("a verdict is of a class");
    let module = attempt
        .loaded_module()
        .cloned()
        .expect("a verdict is of a module");
    let why = match &attempt.verdict {
        super::decision::Lookup::Found(Some(Verdict::Rejected(message))) => {
            rejected_note(&module, message)
        }
        super::decision::Lookup::Found(Some(Verdict::Failed(error))) => failed_note(&module, error),
        _ => String::new(),
    };
    tell::attempt_failed(
        ctx,
        attempt.claim(),
        &class,
        tell::failed_note(&class, &why),
    )
    .await;
    Error::ClassRejected {
        claim: attempt.claim_key(),
        message: why,
        class_version: class.resource_version().unwrap_or_default(),
        module_sha256: module.sha256().to_string(),
    }
}

/// The selected node is gone and nothing is under way: the scheduler picks again.
pub(super) async fn reschedule(attempt: &Attempt<'_>) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let name = ClaimView(attempt.claim())
        .selected_node()
        .unwrap_or_default();
    let message =
        format!("selected node {name:?} does not exist; asking the scheduler to pick another");
    ctx.events
        .claim_warning(
            attempt.claim(),
            names::REASON_PROVISIONING_FAILED,
            message.clone(),
        )
        .await;
    remove_selected_node(ctx, attempt.claim()).await?;
    Ok(Error::NodeGone {
        claim: attempt.claim_key(),
        message,
    })
}
