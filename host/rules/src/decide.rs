//! The provisioning controller's decisions, as plain functions over Kubernetes objects.
//!
//! Whether to provision a claim, whether to delete a released volume's backend, whether
//! a PV needs the HonorPVReclaimPolicy finalizer, and whether a PV found under a claim's
//! deterministic name really is that claim's. The rules are upstream's
//! (sig-storage-lib-external-provisioner), with the #1469 fix: an existing PV only
//! counts as "done" when its claimRef UID is the claim's and it is not being deleted.
//! The plugin's own `should-provision` / `should-delete` vetoes are asked by the
//! controller after these say yes: they cost a sandbox call.
//!
//! Every "no" carries a reason, and each reason says what the controller does about it
//! ([`SkipProvision::event_reason`], [`SkipProvision::retry`]): most are silent (not
//! ours, already bound, waiting for the scheduler), a few are a Warning Event on the
//! claim because only a person can fix them.

use std::fmt;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::claim::ClaimView;
use crate::names;
use crate::object::has_finalizer;
use crate::types::PluginInfo;

/// Whether to provision a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvisionDecision {
    /// Every rule holds: ask the plugin (`should-provision`, then `provision`).
    Provision,
    /// Do not provision, for this reason.
    Skip(SkipProvision),
}

/// Why a claim is not provisioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipProvision {
    /// `spec.volumeName` is set: the claim is bound or being bound.
    AlreadyBound { volume_name: String },
    /// The claim's storage-provisioner annotation (GA, else beta) names another
    /// provisioner, or is absent.
    NotOurs { provisioner: Option<String> },
    /// The claim is being deleted; no new provisioning starts. (Work already started,
    /// marked by our claim finalizer, is finished by the controller's cleanup path.)
    ClaimDeleting,
    /// The claim is ours but its StorageClass does not exist (yet).
    ClassMissing { class: Option<String> },
    /// The class's `provisioner` is not one of ours: it changed after the binder
    /// annotated the claim, or the annotation disagrees with the class.
    ClassNotOurs { class: String, provisioner: String },
    /// WaitForFirstConsumer class and no node selected yet: the scheduler will set
    /// `volume.kubernetes.io/selected-node` once a pod uses the claim.
    WaitingForNode { class: String },
    /// The claim asks for a raw block volume and the plugin cannot make one.
    BlockUnsupported { plugin: String },
    /// The claim has a data source of a kind the plugin cannot populate from.
    DataSourceUnsupported { kind: String, plugin: String },
    /// The claim's `dataSourceRef` names another namespace (CrossNamespaceVolumeDataSource).
    /// Only a ReferenceGrant in that namespace may allow it, and this host does not read
    /// ReferenceGrants: refused, so no tenant has another namespace's volume copied.
    CrossNamespaceDataSource {
        kind: String,
        namespace: String,
        name: String,
    },
}

impl SkipProvision {
    /// The Warning Event reason to record on the claim, if this deserves one: only for
    /// claims that are ours and stuck on something a person must fix.
    pub fn event_reason(&self) -> Option<&'static str> {
        match self {
            Self::ClassMissing { .. }
            | Self::BlockUnsupported { .. }
            | Self::DataSourceUnsupported { .. }
            | Self::CrossNamespaceDataSource { .. } => Some(names::REASON_PROVISIONING_FAILED),
            _ => None,
        }
    }

    /// Whether to retry with back-off. A missing class is retried (it may be created
    /// shortly after the claim); the other reasons wait for a change to the claim,
    /// class or plugin, which the watches deliver.
    pub fn retry(&self) -> bool {
        matches!(self, Self::ClassMissing { .. })
    }

    /// A stable label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::AlreadyBound { .. } => "already_bound",
            Self::NotOurs { .. } => "not_ours",
            Self::ClaimDeleting => "claim_deleting",
            Self::ClassMissing { .. } => "class_missing",
            Self::ClassNotOurs { .. } => "class_not_ours",
            Self::WaitingForNode { .. } => "waiting_for_node",
            Self::BlockUnsupported { .. } => "block_unsupported",
            Self::DataSourceUnsupported { .. } => "data_source_unsupported",
            Self::CrossNamespaceDataSource { .. } => "cross_namespace_data_source",
        }
    }
}

