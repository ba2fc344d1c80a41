//! The claim's provisioning finalizer (`wasm-provisioner.dev/provisioning`): the intent
//! to provision, kept on the claim while something may be left in the backend that no
//! PV owns.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};

use super::error::Error;
use super::key::key;
use crate::controller::Context;
use crate::controller::faults::Step;
use crate::controller::finalizers::{self, Edited};
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;

/// Adds or removes our finalizer; returns the claim as it now is, `None` when it is
/// gone (or replaced under its name, or, when adding, being deleted).
async fn set(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    add: bool,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    // Removing it lets the claim go with whatever the backend holds: only a leader may.
    if !add {
        ctx.leadership.check("claim finalizer removal")?;
        // Removed already, by this process: the cache has not caught up.
        if ctx.recent.was_released(&key(claim)) {
            return Ok(Some(claim.clone()));
        }
    }
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    // A claim provisioned before the binder announced it (`--provision-before-binder`)
    // gets the announcement with the finalizer: the claim then says whose it is, so
    // deleting it finds its way back here whatever becomes of its class.
    let announce = ClaimView(claim).provisioner().is_none().then_some((
        names::ANN_STORAGE_PROVISIONER,
        ctx.settings.provisioner_name.as_str(),
    ));
    match finalizers::set(
        &api,
        claim,
        names::FINALIZER_CLAIM_PROVISIONING,
        add,
        announce,
    )
    .await
    .map_err(|e| Error::api(claim, e))?
    {
        Edited::Done(claim) => {
            ctx.recent.set_released(&key(&claim), !add);
            if !add {
                let key = ClaimView(&claim).key();
                ctx.settings.faults.after(Step::FinalizerRemove, &key);
            }
            Ok(Some(claim))
        }
        Edited::Gone => Ok(None),
    }
}

/// Adds our finalizer; returns the claim as it now is, or `None` when it is gone or
/// being deleted (then nothing may be provisioned for it).
pub(super) async fn add(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    set(ctx, claim, true).await
}

/// Removes our finalizer. `claim` must be as fresh as the last write of ours to it (a
/// stale copy without the finalizer would make this a no-op).
pub(super) async fn remove(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    set(ctx, claim, false).await.map(drop)
}
