//! The steps that end a reconcile of a claim's expansion: its Events, its metrics, and
//! when it is looked at again.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, info, warn};

use super::attempt::Attempt;
use super::decision::fingerprint;
use super::error::Error;
use super::expand::expand_outcome;
use super::{finished, status, told};
use crate::controller::claims::decision::Lookup;
use crate::controller::shares;
use wasm_provisioner_rules::types::ExpandError;
use wasm_provisioner_rules::{expand, names, quantity};

/// How soon an expansion the module answered `in-background` is asked again.
pub const IN_BACKGROUND_REQUEUE: Duration = Duration::from_secs(2);

/// Counts one expansion attempt that ended with `outcome`.
fn count(attempt: &Attempt<'_>, outcome: &str) {
    let class = attempt.class_name();
    attempt
        .ctx
        .metrics
        .expansions_total
        .with_label_values(&[class.as_str(), attempt.module_name(), outcome])
        .inc();
}

/// Nothing to expand (any more): its failures and refusals are forgotten.
pub(super) fn settled(attempt: &Attempt<'_>) -> Action {
    attempt.ctx.expansion_retries.forget(&attempt.key);
    told::forget(&attempt.key);
    finished::forget(&attempt.key);
    Action::await_change()
}

/// The request went back to the capacity: an earlier expansion's marks go.
pub(super) async fn clear_marks(attempt: &Attempt<'_>) -> Result<Action, Error> {
    let patch = expand::clear_marks(&attempt.claim, &attempt.capacity());
    status::patch_claim(attempt.ctx, &attempt.claim, patch, "claim expansion clear").await?;
    info!(claim = %attempt.claim_key(), "the claim asks for its capacity again: the expansion's marks are cleared");
    Ok(settled(attempt))
}

/// A size that is not a quantity: nothing can be decided until it changes.
pub(super) fn unreadable(attempt: &Attempt<'_>) -> Action {
    warn!(claim = %attempt.claim_key(), "the claim's or its PV's size is not a quantity; not expanding");
    Action::await_change()
}

/// The volume is as large as asked: the claim's status capacity says so, its marks go;
/// a Normal `VolumeResizeSuccessful` Event, and the expansion counted and timed.
pub(super) async fn finish(attempt: &Attempt<'_>) -> Result<Action, Error> {
    let ctx = attempt.ctx;
    let capacity = match attempt.answer {
        Some(Ok(Ok(bytes))) => quantity::format_bytes(bytes),
        _ => attempt.volume_capacity(),
    };
    let patch = expand::mark_finished(&attempt.claim, &capacity);
    let claim = status::patch_claim(ctx, &attempt.claim, patch, "claim expansion finish").await?;
    if let Some(started) = attempt.started {
        count(attempt, "ok");
        let class = attempt.class_name();
        ctx.metrics
            .expansion_duration
            .with_label_values(&[class.as_str(), attempt.module_name()])
            .observe(started.elapsed().as_secs_f64());
    }
    ctx.expansion_retries.forget(&attempt.key);
    told::forget(&attempt.key);
    finished::remember(&attempt.key, &attempt.requested().0);
    ctx.events
        .expansion_normal(
            &claim,
            names::REASON_VOLUME_RESIZE_SUCCESSFUL,
            format!(
                "resize volume succeeded: volume {} is {}",
                attempt.pv().name_any(),
                capacity.0
            ),
        )
        .await;
    Ok(Action::await_change())
}

/// A refusal told once per request (a Warning), counted as `outcome`; no retry: the
/// claim is looked at again when it (or its PV) changes, and once per resync period
/// (a module version that can expand may have been deployed meanwhile), quietly.
async fn refuse(attempt: &Attempt<'_>, tell: bool, outcome: &str, note: String) -> Action {
    if tell {
        warn!(claim = %attempt.claim_key(), "{note}");
        told::remember(&attempt.key, &attempt.requested().0);
        count(attempt, outcome);
        attempt
            .ctx
            .events
            .expansion_warning(&attempt.claim, names::REASON_VOLUME_RESIZE_FAILED, note)
            .await;
    }
    Action::requeue(attempt.ctx.settings.resync_period)
}

/// The claim asks for less than the volume is.
pub(super) async fn shrink(attempt: &Attempt<'_>, tell: bool) -> Action {
    let (volume, size) = (attempt.pv().name_any(), attempt.volume_capacity().0);
    let note = format!(
        "shrinking a volume is not supported: volume {volume} is {size} and the claim asks for {}; the volume stays {size} (ask for {size} or more)",
        attempt.requested().0
    );
    refuse(attempt, tell, "shrink", note).await
}

/// The class does not allow expansion.
pub(super) async fn not_allowed(attempt: &Attempt<'_>, tell: bool) -> Action {
    let note = format!(
        "class {} does not allow volume expansion (allowVolumeExpansion is not true): volume {} stays {}",
        attempt.class_name(),
        attempt.pv().name_any(),
        attempt.volume_capacity().0
    );
    refuse(attempt, tell, "not_allowed", note).await
}

/// The module has no `expand`.
pub(super) async fn cannot_expand(attempt: &Attempt<'_>, tell: bool) -> Action {
    let size = attempt.volume_capacity().0;
    let note = format!(
        "module {} cannot expand volumes (it does not export the expand capability of contract 0.2): volume {} stays {size}; ask for {size} again, or serve the class with a module that can expand",
        attempt.module_name(),
        attempt.pv().name_any(),
    );
    refuse(attempt, tell, "unsupported", note).await
}