impl fmt::Display for SkipProvision {
    /// The message for the log and, where [`Self::event_reason`] says so, the Event.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyBound { volume_name } => {
                write!(f, "claim is already bound to volume {volume_name:?}")
            }
            Self::NotOurs {
                provisioner: Some(p),
            } => {
                write!(f, "claim is for provisioner {p:?}, not this one")
            }
            Self::NotOurs { provisioner: None } => {
                write!(f, "claim has no storage-provisioner annotation")
            }
            Self::ClaimDeleting => write!(f, "claim is being deleted"),
            Self::ClassMissing { class: Some(c) } => write!(
                f,
                "storage class {c:?} not found; create it, or fix the claim's storageClassName"
            ),
            Self::ClassMissing { class: None } => write!(
                f,
                "claim names no storage class; set its storageClassName to a class of this provisioner"
            ),
            Self::ClassNotOurs { class, provisioner } => write!(
                f,
                "storage class {class:?} is for provisioner {provisioner:?}, not this one; the claim's storage-provisioner annotation disagrees with its class"
            ),
            Self::WaitingForNode { class } => write!(
                f,
                "storage class {class:?} waits for the first consumer; waiting for the scheduler to select a node"
            ),
            Self::BlockUnsupported { plugin } => write!(
                f,
                "plugin {plugin:?} cannot make block volumes; use volumeMode: Filesystem or a class whose plugin supports block"
            ),
            Self::DataSourceUnsupported { kind, plugin } => write!(
                f,
                "plugin {plugin:?} cannot populate a volume from a {kind}; remove the claim's data source or use a class whose plugin supports it"
            ),
            Self::CrossNamespaceDataSource {
                kind,
                namespace,
                name,
            } => write!(
                f,
                "the claim's dataSourceRef names {kind} {namespace}/{name} in another namespace; this provisioner does not populate volumes across namespaces (it does not check ReferenceGrants); copy the source into the claim's namespace first"
            ),
        }
    }
}

/// Whether to provision `claim`, whose class (found by [`ClaimView::class_name`]) is `class`
/// when it exists, for a host answering to `provisioner_names`, with the plugin
/// described by `info`. Rules, in order: not bound; annotated for us (or, when
/// `before_binder`, not annotated at all: the class decides); not being deleted; class
/// exists and is ours; a WaitForFirstConsumer class has a selected node; block only if
/// the plugin supports it; a data source only in the claim's own namespace, and only of a
/// kind the plugin lists.
pub fn should_provision(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    provisioner_names: &[&str],
    info: &PluginInfo,
    before_binder: bool,
) -> ProvisionDecision {
    use ProvisionDecision::Skip;
    let spec = claim.spec.as_ref();

    if let Some(volume_name) = spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
    {
        return Skip(SkipProvision::AlreadyBound {
            volume_name: volume_name.to_owned(),
        });
    }

    let provisioner = ClaimView(claim).provisioner();
    let announced = provisioner.is_some_and(|p| provisioner_names.contains(&p));
    let unannounced_taken = before_binder && provisioner.is_none();
    if !(announced || unannounced_taken) {
        return Skip(SkipProvision::NotOurs {
            provisioner: provisioner.map(str::to_owned),
        });
    }

    if claim.metadata.deletion_timestamp.is_some() {
        return Skip(SkipProvision::ClaimDeleting);
    }

    let Some(class) = class else {
        return Skip(SkipProvision::ClassMissing {
            class: ClaimView(claim).class_name(),
        });
    };
    let class_name = class.metadata.name.clone().unwrap_or_default();
    if !provisioner_names.contains(&class.provisioner.as_str()) {
        return Skip(SkipProvision::ClassNotOurs {
            class: class_name,
            provisioner: class.provisioner.clone(),
        });
    }

    if class.volume_binding_mode.as_deref() == Some(names::BINDING_WAIT_FOR_FIRST_CONSUMER)
        && ClaimView(claim).selected_node().is_none()
    {
        return Skip(SkipProvision::WaitingForNode { class: class_name });
    }

    if spec.and_then(|s| s.volume_mode.as_deref()) == Some(names::VOLUME_MODE_BLOCK)
        && !info.supports_block
    {
        return Skip(SkipProvision::BlockUnsupported {
            plugin: info.name.clone(),
        });
    }

    if let Some(source) = spec.and_then(|s| s.data_source_ref.as_ref())
        && let Some(namespace) = source.namespace.as_deref().filter(|n| !n.is_empty())
        && Some(namespace) != claim.metadata.namespace.as_deref()
    {
        return Skip(SkipProvision::CrossNamespaceDataSource {
            kind: source.kind.clone(),
            namespace: namespace.to_owned(),
            name: source.name.clone(),
        });
    }

    if let Some(kind) = ClaimView(claim).data_source_kind()
        && !info.data_source_kinds.iter().any(|k| k == kind)
    {
        return Skip(SkipProvision::DataSourceUnsupported {
            kind: kind.to_owned(),
            plugin: info.name.clone(),
        });
    }

    ProvisionDecision::Provision
}

