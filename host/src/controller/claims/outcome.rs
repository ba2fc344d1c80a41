//! The steps that end a reconcile once the module answered: each of its answers as the
//! successor library handles it, the PV published, or the volume that could not be
//! published discarded.

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::info;

use super::attempt::Attempt;
use super::decision::{Step, fingerprint};
use super::error::Error;
use super::reschedule::remove_selected_node;
use super::{intent, tell};
use crate::controller::faults::Step as Fault;
use crate::controller::{pool_full, shares};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::ProvisionError;
use wasm_provisioner_runtime::CallError;

/// The error of the call that did not answer: `provision`'s, else `should-provision`'s.
fn call_error(attempt: &mut Attempt<'_>) -> CallError {
    match (attempt.answer.take(), attempt.should_provision.take()) {
        (Some(Err(error)), _) | (None, Some(Err(error))) => error,
        _ => unreachable!("the decision names a failed call only after one"),
    }
}

/// The plugin's message with its refusal.
fn refusal_message(attempt: &Attempt<'_>) -> String {
    match &attempt.answer {
        Some(Ok(Err(
            ProvisionError::Ignored(message)
            | ProvisionError::Failed(message)
            | ProvisionError::InBackground(message)
            | ProvisionError::Reschedule(message)
            | ProvisionError::Infeasible(message),
        ))) => message.clone(),
        _ => String::new(),
    }
}

fn module_name(attempt: &Attempt<'_>) -> String {
    attempt
        .loaded_module()
        .map(|module| module.name().to_string())
        .unwrap_or_default()
}

/// `should-provision` said no.
pub(super) fn declined(attempt: &Attempt<'_>) -> Action {
    info!(claim = %attempt.claim_key(), module = module_name(attempt), "plugin declined the claim (should-provision said no)");
    Action::requeue(attempt.ctx.settings.resync_period)
}

