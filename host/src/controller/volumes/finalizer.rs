//! The HonorPVReclaimPolicy finalizer (`external-provisioner.volume.kubernetes.io/
//! finalizer`) on our PVs: removed only once the backend volume is deleted.

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;

use super::error::Error;
use crate::controller::{Context, finalizers};
use wasm_provisioner_rules::names;

/// Adds or removes the protection finalizer without overwriting others' finalizers.
pub(super) async fn edit(ctx: &Context, pv: &PersistentVolume, add: bool) -> Result<(), Error> {
    ctx.leadership.check("PV finalizer edit")?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    finalizers::set(&api, pv, names::FINALIZER_PV_PROTECTION, add, None)
        .await
        .map_err(|e| Error::api(pv, e))?;
    Ok(())
}
