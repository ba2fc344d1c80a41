//! How the volume controller names a PV: its queue key, and its class label.

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;

/// The queue key: the PV's UID.
pub(in crate::controller) fn key(pv: &PersistentVolume) -> String {
    pv.metadata.uid.clone().unwrap_or_else(|| pv.name_any())
}

/// The PV's class: the `class` label of the delete metrics, and where the module is
/// looked up when the PV does not record it.
pub(super) fn class_label(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}
