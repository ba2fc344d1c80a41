//! Every wire string the host reads or writes, named once.
//!
//! Annotation keys, finalizers, Event reasons and metric names are part of the
//! interface users see: dashboards, alerts, `kubectl` habits and other controllers
//! depend on them. The upstream ones are copied exactly from
//! sig-storage-lib-external-provisioner and Kubernetes; the `wasm-provisioner.dev/`
//! ones are this project's own. Nothing else in the crate spells these strings.

// --- Upstream annotations -------------------------------------------------------

/// PV annotation naming the provisioner that made it; set on every PV we create and
/// checked before we delete the backend volume.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Claim annotation naming the provisioner that should act, set by the PV binder in
/// kube-controller-manager (GA key).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// Legacy (beta) key of [`ANN_STORAGE_PROVISIONER`]; read when the GA key is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

/// Claim annotation naming the node the scheduler picked for a WaitForFirstConsumer
/// claim (GA key).
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Legacy (alpha) key of [`ANN_SELECTED_NODE`]; read when the GA key is absent.
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";

/// Legacy claim annotation naming its StorageClass; wins over `spec.storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

// --- Finalizers -----------------------------------------------------------------

/// PV finalizer of HonorPVReclaimPolicy: keeps a PV with reclaim policy Delete until
/// its backend volume is deleted, even if the PV object is deleted first.
pub const FINALIZER_PV_PROTECTION: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Claim finalizer of our own: set on a claim before the plugin is first asked to
/// provision, removed once the claim's PV exists (the PV then owns the backend volume)
/// or once nothing was left in the backend. While it is on a claim, the claim cannot
/// vanish with a backend volume half-made, so no backend volume is ever orphaned — the
/// in-memory "claims in progress" of the upstream library survive a restart this way.
pub const FINALIZER_CLAIM_PROVISIONING: &str = "wasm-provisioner.dev/provisioning";

// --- Our own annotations --------------------------------------------------------

/// The domain of our own labels, annotations and finalizers. Plugins may not set keys
/// in it.
pub const OWN_DOMAIN: &str = "wasm-provisioner.dev";

/// PV annotation: the module (the class's `module` parameter) that made the volume.
pub const ANN_MODULE: &str = "wasm-provisioner.dev/module";

/// PV annotation: the sha256 (lower-case hex) of the module version that made the
/// volume, so an admin can tell which code owns a backend volume.
pub const ANN_MODULE_SHA256: &str = "wasm-provisioner.dev/module-sha256";

/// PV annotation: `namespace/name` of the Secret the volume was provisioned with (its
/// reference, never its value), so `delete` and `expand` get the same Secret even when
/// the class is gone.
pub const ANN_SECRET: &str = "wasm-provisioner.dev/secret";

/// On a PV made in node-local mode: the node whose instance made the volume, so its
/// delete and expansion go to that node (written by the host, never inferred).
pub const ANN_NODE: &str = "wasm-provisioner.dev/node";

// --- StorageClass parameters reserved by the host --------------------------------

/// Class parameter naming the plugin module that serves the class. Never passed to the
/// plugin.
pub const PARAM_MODULE: &str = "module";

/// Class parameter pinning the module's sha256 (hex). Never passed to the plugin.
pub const PARAM_MODULE_SHA256: &str = "moduleSHA256";

/// Class parameter naming the Secret a module receives (a name, or a template with
/// `${pvc.name}`, `${pvc.namespace}`, `${pv.name}`); bounded by the module's grants.
/// Never passed to the plugin as a parameter.
pub const PARAM_SECRET_NAME: &str = "secretName";

/// Class parameter naming the namespace of that Secret (a name or a template).
pub const PARAM_SECRET_NAMESPACE: &str = "secretNamespace";

/// Every class parameter the host keeps for itself.
pub const RESERVED_PARAMETERS: [&str; 4] = [
    PARAM_MODULE,
    PARAM_MODULE_SHA256,
    PARAM_SECRET_NAME,
    PARAM_SECRET_NAMESPACE,
];

// --- Names and defaults ---------------------------------------------------------

/// The provisioner name a StorageClass's `provisioner` field uses when the admin does
/// not choose another.
pub const DEFAULT_PROVISIONER_NAME: &str = "wasm-provisioner.dev";

/// Prefix of every PV name: a PV is named `pvc-<claim uid>`.
pub const PV_NAME_PREFIX: &str = "pvc-";

/// The resource name of storage in requests, limits and capacity.
pub const RESOURCE_STORAGE: &str = "storage";

// --- Kubernetes enum values (as on the wire) -------------------------------------

pub const ACCESS_MODE_READ_WRITE_ONCE: &str = "ReadWriteOnce";
pub const ACCESS_MODE_READ_ONLY_MANY: &str = "ReadOnlyMany";
pub const ACCESS_MODE_READ_WRITE_MANY: &str = "ReadWriteMany";
pub const ACCESS_MODE_READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";