/// A call refused because the module already runs its `maxConcurrentCalls` (claims and
/// volumes together can exceed the claim share): not a failed attempt, no Event; the
/// claim is retried shortly, like a claim waiting for its share. The intent recorded
/// for the call goes (nothing was made).
pub(super) fn busy(attempt: &mut Attempt<'_>, clear_journal: bool) -> Action {
    if clear_journal {
        attempt.ctx.journal.clear(&attempt.key);
    }
    let source = call_error(attempt);
    info!(claim = %attempt.claim_key(), "{source}; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

/// The instance pool was full: a Warning Event; retried soon.
pub(super) async fn pool_full(attempt: &mut Attempt<'_>, clear_journal: bool) -> Action {
    if clear_journal {
        attempt.ctx.journal.clear(&attempt.key);
    }
    let source = call_error(attempt);
    pool_full::claim(&attempt.ctx.events, attempt.claim(), &source).await
}

/// A host-side failure of a guest call (trap, timeout, ...): a failed attempt.
pub(super) async fn call_failed(attempt: &mut Attempt<'_>) -> Error {
    let source = call_error(attempt);
    let class = attempt
        .class()
        .cloned()
        .expect("a call was made for a class");
    let note = tell::failed_note(&class, &source);
    tell::attempt_failed(attempt.ctx, attempt.claim(), &class, note).await;
    Error::Call {
        claim: attempt.claim_key(),
        source,
    }
}

/// "Not mine": no Warning, no retry; nothing was made. The claim is held for a resync
/// period, so only an edit of it (or the resync) asks again.
pub(super) async fn ignored(attempt: &Attempt<'_>) -> Result<Action, Error> {
    let ctx = attempt.ctx;
    let message = refusal_message(attempt);
    info!(claim = %attempt.claim_key(), module = module_name(attempt), %message, "plugin ignored the claim");
    let resync = ctx.settings.resync_period;
    ctx.claim_retries
        .hold(&attempt.key, fingerprint(attempt.claim()), resync);
    intent::release(ctx, attempt.claim()).await?;
    Ok(Action::requeue(resync))
}

/// The provision call failed in the sandbox: the backend may hold a half-made volume,
/// so the intent stays (on the claim), as for in-background.
pub(super) async fn provision_call_failed(attempt: &mut Attempt<'_>) -> Result<Error, Error> {
    intent::keep(attempt.ctx, attempt.claim()).await?;
    Ok(call_failed(attempt).await)
}

/// The plugin answered failed, in-background, reschedule or infeasible: a failed
/// attempt; the intent stays only while the backend may still be working.
pub(super) async fn refused(attempt: &Attempt<'_>, step: Step) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let claim = attempt.claim();
    let class = attempt
        .class()
        .cloned()
        .expect("a call was made for a class");
    let message = refusal_message(attempt);
    let note = tell::failed_note(&class, &message);
    tell::attempt_failed(ctx, claim, &class, note).await;
    let (module, claim_key) = (module_name(attempt), attempt.claim_key());
    let outcome = match step {
        Step::InBackground => {
            intent::keep(ctx, claim).await?;
            "in_background"
        }
        Step::ModuleReschedules => {
            intent::release(ctx, claim).await?;
            remove_selected_node(ctx, claim).await?;
            "reschedule"
        }
        Step::Infeasible => {
            intent::release(ctx, claim).await?;
            return Ok(Error::Infeasible {
                claim: claim_key,
                module,
                message,
                class_version: class.resource_version().unwrap_or_default(),
            });
        }
        _ => {
            intent::release(ctx, claim).await?;
            "failed"
        }
    };
    Ok(Error::Outcome {
        claim: claim_key,
        module,
        outcome,
        message,
    })
}

/// The PV is saved: metrics, Events. The PV holds the backend volume from here on: the
/// journal entry goes (with the journal's next write, not waited for). A finalizer of
/// an earlier attempt stays until the binder has bound the claim to this PV (the
/// claim's next reconcile): removed now, it would race the binder's update of the claim
/// and make it sync the Pending claim once more; a claim deleted meanwhile only loses
/// the finalizer (its cleanup).
pub(super) async fn published(attempt: &Attempt<'_>) -> Action {
    let ctx = attempt.ctx;
    let claim = attempt.claim();
    let claim_key = attempt.claim_key();
    ctx.settings.faults.after(Fault::PvCreate, &claim_key);
    let class = attempt.class().cloned().expect("a PV was made for a class");
    let pv_name = attempt
        .pv
        .as_ref()
        .map(|pv| pv.name_any())
        .unwrap_or_default();
    let labels = tell::metric_labels(claim, &class);
    let labels = [labels[0].as_str(), labels[1].as_str()];
    ctx.metrics.provision_total.with_label_values(&labels).inc();
    if let Some(started) = attempt.started {
        ctx.metrics
            .provision_duration
            .with_label_values(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
    if let Some(created) = &claim.metadata.creation_timestamp {
        let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
        ctx.metrics
            .claim_to_volume
            .with_label_values(&[labels[0]])
            .observe(waited.as_secs_f64().max(0.0));
    }
    info!(claim = %claim_key, volume = pv_name, module = module_name(attempt), "provisioned");
    ctx.events
        .claim_normal(
            claim,
            names::REASON_PROVISIONING_SUCCEEDED,
            format!("Successfully provisioned volume {pv_name}"),
        )
        .await;
    ctx.journal.clear(&attempt.key);
    ctx.claim_retries.forget(&attempt.key);
    Action::requeue(ctx.settings.resync_period)
}

/// A PV of this name exists but is not this claim's live volume (one on its way out):
/// that PV's deletion owns the backend volume of the same name.
pub(super) async fn save_conflict(attempt: &Attempt<'_>) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let message = attempt.unpublished_because.clone().unwrap_or_default();
    let class = attempt.class().cloned().expect("a PV was made for a class");
    intent::keep(ctx, attempt.claim()).await?;
    tell::attempt_failed(ctx, attempt.claim(), &class, message.clone()).await;
    Ok(Error::PvConflict {
        claim: attempt.claim_key(),
        message,
    })
}

/// The volume that could not be published was deleted: provisioning is retried with
/// back-off.
pub(super) async fn discarded(attempt: &Attempt<'_>) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let claim_key = attempt.claim_key();
    let message = attempt.unpublished_because.clone().unwrap_or_default();
    ctx.settings.faults.after(Fault::GuestDelete, &claim_key);
    ctx.events
        .claim_warning(
            attempt.claim(),
            names::REASON_PROVISIONING_FAILED,
            format!("{message}; the backend volume was deleted and provisioning will be retried"),
        )
        .await;
    intent::release(ctx, attempt.claim()).await?;
    Ok(Error::Unpublished {
        cleaned_up: true,
        claim: claim_key,
        message,
    })
}

/// Deleting the volume that could not be published failed too: the intent moves onto
/// the claim as its finalizer (the volume exists), and the cleanup is retried.
pub(super) async fn discard_failed(attempt: &Attempt<'_>) -> Result<Error, Error> {
    let ctx = attempt.ctx;
    let message = attempt.unpublished_because.clone().unwrap_or_default();
    let cause = match &attempt.deleted {
        Some(Ok(Err(error))) => format!("{error:?}"),
        Some(Err(error)) => error.to_string(),
        _ => String::new(),
    };
    let volume = attempt
        .delete_request
        .as_ref()
        .map(|delete| delete.volume.name.clone())
        .unwrap_or_default();
    intent::keep(ctx, attempt.claim()).await?;
    ctx.events
        .claim_warning(
            attempt.claim(),
            names::REASON_PROVISIONING_CLEANUP_FAILED,
            format!(
                "{message}; deleting the backend volume {volume} failed too: {cause}. It will be retried while the claim exists; if you delete the claim, please delete the volume manually"
            ),
        )
        .await;
    Ok(Error::Unpublished {
        cleaned_up: false,
        claim: attempt.claim_key(),
        message: format!("{message}; cleanup failed: {cause}"),
    })
}
