//! The writes of an expansion: the claim's status (a JSON merge patch of its `status`
//! subresource, built by `wasm_provisioner_rules::expand`) and the PV's capacity, each
//! through the leadership fence.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::error::Error;
use crate::controller::Context;
use wasm_provisioner_rules::names;

/// Now, as a condition's `lastTransitionTime`.
pub(super) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Patches the claim's status with `patch` (`step` names the write for the fence);
/// returns the claim as it now is.
pub(super) async fn patch_claim(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    patch: serde_json::Value,
    step: &'static str,
) -> Result<PersistentVolumeClaim, Error> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    ctx.leadership
        .fenced(
            step,
            api.patch_status(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await?
        .map_err(|source| Error::api(claim, source))
}

/// Sets the PV's `spec.capacity.storage` to `capacity`.
pub(super) async fn save_capacity(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    capacity: &Quantity,
) -> Result<(), Error> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let patch = json!({ "spec": { "capacity": { names::RESOURCE_STORAGE: capacity } } });
    ctx.leadership
        .fenced(
            "PV capacity update",
            api.patch(
                &pv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await?
        .map_err(|source| Error::api(claim, source))?;
    Ok(())
}
