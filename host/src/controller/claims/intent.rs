//! The intent to provision a claim, persisted before its module is first asked: in the
//! provisioning journal ([`crate::controller::journal`], no claim write), or on the claim
//! as our finalizer once an attempt ends with something possibly left in the backend
//! that no PV owns. It goes only once the claim's PV exists or nothing is left.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::error::Error;
use super::finalizer;
use super::key::key;
use crate::controller::Context;
use crate::controller::faults::Step;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;

/// Provisioning of `claim` is over with nothing in the backend that no PV owns: its
/// intent goes, from the journal and from the claim. `claim` must be as fresh as the
/// last write of ours to it.
pub(super) async fn release(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    ctx.leadership.check("provisioning intent release")?;
    ctx.journal.clear(&key(claim));
    if ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        finalizer::remove(ctx, claim).await?;
    }
    Ok(())
}

/// The attempt ended with something possibly left in the backend that no PV owns (the
/// module works in the background, a call trapped, the PV could not be saved): the
/// intent moves onto the claim as our finalizer, visible and kept while the claim is
/// retried. A claim gone meanwhile keeps its journal entry, which the sweep cleans up.
pub(super) async fn keep(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    if ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        return Ok(());
    }
    if finalizer::add(ctx, claim).await?.is_some() {
        ctx.settings
            .faults
            .after(Step::FinalizerAdd, &ClaimView(claim).key());
        ctx.journal.clear(&key(claim));
    }
    Ok(())
}