/// Whether to delete a PV's backend volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteDecision {
    /// Every rule holds: ask the plugin (`should-delete`, then `delete`).
    Delete,
    /// Leave the backend volume alone, for this reason. None deserves an Event.
    Skip(SkipDelete),
}

/// Why a PV's backend volume is not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipDelete {
    /// The PV is not `Released` (still bound, available, failed or new).
    NotReleased { phase: Option<String> },
    /// The reclaim policy is not Delete (Retain keeps the data on purpose).
    NotDeletePolicy { policy: Option<String> },
    /// Another provisioner (or a person) made this PV.
    NotProvisionedByUs { provisioned_by: Option<String> },
    /// The PV object is being deleted and carries no protection finalizer: its backend
    /// volume was already deleted (or never ours to delete); it is only waiting to go.
    BeingDeletedWithoutFinalizer,
}

impl fmt::Display for SkipDelete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotReleased { phase } => write!(f, "volume is in phase {phase:?}, not Released"),
            Self::NotDeletePolicy { policy } => {
                write!(f, "volume has reclaim policy {policy:?}, not Delete")
            }
            Self::NotProvisionedByUs { provisioned_by } => {
                write!(
                    f,
                    "volume was provisioned by {provisioned_by:?}, not this provisioner"
                )
            }
            Self::BeingDeletedWithoutFinalizer => {
                write!(f, "volume is being deleted and has no protection finalizer")
            }
        }
    }
}

/// Whether to delete the backend volume of `pv` for the provisioner `provisioner_name`:
/// phase Released, reclaim policy Delete, provisioned-by equal to our name, and not an
/// object already on its way out without our finalizer.
pub fn should_delete(pv: &PersistentVolume, provisioner_name: &str) -> DeleteDecision {
    use DeleteDecision::Skip;
    if pv.metadata.deletion_timestamp.is_some()
        && !has_finalizer(&pv.metadata, names::FINALIZER_PV_PROTECTION)
    {
        return Skip(SkipDelete::BeingDeletedWithoutFinalizer);
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.clone());
    if phase.as_deref() != Some(names::PHASE_RELEASED) {
        return Skip(SkipDelete::NotReleased { phase });
    }
    let policy = reclaim_policy(pv);
    if policy.as_deref() != Some(names::RECLAIM_DELETE) {
        return Skip(SkipDelete::NotDeletePolicy { policy });
    }
    if !provisioned_by(pv, provisioner_name) {
        return Skip(SkipDelete::NotProvisionedByUs {
            provisioned_by: annotation(&pv.metadata, names::ANN_PROVISIONED_BY).map(str::to_owned),
        });
    }
    DeleteDecision::Delete
}

/// What to do with the HonorPVReclaimPolicy finalizer
/// (`external-provisioner.volume.kubernetes.io/finalizer`) on a PV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerAction {
    /// Add it: a live PV of ours with reclaim policy Delete lacks it, so deleting the PV
    /// object first would orphan the backend volume.
    Add,
    /// Remove it: the PV no longer has reclaim policy Delete (changed to Retain), so
    /// nothing must happen to the backend and the PV must be free to go.
    Remove,
    /// Leave the finalizers as they are.
    None,
}