pub const VOLUME_MODE_FILESYSTEM: &str = "Filesystem";
pub const VOLUME_MODE_BLOCK: &str = "Block";

pub const RECLAIM_DELETE: &str = "Delete";
pub const RECLAIM_RETAIN: &str = "Retain";
pub const RECLAIM_RECYCLE: &str = "Recycle";

pub const BINDING_IMMEDIATE: &str = "Immediate";
pub const BINDING_WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

pub const PHASE_PENDING: &str = "Pending";
pub const PHASE_AVAILABLE: &str = "Available";
pub const PHASE_BOUND: &str = "Bound";
pub const PHASE_RELEASED: &str = "Released";
pub const PHASE_FAILED: &str = "Failed";

/// `kind` and `apiVersion` of a claim, for a PV's `claimRef`.
pub const KIND_CLAIM: &str = "PersistentVolumeClaim";
pub const API_VERSION_CORE_V1: &str = "v1";

// --- Event reasons --------------------------------------------------------------

/// Normal, on the claim: the plugin is being asked to provision.
pub const REASON_PROVISIONING: &str = "Provisioning";
/// Warning, on the claim: provisioning failed (or cannot start); retried.
pub const REASON_PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// Normal, on the claim: the PV was created.
pub const REASON_PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// Warning, on the claim: a backend volume whose PV could not be saved could not be
/// deleted either; "please delete manually".
pub const REASON_PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// Warning, on the PV: the backend volume could not be deleted; retried.
pub const REASON_VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
/// Normal, on the claim: the plugin said the selected node cannot host the volume; the
/// selected-node annotation was removed so the scheduler picks again. (Our own.)
pub const REASON_RESCHEDULING: &str = "Rescheduling";
/// Warning, on the claim: the retry threshold was reached and the host stopped trying;
/// a change to the claim or class starts over. (Our own: upstream gives up silently.)
pub const REASON_PROVISIONING_GAVE_UP: &str = "ProvisioningGaveUp";
/// Normal, on the PV: the backend volume was deleted. (Our own.)
pub const REASON_VOLUME_DELETED: &str = "VolumeDeleted";
/// Warning, on the PV: the retry threshold for deleting was reached. (Our own.)
pub const REASON_VOLUME_DELETE_GAVE_UP: &str = "VolumeDeleteGaveUp";
/// Normal, on the PV, once per volume and host process: the plugin answered
/// `in-background` (a large volume deleted in chunks); the host keeps asking. (Our own.)
pub const REASON_VOLUME_DELETING: &str = "VolumeDeleting";
/// Warning, on the StorageClass: its module's `validate-class` rejected it (the note
/// is the module's message); its claims fail at once without `provision`. (Our own.)
pub const REASON_CLASS_REJECTED: &str = "ClassRejected";
/// Warning, on the StorageClass: its module's `validate-class` call failed (trapped,
/// timed out); its claims fail at once, saying so. (Our own.)
pub const REASON_CLASS_VALIDATION_FAILED: &str = "ClassValidationFailed";
/// Warning, on the StorageClass: a new version of its module rejects the class (or
/// fails to validate it) although the version in service accepts it, so the new
/// version was held back and the old one keeps serving. (Our own.)
pub const REASON_MODULE_VERSION_HELD_BACK: &str = "ModuleVersionHeldBack";

/// Normal, on the claim: the module is being asked to expand the claim's volume (as
/// kubernetes-csi/external-resizer's `Resizing`).
pub const REASON_RESIZING: &str = "Resizing";
/// Normal, on the claim: the volume was expanded and the claim's capacity updated.
pub const REASON_VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
/// Warning, on the claim: the volume could not be expanded (the module's message, a
/// module that cannot expand, a shrink); retried as the answer says.
pub const REASON_VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
/// Node-local mode: the Node a volume was made on was deleted (Warning, on the PV).
pub const REASON_NODE_GONE: &str = "NodeGone";
/// Node-local mode, policy `remove`: the PV of a gone node removed without cleaning its
/// backend volume (Warning, on the PV).
pub const REASON_VOLUME_ABANDONED: &str = "VolumeAbandoned";

/// Namespace of Events about cluster-scoped objects (PVs).
pub const EVENT_NAMESPACE_CLUSTER_SCOPED: &str = "default";

// --- Claim expansion status (as kube-controller-manager and external-resizer) -----

/// Claim condition: the controller is expanding the volume.
pub const CONDITION_RESIZING: &str = "Resizing";
/// Claim condition: the volume waits for its file system to be grown on a node.
pub const CONDITION_FILE_SYSTEM_RESIZE_PENDING: &str = "FileSystemResizePending";
/// Claim condition: the controller's expansion failed (its message says why).
pub const CONDITION_CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
/// Claim condition: the node's expansion failed.
pub const CONDITION_NODE_RESIZE_ERROR: &str = "NodeResizeError";
/// Every claim condition an expansion sets or clears.
pub const RESIZE_CONDITIONS: [&str; 4] = [
    CONDITION_RESIZING,
    CONDITION_FILE_SYSTEM_RESIZE_PENDING,
    CONDITION_CONTROLLER_RESIZE_ERROR,
    CONDITION_NODE_RESIZE_ERROR,
];
/// `status.allocatedResourceStatuses.storage`: the controller is expanding.
pub const RESIZE_STATUS_CONTROLLER_IN_PROGRESS: &str = "ControllerResizeInProgress";
/// `status.allocatedResourceStatuses.storage`: the controller's expansion cannot succeed
/// as asked.
pub const RESIZE_STATUS_CONTROLLER_INFEASIBLE: &str = "ControllerResizeInfeasible";

