//! One read-only view of a claim: every fact about a PersistentVolumeClaim that the
//! decisions ([`crate::decide`]), the request builder ([`crate::request`]) and the
//! controller read, in one place, with Kubernetes' own precedence rules (legacy
//! annotations, `dataSourceRef` over `dataSource`, empty values as none).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::names;

/// A claim, read.
#[derive(Clone, Copy, Debug)]
pub struct ClaimView<'a>(pub &'a PersistentVolumeClaim);

impl<'a> ClaimView<'a> {
    fn annotation(&self, key: &str) -> Option<&'a str> {
        self.0
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    /// `namespace/name`: how every error and log line names the claim.
    pub fn key(&self) -> String {
        crate::object::object_key(&self.0.metadata)
    }

    /// The name of the PV provisioned for the claim: `pvc-<claim uid>`; none while the
    /// claim has no UID. Deterministic, so a retry or a restart finds the PV of an
    /// earlier try.
    pub fn volume_name(&self) -> Option<String> {
        self.0
            .metadata
            .uid
            .as_deref()
            .filter(|uid| !uid.is_empty())
            .map(|uid| format!("{}{uid}", names::PV_NAME_PREFIX))
    }

    /// The name of the claim's StorageClass, as Kubernetes reads it: the legacy
    /// `volume.beta.kubernetes.io/storage-class` annotation, when present, wins over
    /// `spec.storageClassName`. An empty name means "no class" and is returned as none.
    pub fn class_name(&self) -> Option<String> {
        let name = match self.annotation(names::ANN_BETA_STORAGE_CLASS) {
            Some(name) => Some(name),
            None => self
                .0
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref()),
        };
        name.filter(|n| !n.is_empty()).map(str::to_string)
    }

    /// The provisioner the claim is for: the GA storage-provisioner annotation, else the
    /// beta one.
    pub fn provisioner(&self) -> Option<&'a str> {
        self.annotation(names::ANN_STORAGE_PROVISIONER)
            .or_else(|| self.annotation(names::ANN_BETA_STORAGE_PROVISIONER))
    }

    /// The node the scheduler selected: the GA selected-node annotation, else the alpha
    /// one; an empty value counts as none (the host empties neither, it removes both to
    /// ask the scheduler to pick again).
    pub fn selected_node(&self) -> Option<&'a str> {
        [names::ANN_SELECTED_NODE, names::ANN_ALPHA_SELECTED_NODE]
            .into_iter()
            .filter_map(|key| self.annotation(key))
            .find(|node| !node.is_empty())
    }

    /// The kind of the claim's data source (`dataSourceRef` preferred over
    /// `dataSource`), if it has one: what the plugin must support, and the `source`
    /// metric label.
    pub fn data_source_kind(&self) -> Option<&'a str> {
        let spec = self.0.spec.as_ref()?;
        match (&spec.data_source_ref, &spec.data_source) {
            (Some(r), _) => Some(r.kind.as_str()),
            (None, Some(s)) => Some(s.kind.as_str()),
            (None, None) => None,
        }
    }

    /// The PV the claim is bound (or being bound) to, if any.
    pub fn bound_volume(&self) -> Option<&'a str> {
        self.0
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
    }

    /// Whether the binder is done with the claim: Bound (or Lost), not Pending. The
    /// binder's last write of a bind is the claim's status; until then it may still
    /// update the claim (with a resourceVersion precondition), so our edits wait.
    pub fn binding_settled(&self) -> bool {
        let phase = self.0.status.as_ref().and_then(|s| s.phase.as_deref());
        !matches!(phase, None | Some("Pending"))
    }

    /// Whether the claim is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.0.metadata.deletion_timestamp.is_some()
    }

    /// Whether the claim carries `finalizer`.
    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        crate::object::has_finalizer(&self.0.metadata, finalizer)
    }
}