/// The finalizer rule for one PV. After a successful backend delete, the controller
/// removes the finalizer itself; this rule covers the steady state: PVs we provisioned
/// with reclaim policy Delete, Bound (or not yet bound, just created) and not being
/// deleted, get the finalizer; PVs carrying it whose policy is no longer Delete lose it.
/// PVs of other provisioners are never touched. With the finalizer turned off
/// (`enabled` false, `--volume-protection-finalizer=false`), PVs of ours carrying it from
/// an earlier run lose it: the library's rollback path.
pub fn pv_finalizer_action(
    pv: &PersistentVolume,
    provisioner_name: &str,
    enabled: bool,
) -> FinalizerAction {
    if !provisioned_by(pv, provisioner_name) {
        return FinalizerAction::None;
    }
    let has = has_finalizer(&pv.metadata, names::FINALIZER_PV_PROTECTION);
    if !enabled {
        return if has {
            FinalizerAction::Remove
        } else {
            FinalizerAction::None
        };
    }
    let delete_policy = reclaim_policy(pv).as_deref() == Some(names::RECLAIM_DELETE);
    if has && !delete_policy {
        return FinalizerAction::Remove;
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let live = matches!(
        phase,
        None | Some(names::PHASE_PENDING) | Some(names::PHASE_AVAILABLE) | Some(names::PHASE_BOUND)
    );
    if !has && delete_policy && live && pv.metadata.deletion_timestamp.is_none() {
        return FinalizerAction::Add;
    }
    FinalizerAction::None
}

/// Whether a PV found under a claim's deterministic name (`pvc-<uid>`) is that claim's
/// volume, so provisioning is done: its claimRef UID is the claim's and it is not being
/// deleted. Any other answer (a PV left from a deleted claim, one on its way out) must
/// not be taken as success — the double-provision leak of external-provisioner #1469.
/// Also the test to apply to `AlreadyExists` on PV create.
pub fn existing_pv_is_this_claims(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    pv_claim_uid_is(pv, claim) && pv.metadata.deletion_timestamp.is_none()
}

/// Whether the PV's `claimRef.uid` is the claim's UID: the PV was published for this
/// very claim (live or on its way out), so it owns the backend volume of its name.
pub fn pv_claim_uid_is(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let claim_uid = claim.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let pv_claim_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref());
    claim_uid.is_some() && pv_claim_uid == claim_uid
}

/// Whether the PV's provisioned-by annotation names `provisioner_name`.
pub fn provisioned_by(pv: &PersistentVolume, provisioner_name: &str) -> bool {
    annotation(&pv.metadata, names::ANN_PROVISIONED_BY) == Some(provisioner_name)
}

