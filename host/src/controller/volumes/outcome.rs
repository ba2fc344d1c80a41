//! The steps that end a reconcile of a volume.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, info};

use super::attempt::Attempt;
use super::error::Error;
use super::key::class_label;
use super::{finalizer, told};
use crate::controller::recent::VolumeStage;
use crate::controller::{pool_full, shares};
use wasm_provisioner_rules::decide::SkipDelete;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::DeleteError;
use wasm_provisioner_runtime::CallError;

/// How soon a delete the plugin answered `in-background` is asked again: soon enough
/// that a volume deleted in one-second chunks goes at a steady pace, slow enough to
/// leave the workers to other volumes between chunks.
pub const IN_BACKGROUND_REQUEUE: Duration = Duration::from_secs(2);

/// A live PV of ours with policy Delete gets the protection finalizer.
pub(super) async fn add_finalizer(attempt: &Attempt<'_>) -> Result<Action, Error> {
    finalizer::edit(attempt.ctx, &attempt.pv, true).await?;
    Ok(Action::requeue(attempt.ctx.settings.resync_period))
}

/// The protection finalizer goes (policy no longer Delete, or turned off).
pub(super) async fn remove_finalizer(attempt: &Attempt<'_>) -> Result<Action, Error> {
    finalizer::edit(attempt.ctx, &attempt.pv, false).await?;
    Ok(Action::await_change())
}

/// Not to be deleted.
pub(super) fn keep(attempt: &Attempt<'_>, reason: SkipDelete, forget: bool) -> Action {
    debug!(volume = attempt.pv.name_any(), %reason, "not deleting");
    if forget {
        attempt.ctx.volume_retries.forget(&attempt.key);
    }
    Action::requeue(attempt.ctx.settings.resync_period)
}

fn no_module_message(attempt: &Attempt<'_>) -> String {
    match &attempt.module {
        crate::controller::claims::decision::Lookup::Found(Err(problem)) => problem.message.clone(),
        _ => String::new(),
    }
}

/// The module is still loading: the volume waits for it.
pub(super) fn module_loading(attempt: &Attempt<'_>) -> Action {
    let message = no_module_message(attempt);
    debug!(volume = %attempt.pv.name_any(), "{message}; retrying in {:?}", shares::LOADING_RECHECK);
    Action::requeue(shares::LOADING_RECHECK)
}

/// The error of the call that did not answer: `delete`'s, else `should-delete`'s.
fn call_error(attempt: &mut Attempt<'_>) -> CallError {
    match (attempt.deleted.take(), attempt.should_delete.take()) {
        (Some(Err(error)), _) | (None, Some(Err(error))) => error,
        _ => unreachable!("the decision names a failed call only after one"),
    }
}

/// A call refused because the module already runs its `maxConcurrentCalls` (claims and
/// volumes together): not a failed attempt, no Event; retried shortly.
pub(super) fn busy(attempt: &mut Attempt<'_>) -> Action {
    let error = call_error(attempt);
    info!(volume = %attempt.pv.name_any(), "{error}; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

/// The instance pool was full: a Warning Event; retried soon.
pub(super) async fn pool_full(attempt: &mut Attempt<'_>) -> Action {
    let error = call_error(attempt);
    pool_full::volume(&attempt.ctx.events, &attempt.pv, &error).await
}

fn module_name<'a>(attempt: &'a Attempt<'_>) -> &'a str {
    attempt
        .loaded_module()
        .map(|m| m.name())
        .unwrap_or_default()
}

/// `should-delete` said no.
pub(super) fn declined(attempt: &Attempt<'_>) -> Action {
    info!(volume = %attempt.pv.name_any(), module = module_name(attempt), "plugin declined to delete (should-delete said no)");
    Action::await_change()
}

/// The module answered ignored.
pub(super) fn ignored(attempt: &Attempt<'_>) -> Action {
    let message = match &attempt.deleted {
        Some(Ok(Err(DeleteError::Ignored(message)))) => message.as_str(),
        _ => "",
    };
    info!(volume = %attempt.pv.name_any(), module = module_name(attempt), %message, "plugin ignored the delete");
    Action::await_change()
}

/// A failed delete attempt: counted, and told on the PV as VolumeFailedDelete. Why: no
/// module, a call failed, or the module answered failed.
pub(super) async fn delete_failed(attempt: &mut Attempt<'_>) -> Error {
    let (cause, message) = match (&attempt.deleted, &attempt.should_delete) {
        (Some(Ok(Err(DeleteError::Failed(message)))), _) => ("failed", message.clone()),
        (Some(Err(error)), _) | (None, Some(Err(error))) => {
            (error.metric_label(), error.to_string())
        }
        _ => ("no_module", no_module_message(attempt)),
    };
    failed(attempt, cause, message).await
}

/// A delete attempt that failed for `cause` (a metric label): counted, and told on the
/// PV as VolumeFailedDelete with `message`.
pub(super) async fn failed(attempt: &Attempt<'_>, cause: &'static str, message: String) -> Error {
    let ctx = attempt.ctx;
    let class = class_label(&attempt.pv);
    ctx.metrics
        .delete_failed_total
        .with_label_values(&[class.as_str()])
        .inc();
    ctx.events
        .volume_warning(
            &attempt.pv,
            names::REASON_VOLUME_FAILED_DELETE,
            message.clone(),
        )
        .await;
    Error::Delete {
        volume: attempt.pv.name_any(),
        cause,
        message,
    }
}

/// The module deletes in the background: progress, not failure. Earlier failures no
/// longer count towards giving up; the first time, a Normal Event says it is under way.
pub(super) async fn in_background(attempt: &Attempt<'_>, tell: bool) -> Action {
    let ctx = attempt.ctx;
    let message = match &attempt.deleted {
        Some(Ok(Err(DeleteError::InBackground(message)))) => message.as_str(),
        _ => "",
    };
    let module = module_name(attempt);
    ctx.volume_retries.forget(&attempt.key);
    info!(volume = %attempt.pv.name_any(), module, %message, "the plugin deletes the backend volume in the background; asking again soon");
    if tell {
        told::remember(&attempt.key);
        ctx.events
            .volume_normal(
                &attempt.pv,
                names::REASON_VOLUME_DELETING,
                format!(
                    "module {module} is deleting the backend volume in the background ({message}); the PV stays until it is done"
                ),
            )
            .await;
    }
    Action::requeue(IN_BACKGROUND_REQUEUE)
}

/// The backend volume and the PV are gone.
pub(super) fn finished(attempt: &Attempt<'_>) -> Action {
    let ctx = attempt.ctx;
    ctx.recent
        .set_volume_stage(&attempt.key, VolumeStage::Finished);
    ctx.volume_retries.forget(&attempt.key);
    Action::await_change()
}
