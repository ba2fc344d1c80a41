//! A claim deleted while its provisioning was unfinished: the backend volume is asked
//! for once more and deleted, so nothing is left behind.

use super::*;
use kube::runtime::reflector::ObjectRef;

/// The claim is being deleted (or is gone: the journal's copy) with its provisioning
/// intent recorded: provisioning may have left a backend volume. Ask the plugin for it
/// again (idempotent by PV name) and delete it; retried until the plugin answers
/// definitively. Never given up on.
pub(super) async fn cleanup(claim: &PersistentVolumeClaim, ctx: &Context) -> Result<Action, Error> {
    let claim_key = ClaimView(claim).key();
    let Some(_hold) = ctx.journal.hold(&key(claim)) else {
        // The provision attempt or the journal's sweep is at it.
        return Ok(Action::requeue(shares::RECHECK));
    };
    let cleanup_error = |message: String| Error::Cleanup {
        claim: claim_key.clone(),
        message,
    };
    let pv_name = volume_name_for(claim);
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let existing = api
        .get_opt(&pv_name)
        .await
        .map_err(|e| Error::api(claim, e))?;
    if existing
        .as_ref()
        .is_some_and(|pv| decide::pv_claim_uid_is(pv, claim))
    {
        // Published: the PV owns the backend volume now (and deletes it, if it is on
        // its way out).
        release_intent(ctx, claim).await?;
        return Ok(Action::await_change());
    }
    // No PV, or a PV of this name that is another claim's (made by hand, or copied):
    // the backend volume the module made for this claim is nobody's; delete it.
    let Some(class) = ClaimView(claim)
        .class_name()
        .and_then(|name| ctx.class(&name))
    else {
        return Err(cleanup_error(
            "its storage class is gone; recreate the class so the plugin can delete the backend volume".into(),
        ));
    };
    let module = resolve_module(ctx, claim, &class)
        .await
        .map_err(|error| match error {
            loading @ Error::ModuleLoading { .. } => loading,
            error => cleanup_error(error.to_string()),
        })?;
    let node = ClaimView(claim)
        .selected_node()
        .and_then(|name| ctx.node(name));
    let request = request::provision_request(claim, &class, node.as_deref().map(|n| &n.metadata))?;

    let gauge = ctx.metrics.in_flight.with_label_values(&["provision"]);
    let _in_flight = InFlight::start(&gauge);
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest provision call (cleanup)", module.provision(&request))
        .await?;
    observe_call(
        ctx,
        &module,
        Call::Provision,
        started,
        provision_outcome(&answer),
    );
    match answer {
        Ok(Ok(volume)) => {
            // Built from the answer unchecked: a volume that could never be published
            // must still be deletable, or the claim would stay Terminating for ever.
            let delete = volume::unpublished_delete_request(&request, &volume);
            let started = Instant::now();
            let answer = ctx
                .leadership
                .fenced("guest delete call (cleanup)", module.delete(&delete))
                .await?;
            observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
            match answer {
                Ok(Ok(())) => {
                    ctx.settings.faults.after(Step::GuestDelete, &claim_key);
                    info!(claim = %claim_key, volume = %pv_name, "claim deleted mid-flight; its backend volume was deleted");
                    release_intent(ctx, claim).await?;
                    Ok(Action::await_change())
                }
                Ok(Err(error)) => Err(cleanup_error(format!("plugin delete failed: {error:?}"))),
                Err(error) => Err(cleanup_error(error.to_string())),
            }
        }
        // Finished with nothing left in the backend.
        Ok(Err(
            ProvisionError::Ignored(_)
            | ProvisionError::Failed(_)
            | ProvisionError::Reschedule(_)
            | ProvisionError::Infeasible(_),
        )) => {
            release_intent(ctx, claim).await?;
            Ok(Action::await_change())
        }
        Ok(Err(ProvisionError::InBackground(message))) => Err(cleanup_error(format!(
            "the plugin is still working in the background: {message}"
        ))),
        Err(error) => Err(cleanup_error(error.to_string())),
    }
}

/// The journal's intents whose claims are gone from the API (deleted while a provision
/// attempt was on the wire, or while no host ran after a crash): each is cleaned up
/// from the journal's copy of the claim, as a deleted claim with our finalizer is.
/// Retried at every sweep until the plugin answers definitively.
pub async fn sweep_journal(ctx: &Context) {
    for (uid, claim) in ctx.journal.unheld_entries() {
        let live = ctx.claims.get(&ObjectRef::from_obj(&claim));
        if live.is_some_and(|live| live.metadata.uid.as_deref() == Some(uid.as_str())) {
            // Its reconciles own it (a claim being deleted goes through `cleanup`).
            continue;
        }
        match cleanup(&claim, ctx).await {
            Ok(_) => {
                info!(claim = %ClaimView(&claim).key(), %uid, "provisioning journal: the claim is gone; its provisioning intent was cleaned up")
            }
            Err(error) => {
                warn!(%error, %uid, "provisioning journal: cleaning up after a gone claim did not finish; retrying")
            }
        }
    }
}
