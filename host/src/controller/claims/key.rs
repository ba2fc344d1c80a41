//! How the claim controller names a claim: its queue key, and its PV's name.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use wasm_provisioner_rules::claim::ClaimView;

/// The queue key: the claim's UID, so a claim recreated under the same name starts over.
pub(in crate::controller) fn key(claim: &PersistentVolumeClaim) -> String {
    claim
        .metadata
        .uid
        .clone()
        .unwrap_or_else(|| ClaimView(claim).key())
}

/// The PV name of a claim: `pvc-<uid>`.
pub(super) fn volume_name_for(claim: &PersistentVolumeClaim) -> String {
    ClaimView(claim).volume_name().unwrap_or_default()
}
