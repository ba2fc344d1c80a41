//! Telling a failed provision attempt: the failed-provision counter
//! (`controller_persistentvolumeclaim_provision_failed_total`) and a ProvisioningFailed
//! Warning Event on the claim.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use crate::controller::Context;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;

/// The `class` and `source` labels of the provisioning metrics.
pub(super) fn metric_labels(claim: &PersistentVolumeClaim, class: &StorageClass) -> [String; 2] {
    [
        class.name_any(),
        ClaimView(claim)
            .data_source_kind()
            .unwrap_or_default()
            .to_string(),
    ]
}

/// Counts one failed provision attempt.
pub(super) fn failed_metric(ctx: &Context, claim: &PersistentVolumeClaim, class: &StorageClass) {
    let labels = metric_labels(claim, class);
    ctx.metrics
        .provision_failed_total
        .with_label_values(&[labels[0].as_str(), labels[1].as_str()])
        .inc();
}

/// One failed provision attempt: counted, and told on the claim as ProvisioningFailed.
pub(super) async fn attempt_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    note: String,
) {
    failed_metric(ctx, claim, class);
    ctx.events
        .claim_warning(claim, names::REASON_PROVISIONING_FAILED, note)
        .await;
}

/// The note of a failed attempt: the class and why.
pub(super) fn failed_note(class: &StorageClass, why: impl std::fmt::Display) -> String {
    format!(
        "failed to provision volume with StorageClass {:?}: {why}",
        class.name_any()
    )
}