// --- Metrics --------------------------------------------------------------------

pub const METRIC_PROVISION_TOTAL: &str = "controller_persistentvolumeclaim_provision_total";
pub const METRIC_PROVISION_FAILED_TOTAL: &str =
    "controller_persistentvolumeclaim_provision_failed_total";
pub const METRIC_PROVISION_DURATION_SECONDS: &str =
    "controller_persistentvolumeclaim_provision_duration_seconds";
pub const METRIC_DELETE_TOTAL: &str = "controller_persistentvolume_delete_total";
pub const METRIC_DELETE_FAILED_TOTAL: &str = "controller_persistentvolume_delete_failed_total";
pub const METRIC_DELETE_DURATION_SECONDS: &str =
    "controller_persistentvolume_delete_duration_seconds";

/// Metric label: the StorageClass name.
pub const METRIC_LABEL_CLASS: &str = "class";
/// Metric label of provision metrics: the data source kind ("" for none).
pub const METRIC_LABEL_SOURCE: &str = "source";

/// Go's `prometheus.DefBuckets`, in seconds, used by the duration histograms.
pub const METRIC_DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream wire strings, spelled out once more so a typo in a constant fails.
    #[test]
    fn upstream_wire_strings_are_exact() {
        assert_eq!(ANN_PROVISIONED_BY, "pv.kubernetes.io/provisioned-by");
        assert_eq!(
            ANN_STORAGE_PROVISIONER,
            "volume.kubernetes.io/storage-provisioner"
        );
        assert_eq!(
            ANN_BETA_STORAGE_PROVISIONER,
            "volume.beta.kubernetes.io/storage-provisioner"
        );
        assert_eq!(ANN_SELECTED_NODE, "volume.kubernetes.io/selected-node");
        assert_eq!(
            ANN_ALPHA_SELECTED_NODE,
            "volume.alpha.kubernetes.io/selected-node"
        );
        assert_eq!(
            ANN_BETA_STORAGE_CLASS,
            "volume.beta.kubernetes.io/storage-class"
        );
        assert_eq!(
            FINALIZER_PV_PROTECTION,
            "external-provisioner.volume.kubernetes.io/finalizer"
        );
        assert_eq!(REASON_PROVISIONING, "Provisioning");
        assert_eq!(REASON_PROVISIONING_FAILED, "ProvisioningFailed");
        assert_eq!(REASON_PROVISIONING_SUCCEEDED, "ProvisioningSucceeded");
        assert_eq!(
            REASON_PROVISIONING_CLEANUP_FAILED,
            "ProvisioningCleanupFailed"
        );
        assert_eq!(REASON_VOLUME_FAILED_DELETE, "VolumeFailedDelete");
        assert_eq!(REASON_RESIZING, "Resizing");
        assert_eq!(REASON_VOLUME_RESIZE_SUCCESSFUL, "VolumeResizeSuccessful");
        assert_eq!(REASON_VOLUME_RESIZE_FAILED, "VolumeResizeFailed");
        assert_eq!(CONDITION_RESIZING, "Resizing");
        assert_eq!(CONDITION_CONTROLLER_RESIZE_ERROR, "ControllerResizeError");
        assert_eq!(
            RESIZE_STATUS_CONTROLLER_IN_PROGRESS,
            "ControllerResizeInProgress"
        );
        assert_eq!(
            RESIZE_STATUS_CONTROLLER_INFEASIBLE,
            "ControllerResizeInfeasible"
        );
    }

    #[test]
    fn metric_names_share_the_upstream_prefixes() {
        for name in [
            METRIC_PROVISION_TOTAL,
            METRIC_PROVISION_FAILED_TOTAL,
            METRIC_PROVISION_DURATION_SECONDS,
        ] {
            assert!(name.starts_with("controller_persistentvolumeclaim_provision_"));
        }
        for name in [
            METRIC_DELETE_TOTAL,
            METRIC_DELETE_FAILED_TOTAL,
            METRIC_DELETE_DURATION_SECONDS,
        ] {
            assert!(name.starts_with("controller_persistentvolume_delete_"));
        }
    }

    #[test]
    fn our_own_keys_live_in_our_domain() {
        for key in [FINALIZER_CLAIM_PROVISIONING, ANN_MODULE, ANN_MODULE_SHA256] {
            assert_eq!(key.split('/').next(), Some(OWN_DOMAIN), "{key}");
        }
    }
}