/// Whether `pv` is still the binder's to bind: not being deleted, and not Bound,
/// Released or Failed (no phase yet, Pending or Available).
pub fn pv_awaits_binder(pv: &PersistentVolume) -> bool {
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    pv.metadata.deletion_timestamp.is_none()
        && !phase.is_some_and(|p| {
            [
                names::PHASE_BOUND,
                names::PHASE_RELEASED,
                names::PHASE_FAILED,
            ]
            .contains(&p)
        })
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn reclaim_policy(pv: &PersistentVolume) -> Option<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::tests::{claim, class};
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeSpec, PersistentVolumeStatus, TypedLocalObjectReference,
        TypedObjectReference,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const OURS: &str = names::DEFAULT_PROVISIONER_NAME;
    const NAMES: &[&str] = &[OURS, "legacy.example.com/hostpath"];

    fn info() -> PluginInfo {
        PluginInfo {
            name: "hostpath".into(),
            version: "1.0.0".into(),
            supports_block: false,
            data_source_kinds: vec!["PersistentVolumeClaim".into()],
            capabilities: vec![],
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn decide(c: &PersistentVolumeClaim, k: Option<&StorageClass>) -> ProvisionDecision {
        should_provision(c, k, NAMES, &info(), false)
    }

    fn skip(c: &PersistentVolumeClaim, k: Option<&StorageClass>) -> SkipProvision {
        match decide(c, k) {
            ProvisionDecision::Skip(reason) => reason,
            ProvisionDecision::Provision => panic!("expected a skip"),
        }
    }

    fn annotate(c: &mut PersistentVolumeClaim, key: &str, value: &str) {
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert(key.into(), value.into());
    }

    fn unannotate(c: &mut PersistentVolumeClaim, key: &str) {
        c.metadata.annotations.get_or_insert_default().remove(key);
    }

    fn wffc() -> StorageClass {
        let mut k = class();
        k.volume_binding_mode = Some("WaitForFirstConsumer".into());
        k
    }

    #[test]
    fn a_plain_claim_of_ours_is_provisioned() {
        assert_eq!(
            decide(&claim(), Some(&class())),
            ProvisionDecision::Provision
        );
    }

    #[test]
    fn a_bound_claim_is_not_provisioned() {
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        assert_eq!(
            skip(&c, Some(&class())),
            SkipProvision::AlreadyBound {
                volume_name: "pv-1".into()
            }
        );
        // An empty volumeName is not a binding.
        c.spec.as_mut().unwrap().volume_name = Some(String::new());
        assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
    }

    #[test]
    fn only_claims_annotated_for_one_of_our_names_are_ours() {
        let mut c = claim();
        annotate(&mut c, names::ANN_STORAGE_PROVISIONER, "other.example.com");
        assert_eq!(
            skip(&c, Some(&class())),
            SkipProvision::NotOurs {
                provisioner: Some("other.example.com".into())
            }
        );
        annotate(
            &mut c,
            names::ANN_STORAGE_PROVISIONER,
            "legacy.example.com/hostpath",
        );
        let mut k = class();
        k.provisioner = "legacy.example.com/hostpath".into();
        assert_eq!(decide(&c, Some(&k)), ProvisionDecision::Provision);

        unannotate(&mut c, names::ANN_STORAGE_PROVISIONER);
        assert_eq!(
            skip(&c, Some(&class())),
            SkipProvision::NotOurs { provisioner: None }
        );
    }

    #[test]
    fn before_the_binder_an_unannotated_claim_is_ours_by_its_class_but_never_another_s() {
        let mut c = claim();
        unannotate(&mut c, names::ANN_STORAGE_PROVISIONER);
        let early = |c: &PersistentVolumeClaim, k: &StorageClass| {
            should_provision(c, Some(k), NAMES, &info(), true)
        };
        assert_eq!(early(&c, &class()), ProvisionDecision::Provision);
        let mut theirs = class();
        theirs.provisioner = "other.example.com".into();
        assert!(matches!(
            early(&c, &theirs),
            ProvisionDecision::Skip(SkipProvision::ClassNotOurs { .. })
        ));
        // The binder's announcement of another provisioner wins over the class.
        annotate(&mut c, names::ANN_STORAGE_PROVISIONER, "other.example.com");
        assert!(matches!(
            early(&c, &class()),
            ProvisionDecision::Skip(SkipProvision::NotOurs { .. })
        ));
        // Every other rule still holds: a WaitForFirstConsumer class waits for its node.
        let mut c = claim();
        unannotate(&mut c, names::ANN_STORAGE_PROVISIONER);
        assert!(matches!(
            early(&c, &wffc()),
            ProvisionDecision::Skip(SkipProvision::WaitingForNode { .. })
        ));
    }

    #[test]
    fn the_beta_provisioner_annotation_is_the_fallback() {
        let mut c = claim();
        unannotate(&mut c, names::ANN_STORAGE_PROVISIONER);
        annotate(&mut c, names::ANN_BETA_STORAGE_PROVISIONER, OURS);
        assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
        // The GA key wins when both are there.
        annotate(&mut c, names::ANN_STORAGE_PROVISIONER, "other.example.com");
        assert!(matches!(
            skip(&c, Some(&class())),
            SkipProvision::NotOurs { .. }
        ));
        let mut c = claim();
        annotate(
            &mut c,
            names::ANN_BETA_STORAGE_PROVISIONER,
            "other.example.com",
        );
        assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
    }

    #[test]
    fn a_claim_being_deleted_is_not_provisioned() {
        let mut c = claim();
        c.metadata.deletion_timestamp = Some(now());
        assert_eq!(skip(&c, Some(&class())), SkipProvision::ClaimDeleting);
    }

    #[test]
    fn a_missing_class_is_a_warning_and_retried() {
        let reason = skip(&claim(), None);
        assert_eq!(
            reason,
            SkipProvision::ClassMissing {
                class: Some("fast".into())
            }
        );
        assert_eq!(reason.event_reason(), Some("ProvisioningFailed"));
        assert!(reason.retry());
        assert!(reason.to_string().contains("\"fast\" not found"));
    }

    #[test]
    fn a_class_of_another_provisioner_is_not_provisioned() {
        let mut k = class();
        k.provisioner = "other.example.com".into();
        let reason = skip(&claim(), Some(&k));
        assert_eq!(
            reason,
            SkipProvision::ClassNotOurs {
                class: "fast".into(),
                provisioner: "other.example.com".into()
            }
        );
        assert_eq!(reason.event_reason(), None);
        assert!(!reason.retry());
    }

    #[test]
    fn wait_for_first_consumer_needs_a_selected_node() {
        let mut c = claim();
        let k = wffc();
        assert_eq!(
            skip(&c, Some(&k)),
            SkipProvision::WaitingForNode {
                class: "fast".into()
            }
        );
        annotate(&mut c, names::ANN_SELECTED_NODE, "");
        assert!(matches!(
            skip(&c, Some(&k)),
            SkipProvision::WaitingForNode { .. }
        ));
        annotate(&mut c, names::ANN_SELECTED_NODE, "worker-1");
        assert_eq!(decide(&c, Some(&k)), ProvisionDecision::Provision);
        assert_eq!(ClaimView(&c).selected_node(), Some("worker-1"));
        // Immediate classes do not wait.
        assert_eq!(
            decide(&claim(), Some(&class())),
            ProvisionDecision::Provision
        );
        let reason = skip(&claim(), Some(&k));
        assert_eq!((reason.event_reason(), reason.retry()), (None, false));
    }

    #[test]
    fn the_alpha_selected_node_annotation_is_the_fallback() {
        let mut c = claim();
        annotate(&mut c, names::ANN_ALPHA_SELECTED_NODE, "worker-2");
        assert_eq!(decide(&c, Some(&wffc())), ProvisionDecision::Provision);
        assert_eq!(ClaimView(&c).selected_node(), Some("worker-2"));
        annotate(&mut c, names::ANN_SELECTED_NODE, "worker-1");
        assert_eq!(ClaimView(&c).selected_node(), Some("worker-1"));
        annotate(&mut c, names::ANN_SELECTED_NODE, "");
        assert_eq!(ClaimView(&c).selected_node(), Some("worker-2"));
    }

    #[test]
    fn block_needs_a_plugin_that_supports_it() {
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let reason = skip(&c, Some(&class()));
        assert_eq!(
            reason,
            SkipProvision::BlockUnsupported {
                plugin: "hostpath".into()
            }
        );
        assert_eq!(reason.event_reason(), Some("ProvisioningFailed"));
        let mut block = info();
        block.supports_block = true;
        assert_eq!(
            should_provision(&c, Some(&class()), NAMES, &block, false),
            ProvisionDecision::Provision
        );
        c.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
    }

    #[test]
    fn data_sources_need_a_plugin_that_supports_their_kind() {
        let mut c = claim();
        c.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "src".into(),
        });
        assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
        // dataSourceRef is what counts when both are set.
        c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: "snap".into(),
            namespace: None,
        });
        let reason = skip(&c, Some(&class()));
        assert_eq!(
            reason,
            SkipProvision::DataSourceUnsupported {
                kind: "VolumeSnapshot".into(),
                plugin: "hostpath".into()
            }
        );
        assert_eq!(reason.event_reason(), Some("ProvisioningFailed"));
    }

    /// A clone from another namespace (`dataSourceRef.namespace`, the
    /// CrossNamespaceVolumeDataSource feature) is allowed only by a ReferenceGrant in
    /// the source's namespace, which this host does not read: a tenant must not get a
    /// clone-capable module to copy another namespace's volume into its own claim.
    #[test]
    fn a_data_source_in_another_namespace_is_refused() {
        let mut c = claim();
        let own = c.metadata.namespace.clone();
        c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "victim".into(),
            namespace: Some("victim-ns".into()),
        });
        let reason = skip(&c, Some(&class()));
        assert_eq!(
            reason,
            SkipProvision::CrossNamespaceDataSource {
                kind: "PersistentVolumeClaim".into(),
                namespace: "victim-ns".into(),
                name: "victim".into(),
            }
        );
        assert_eq!(reason.event_reason(), Some("ProvisioningFailed"));
        assert!(!reason.retry());
        // The claim's own namespace, spelled out, or none, is no other namespace.
        for namespace in [own, Some(String::new()), None] {
            c.spec
                .as_mut()
                .unwrap()
                .data_source_ref
                .as_mut()
                .unwrap()
                .namespace = namespace;
            assert_eq!(decide(&c, Some(&class())), ProvisionDecision::Provision);
        }
    }

    #[test]
    fn rules_apply_in_order() {
        // Bound wins over everything; not-ours stays silent even without a class.
        let mut c = claim();
        annotate(&mut c, names::ANN_STORAGE_PROVISIONER, "other");
        assert!(matches!(skip(&c, None), SkipProvision::NotOurs { .. }));
        c.spec.as_mut().unwrap().volume_name = Some("pv".into());
        assert!(matches!(skip(&c, None), SkipProvision::AlreadyBound { .. }));
    }

    fn pv(phase: &str, policy: &str, by: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1234".into()),
                annotations: by
                    .map(|b| [(names::ANN_PROVISIONED_BY.to_string(), b.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some(policy.into()),
                claim_ref: Some(ObjectReference {
                    uid: Some("1234".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_released_delete_pv_of_ours_is_deleted() {
        assert_eq!(
            should_delete(&pv("Released", "Delete", Some(OURS)), OURS),
            DeleteDecision::Delete
        );
    }

    #[test]
    fn only_released_pvs_are_deleted() {
        for phase in ["Pending", "Available", "Bound", "Failed"] {
            assert_eq!(
                should_delete(&pv(phase, "Delete", Some(OURS)), OURS),
                DeleteDecision::Skip(SkipDelete::NotReleased {
                    phase: Some(phase.into())
                }),
                "{phase}"
            );
        }
        let mut no_status = pv("Released", "Delete", Some(OURS));
        no_status.status = None;
        assert!(matches!(
            should_delete(&no_status, OURS),
            DeleteDecision::Skip(SkipDelete::NotReleased { phase: None })
        ));
    }

    #[test]
    fn only_delete_policy_pvs_are_deleted() {
        for policy in ["Retain", "Recycle"] {
            assert_eq!(
                should_delete(&pv("Released", policy, Some(OURS)), OURS),
                DeleteDecision::Skip(SkipDelete::NotDeletePolicy {
                    policy: Some(policy.into())
                })
            );
        }
    }

    #[test]
    fn only_pvs_provisioned_by_us_are_deleted() {
        assert_eq!(
            should_delete(&pv("Released", "Delete", Some("other")), OURS),
            DeleteDecision::Skip(SkipDelete::NotProvisionedByUs {
                provisioned_by: Some("other".into())
            })
        );
        assert_eq!(
            should_delete(&pv("Released", "Delete", None), OURS),
            DeleteDecision::Skip(SkipDelete::NotProvisionedByUs {
                provisioned_by: None
            })
        );
    }

    #[test]
    fn a_pv_being_deleted_is_deleted_only_while_it_has_the_finalizer() {
        let mut p = pv("Released", "Delete", Some(OURS));
        p.metadata.deletion_timestamp = Some(now());
        assert_eq!(
            should_delete(&p, OURS),
            DeleteDecision::Skip(SkipDelete::BeingDeletedWithoutFinalizer)
        );
        p.metadata.finalizers = Some(vec![names::FINALIZER_PV_PROTECTION.into()]);
        assert_eq!(should_delete(&p, OURS), DeleteDecision::Delete);
    }

    #[test]
    fn the_finalizer_is_added_to_live_delete_pvs_of_ours() {
        for phase in ["Bound", "Available", "Pending"] {
            assert_eq!(
                pv_finalizer_action(&pv(phase, "Delete", Some(OURS)), OURS, true),
                FinalizerAction::Add,
                "{phase}"
            );
        }
        // Not to PVs of others, retained ones, released ones or ones being deleted.
        assert_eq!(
            pv_finalizer_action(&pv("Bound", "Delete", Some("other")), OURS, true),
            FinalizerAction::None
        );
        assert_eq!(
            pv_finalizer_action(&pv("Bound", "Retain", Some(OURS)), OURS, true),
            FinalizerAction::None
        );
        assert_eq!(
            pv_finalizer_action(&pv("Released", "Delete", Some(OURS)), OURS, true),
            FinalizerAction::None
        );
        let mut p = pv("Bound", "Delete", Some(OURS));
        p.metadata.deletion_timestamp = Some(now());
        assert_eq!(pv_finalizer_action(&p, OURS, true), FinalizerAction::None);
        // Not twice.
        let mut p = pv("Bound", "Delete", Some(OURS));
        p.metadata.finalizers = Some(vec![names::FINALIZER_PV_PROTECTION.into()]);
        assert_eq!(pv_finalizer_action(&p, OURS, true), FinalizerAction::None);
    }

    #[test]
    fn the_finalizer_is_removed_when_the_policy_is_no_longer_delete() {
        let mut p = pv("Bound", "Retain", Some(OURS));
        p.metadata.finalizers = Some(vec![
            "other/finalizer".into(),
            names::FINALIZER_PV_PROTECTION.into(),
        ]);
        assert_eq!(pv_finalizer_action(&p, OURS, true), FinalizerAction::Remove);
        // Even while being deleted: a Retain PV must be free to go.
        p.metadata.deletion_timestamp = Some(now());
        assert_eq!(pv_finalizer_action(&p, OURS, true), FinalizerAction::Remove);
        // Another provisioner's finalizer business is not ours.
        let mut p = pv("Bound", "Retain", Some("other"));
        p.metadata.finalizers = Some(vec![names::FINALIZER_PV_PROTECTION.into()]);
        assert_eq!(pv_finalizer_action(&p, OURS, true), FinalizerAction::None);
    }

    #[test]
    fn with_the_finalizer_turned_off_ours_lose_it_and_none_gain_it() {
        let p = pv("Bound", "Delete", Some(OURS));
        assert_eq!(pv_finalizer_action(&p, OURS, false), FinalizerAction::None);
        let mut p = p;
        p.metadata.finalizers = Some(vec![names::FINALIZER_PV_PROTECTION.into()]);
        assert_eq!(
            pv_finalizer_action(&p, OURS, false),
            FinalizerAction::Remove
        );
        let mut theirs = pv("Bound", "Delete", Some("other"));
        theirs.metadata.finalizers = Some(vec![names::FINALIZER_PV_PROTECTION.into()]);
        assert_eq!(
            pv_finalizer_action(&theirs, OURS, false),
            FinalizerAction::None
        );
    }

    #[test]
    fn an_existing_pv_counts_only_if_it_is_this_claims_and_alive() {
        let c = claim(); // uid 1234
        let p = pv("Bound", "Delete", Some(OURS)); // claimRef uid 1234
        assert!(existing_pv_is_this_claims(&p, &c));

        // #1469: a PV of the same name made for an earlier claim (another UID)...
        let mut other = p.clone();
        other.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("5678".into());
        assert!(!existing_pv_is_this_claims(&other, &c));
        // ...or without a claimRef UID...
        let mut no_ref = p.clone();
        no_ref.spec.as_mut().unwrap().claim_ref = None;
        assert!(!existing_pv_is_this_claims(&no_ref, &c));
        // ...or on its way out, is not success.
        let mut deleting = p.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        assert!(!existing_pv_is_this_claims(&deleting, &c));
        // A claim without UID matches nothing, not even a PV without one.
        let mut anonymous = c.clone();
        anonymous.metadata.uid = None;
        let mut p_none = p.clone();
        p_none
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .uid = None;
        assert!(!existing_pv_is_this_claims(&p_none, &anonymous));
    }

    #[test]
    fn skip_reasons_have_stable_labels_and_messages() {
        let reasons = [
            SkipProvision::AlreadyBound {
                volume_name: "v".into(),
            },
            SkipProvision::NotOurs { provisioner: None },
            SkipProvision::ClaimDeleting,
            SkipProvision::ClassMissing { class: None },
            SkipProvision::ClassNotOurs {
                class: "c".into(),
                provisioner: "p".into(),
            },
            SkipProvision::WaitingForNode { class: "c".into() },
            SkipProvision::BlockUnsupported { plugin: "p".into() },
            SkipProvision::DataSourceUnsupported {
                kind: "k".into(),
                plugin: "p".into(),
            },
            SkipProvision::CrossNamespaceDataSource {
                kind: "k".into(),
                namespace: "n".into(),
                name: "s".into(),
            },
        ];
        let labels: std::collections::BTreeSet<_> =
            reasons.iter().map(SkipProvision::label).collect();
        assert_eq!(labels.len(), reasons.len());
        assert!(reasons.iter().all(|r| !r.to_string().is_empty()));
    }
}