/// The module is still loading: the claim waits for it.
pub(super) fn module_loading(attempt: &Attempt<'_>) -> Action {
    debug!(claim = %attempt.claim_key(), "the module is still loading; retrying in {:?}", shares::LOADING_RECHECK);
    Action::requeue(shares::LOADING_RECHECK)
}

/// The module was busy: nothing started, no Event; retried soon.
pub(super) fn busy(attempt: &Attempt<'_>) -> Action {
    info!(claim = %attempt.claim_key(), module = attempt.module_name(), "the module runs its maxConcurrentCalls; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

/// The instance pool was full: a Warning naming the fix; retried soon.
pub(super) async fn pool_full(attempt: &Attempt<'_>) -> Action {
    if let Some(Err(error)) = &attempt.answer {
        warn!(claim = %attempt.claim_key(), "{error}; retrying in {:?}", shares::RECHECK);
        attempt
            .ctx
            .events
            .expansion_warning(
                &attempt.claim,
                names::REASON_VOLUME_RESIZE_FAILED,
                error.to_string(),
            )
            .await;
    }
    Action::requeue(shares::RECHECK)
}

/// The module expands in the background: progress, not failure. Earlier failures no
/// longer count; asked again soon (held that long, so the echo of a status write does
/// not ask at once).
pub(super) fn in_background(attempt: &Attempt<'_>) -> Action {
    let ctx = attempt.ctx;
    let message = match &attempt.answer {
        Some(Ok(Err(ExpandError::InBackground(message)))) => message.as_str(),
        _ => "",
    };
    count(attempt, "in_background");
    info!(claim = %attempt.claim_key(), module = attempt.module_name(), %message, "the module expands the volume in the background; asking again soon");
    ctx.expansion_retries.forget(&attempt.key);
    let requested = quantity::quantity_bytes(&attempt.requested()).unwrap_or(0);
    ctx.expansion_retries
        .hold(&attempt.key, fingerprint(requested), IN_BACKGROUND_REQUEUE);
    Action::requeue(IN_BACKGROUND_REQUEUE)
}

/// The warning's beginning: which module could not make which volume how large.
fn could_not(attempt: &Attempt<'_>) -> String {
    format!(
        "module {} could not expand volume {} to {}",
        attempt.module_name(),
        attempt.pv().name_any(),
        attempt.requested().0
    )
}

/// An infeasible answer: the claim marked `ControllerResizeInfeasible`, a Warning with
/// the module's message; the slow retry (by the error policy).
pub(super) async fn infeasible(attempt: &Attempt<'_>) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let message = match &attempt.answer {
        Some(Ok(Err(ExpandError::Infeasible(message)))) => message.clone(),
        _ => String::new(),
    };
    count(attempt, "infeasible");
    let patch = expand::mark_infeasible(&attempt.claim, &message, &status::now());
    status::patch_claim(ctx, &attempt.claim, patch, "claim expansion infeasible").await?;
    let note = format!(
        "{}: infeasible: {message}; retried every {} (--retry-interval-max), at once when the claim asks for another size",
        could_not(attempt),
        humantime::format_duration(ctx.settings.retry.max_delay)
    );
    ctx.events
        .expansion_warning(&attempt.claim, names::REASON_VOLUME_RESIZE_FAILED, note)
        .await;
    Ok(Error::Infeasible {
        claim: attempt.claim_key(),
        message,
    })
}

/// A failed attempt, told as `VolumeResizeFailed`: the module answered failed (or less
/// than asked), a call failed, the module or the class is missing. With `mark`, the
/// claim gets a `ControllerResizeError` condition saying why.
pub(super) async fn failed(attempt: &Attempt<'_>, mark: bool) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let (cause, message) = match (&attempt.answer, &attempt.module, &attempt.class) {
        (Some(Ok(Ok(bytes))), _, _) => (
            "too_small",
            format!(
                "the module answered {bytes} bytes, less than the {} asked for",
                attempt.requested().0
            ),
        ),
        (Some(Ok(Err(ExpandError::Failed(message)))), _, _) => ("failed", message.clone()),
        (Some(answer @ Err(error)), _, _) => (expand_outcome(answer), error.to_string()),
        (_, _, None) => (
            "no_class",
            format!(
                "its class {:?} is gone, so the module cannot be given the class's parameters; recreate the class",
                attempt.class_name()
            ),
        ),
        (_, Lookup::Found(Err(problem)), _) => ("no_module", problem.message.clone()),
        _ => ("failed", String::new()),
    };
    count(attempt, cause);
    if mark {
        let patch = expand::mark_failed(&attempt.claim, &message, &status::now());
        status::patch_claim(ctx, &attempt.claim, patch, "claim expansion failure").await?;
    }
    let note = format!("{}: {message}", could_not(attempt));
    ctx.events
        .expansion_warning(
            &attempt.claim,
            names::REASON_VOLUME_RESIZE_FAILED,
            note.clone(),
        )
        .await;
    Ok(Error::Expand {
        claim: attempt.claim_key(),
        cause,
        message: note,
    })
}
