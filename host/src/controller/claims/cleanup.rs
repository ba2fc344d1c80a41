//! A claim deleted while its provisioning was unfinished, or gone from the API with its
//! intent in the journal: the module is asked for the volume once more (idempotent by PV
//! name) and it is deleted, so nothing is left behind. Retried until the module answers
//! definitively; never given up on.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::attempt::Attempt;
use super::decision::{JournalHold, Lookup};
use super::error::Error;
use super::finish::module_unavailable;
use super::intent;
use super::key::volume_name_for;
use super::reconcile::settle;
use crate::controller::Context;
use crate::controller::calls::{InFlight, delete_outcome, fenced_provision, observe_call};
use crate::controller::faults::Step as Fault;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::types::ProvisionError;
use wasm_provisioner_rules::{decide, names, request, volume};
use wasm_provisioner_runtime::Call;

/// Takes the claim's journal entry, so the sweep (or the provision attempt) is not at
/// it at the same time.
pub(super) fn hold_journal(attempt: &mut Attempt<'_>) {
    attempt.journal_hold = attempt.ctx.journal.hold(&attempt.key);
    attempt.journal = if attempt.journal_hold.is_some() {
        JournalHold::Taken
    } else {
        JournalHold::Refused
    };
}

/// Reads the claim's PV from the API: is it this claim's (live or on its way out)?
pub(super) async fn read_volume(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let claim = attempt.claim();
    let existing = Api::<PersistentVolume>::all(attempt.ctx.client.clone())
        .get_opt(&volume_name_for(claim))
        .await
        .map_err(|e| Error::api(claim, e))?;
    attempt.live_volume = match existing {
        Some(pv) => Lookup::Found(decide::pv_claim_uid_is(&pv, claim)),
        None => Lookup::Missing,
    };
    Ok(())
}

/// Asks the module for the claim's volume once more.
pub(super) async fn ask_again(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let (Some(class), Some(module)) = (attempt.class().cloned(), attempt.loaded_module().cloned())
    else {
        unreachable!("the decision asks again only with a class and its module");
    };
    let node = ClaimView(attempt.claim())
        .selected_node()
        .and_then(|name| ctx.node(name));
    let mut request = request::provision_request(
        attempt.claim(),
        &class,
        node.as_deref().map(|n| &n.metadata),
    )?;
    request.context = ctx
        .backends
        .context(ClaimView(attempt.claim()).selected_node());
    attempt.in_flight = Some(InFlight::start(ctx, "provision"));
    let (_, answer) =
        fenced_provision(ctx, &module, &request, "guest provision call (cleanup)").await?;
    attempt.request = Some(request);
    attempt.answer = Some(answer);
    Ok(())
}

/// Deletes the volume the module answered, built from its answer unchecked: a volume
/// that could never be published must still be deletable, or the claim would stay
/// Terminating for ever.
pub(super) async fn delete_again(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let (Some(request), Some(Ok(Ok(volume))), Some(module)) = (
        &attempt.request,
        &attempt.answer,
        attempt.loaded_module().cloned(),
    ) else {
        unreachable!("the decision deletes only a volume the module answered");
    };
    let delete = volume::unpublished_delete_request(request, volume);
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced(
            "guest delete call (cleanup)",
            ctx.backends.delete(&module, &delete),
        )
        .await?;
    observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
    attempt.delete_request = Some(delete);
    attempt.deleted = Some(answer);
    Ok(())
}

fn cleanup_error(attempt: &Attempt<'_>, message: String) -> Error {
    Error::Cleanup {
        claim: attempt.claim_key(),
        message,
    }
}

/// The claim's PV exists and owns the backend volume now (and deletes it, if it is on
/// its way out); or the backend is clean. The intent goes.
pub(super) async fn done(attempt: &Attempt<'_>) -> Result<Action, Error> {
    intent::release(attempt.ctx, attempt.claim()).await?;
    Ok(Action::await_change())
}

/// The module's volume was deleted.
pub(super) async fn cleaned_up(attempt: &Attempt<'_>) -> Result<Action, Error> {
    let claim_key = attempt.claim_key();
    attempt
        .ctx
        .settings
        .faults
        .after(Fault::GuestDelete, &claim_key);
    let volume = volume_name_for(attempt.claim());
    info!(claim = %claim_key, %volume, "claim deleted mid-flight; its backend volume was deleted");
    done(attempt).await
}

/// The class is gone, so the module cannot be asked: the claim is held. A claim still
/// in the API is told why, and what to do, in a Warning Event (repeats aggregate into
/// one series); without it only the host's log said so.
pub(super) async fn class_gone(attempt: &Attempt<'_>, tell: bool) -> Error {
    if tell {
        let class = ClaimView(attempt.claim()).class_name().unwrap_or_default();
        let note = format!(
            "the claim is being deleted while its provisioning is unfinished (its module may have made a volume), but its storage class {class:?} is gone, so the module cannot be asked to delete that volume and the claim is kept (finalizer {}); recreate the class (the same name and module) and the claim goes once the volume is deleted, or delete the backend volume manually and then remove the finalizer",
            names::FINALIZER_CLAIM_PROVISIONING
        );
        attempt
            .ctx
            .events
            .claim_warning(
                attempt.claim(),
                names::REASON_PROVISIONING_CLEANUP_FAILED,
                note,
            )
            .await;
    }
    cleanup_error(
        attempt,
        "its storage class is gone; recreate the class so the plugin can delete the backend volume"
            .into(),
    )
}

/// No module to ask: told as when provisioning, and retried.
pub(super) async fn module_missing(attempt: &Attempt<'_>) -> Error {
    let error = module_unavailable(attempt).await;
    cleanup_error(attempt, error.to_string())
}

/// The module still works in the background: asked again later.
pub(super) fn still_in_background(attempt: &Attempt<'_>) -> Error {
    let message = match &attempt.answer {
        Some(Ok(Err(ProvisionError::InBackground(message)))) => message.as_str(),
        _ => "",
    };
    cleanup_error(
        attempt,
        format!("the plugin is still working in the background: {message}"),
    )
}

/// A call, or the delete, failed: retried.
pub(super) fn failed(attempt: &Attempt<'_>) -> Error {
    let message = match (&attempt.deleted, &attempt.answer) {
        (Some(Ok(Err(error))), _) => format!("plugin delete failed: {error:?}"),
        (Some(Err(error)), _) | (None, Some(Err(error))) => error.to_string(),
        _ => String::new(),
    };
    cleanup_error(attempt, message)
}

/// The journal's intents whose claims are gone from the API (deleted while a provision
/// attempt was on the wire, or while no host ran after a crash): each is cleaned up
/// from the journal's copy of the claim, as a deleted claim with our finalizer is.
/// Retried at every sweep until the plugin answers definitively.
pub async fn sweep_journal(ctx: &Context) {
    for (uid, claim) in ctx.journal.unheld_entries() {
        let live = ctx.claims.get(&ObjectRef::from_obj(&claim));
        if live.is_some_and(|live| live.metadata.uid.as_deref() == Some(uid.as_str())) {
            // Its reconciles own it (a claim being deleted goes through the cleanup).
            continue;
        }
        let claim_key = ClaimView(&claim).key();
        let mut attempt = Attempt::observe(ctx, Arc::new(claim), true);
        match settle(&mut attempt).await {
            Ok(_) => {
                info!(claim = %claim_key, %uid, "provisioning journal: the claim is gone; its provisioning intent was cleaned up")
            }
            Err(error) => {
                warn!(%error, %uid, "provisioning journal: cleaning up after a gone claim did not finish; retrying")
            }
        }
    }
}
