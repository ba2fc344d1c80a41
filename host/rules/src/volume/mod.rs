//! Turning a plugin's answer into a PersistentVolume, and a PersistentVolume back into
//! the plugin's `delete-request`.
//!
//! [`persistent_volume`] publishes what a plugin made: the host, not the plugin, owns
//! every field Kubernetes acts on (claimRef, provisioned-by, class, reclaim policy,
//! access modes, finalizer), and it checks what the plugin says before the PV reaches
//! the API server: the capacity covers the request, a `local` volume is pinned to nodes,
//! the volume mode matches the claim, labels and annotations stay out of reserved
//! domains, and a `json` source is exactly one known PersistentVolumeSource with no
//! misspelt field. [`delete_request`] reverses the mapping: a source the typed WIT
//! records can carry without loss comes back typed, any other one as `json`.
//!
//! Reserved domains. Plugins may not set annotations whose key prefix is
//! `kubernetes.io`, `k8s.io` or `wasm-provisioner.dev`, or a subdomain of one of them
//! (`pv.kubernetes.io/bound-by-controller`, `volume.beta.kubernetes.io/...`): those carry
//! meaning for the control plane or for this host. Labels follow the same rule with one
//! exception: `topology.kubernetes.io/` and `failure-domain.beta.kubernetes.io/` labels
//! are allowed, since the scheduler reads a PV's zone and region from them. Such keys are
//! refused with an error rather than dropped, so a plugin author learns at once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::claim::ClaimView;
use crate::names;
use crate::quantity;
use crate::request::volume_mode_str;
use crate::types;

mod delete;
pub(crate) mod metadata;
mod source;

pub use delete::{delete_request, unpublished_delete_request};
use metadata::checked_map;
pub use metadata::{ALLOWED_LABEL_DOMAINS, RESERVED_DOMAINS};
use source::source_spec;
pub use source::{SOURCE_KEYS, volume_source_of};

/// Node selector operators Kubernetes accepts.
const NODE_SELECTOR_OPERATORS: [&str; 6] = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"];

/// Why a plugin's volume cannot be published as a PV, or a PV cannot be put to a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "plugin made volume {volume} with {capacity} bytes but claim {claim} requested {requested}; the plugin must provide at least the requested size"
    )]
    CapacityTooSmall {
        volume: String,
        claim: String,
        capacity: u64,
        requested: u64,
    },
    #[error(
        "plugin made volume {volume} with {capacity} bytes but claim {claim} allows at most {allowed} ({why}); the plugin must answer the size it made, within what the claim allows"
    )]
    CapacityTooLarge {
        volume: String,
        claim: String,
        capacity: u64,
        allowed: u64,
        why: &'static str,
    },
    #[error(
        "plugin made volume {volume} as {volume_mode} but claim {claim} asked for {claim_mode}; the plugin must honour the claim's volume mode"
    )]
    VolumeModeMismatch {
        volume: String,
        claim: String,
        claim_mode: &'static str,
        volume_mode: &'static str,
    },
    #[error(
        "plugin set {what} {key:?} on volume {volume}, in a domain reserved for Kubernetes and this host; the plugin must use its own domain"
    )]
    ReservedKey {
        volume: String,
        what: &'static str,
        key: String,
    },
    #[error(
        "plugin set {what} {key:?} on volume {volume}, which is not a valid Kubernetes key ({why}); fix the plugin"
    )]
    InvalidKey {
        volume: String,
        what: &'static str,
        key: String,
        why: &'static str,
    },
    #[error(
        "plugin set label {key:?} on volume {volume} to {value:?}, which is not a valid label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit); fix the plugin"
    )]
    InvalidLabelValue {
        volume: String,
        key: String,
        value: String,
    },
    #[error(
        "plugin made volume {volume} with node affinity operator {operator:?} on key {key:?}; use In, NotIn, Exists, DoesNotExist, Gt or Lt"
    )]
    InvalidNodeAffinity {
        volume: String,
        key: String,
        operator: String,
    },
    #[error(
        "plugin made local volume {volume} without node affinity; a local volume must name the node(s) it lives on"
    )]
    LocalWithoutNodeAffinity { volume: String },
    #[error(
        "plugin made volume {volume} with a json source that is not valid JSON ({why}); it must be an object like {{\"cephfs\": {{...}}}}"
    )]
    JsonSyntax { volume: String, why: String },
    #[error(
        "plugin made volume {volume} with a json source that has {count} keys ({keys}); it must be an object with exactly one key naming the source"
    )]
    JsonKeyCount {
        volume: String,
        count: usize,
        keys: String,
    },
    #[error("plugin made volume {volume} with json source {key:?}, which is not a PersistentVolume source; use one of {}", SOURCE_KEYS.join(", "))]
    JsonUnknownSource { volume: String, key: String },
    #[error(
        "plugin made volume {volume} with an invalid {key:?} json source: {why}; check it against the Kubernetes PersistentVolumeSpec schema"
    )]
    JsonInvalid {
        volume: String,
        key: String,
        why: String,
    },
    #[error(
        "plugin made volume {volume} with {key:?} json source field {field:?}, which Kubernetes does not know (misspelt?); fix the plugin"
    )]
    JsonUnknownField {
        volume: String,
        key: String,
        field: String,
    },
    #[error(
        "plugin made volume {volume} with a {key:?} json source that lacks the required field {field:?}; fix the plugin"
    )]
    JsonMissingField {
        volume: String,
        key: String,
        field: String,
    },
    #[error(
        "volume {volume} has no volume source; it cannot be handed to a plugin (was it made by hand?)"
    )]
    NoSource { volume: String },
    #[error(
        "volume {volume} has several volume sources ({sources}); Kubernetes allows one, fix the PV"
    )]
    SeveralSources { volume: String, sources: String },
    #[error("volume {volume} has an invalid spec.capacity.storage: {source}")]
    Capacity {
        volume: String,
        source: quantity::Error,
    },
}

impl Error {
    /// The metric label of this error: one per kind, bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::CapacityTooSmall { .. } => "capacity_too_small",
            Error::CapacityTooLarge { .. } => "capacity_too_large",
            Error::VolumeModeMismatch { .. } => "volume_mode_mismatch",
            Error::ReservedKey { .. } => "reserved_key",
            Error::InvalidKey { .. } => "invalid_key",
            Error::InvalidLabelValue { .. } => "invalid_label_value",
            Error::InvalidNodeAffinity { .. } => "invalid_node_affinity",
            Error::LocalWithoutNodeAffinity { .. } => "local_without_node_affinity",
            Error::JsonSyntax { .. } => "json_syntax",
            Error::JsonKeyCount { .. } => "json_key_count",
            Error::JsonUnknownSource { .. } => "json_unknown_source",
            Error::JsonInvalid { .. } => "json_invalid",
            Error::JsonUnknownField { .. } => "json_unknown_field",
            Error::JsonMissingField { .. } => "json_missing_field",
            Error::NoSource { .. } => "no_source",
            Error::SeveralSources { .. } => "several_sources",
            Error::Capacity { .. } => "invalid_capacity",
        }
    }
}

/// The PV publishing `volume`, which a plugin made for `req` (built from `claim` and
/// `class`): named `req.volume-name`, bound to the claim by claimRef, annotated with
/// `provisioned-by: provisioner_name` and the class's module, with the class's reclaim
/// policy (default Delete) and, for Delete, the HonorPVReclaimPolicy finalizer so the
/// backend volume is deleted even if the PV object is deleted first.
pub fn persistent_volume(
    req: &types::ProvisionRequest,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: types::Volume,
    provisioner_name: &str,
    protection_finalizer: bool,
) -> Result<PersistentVolume, Error> {
    let name = req.volume_name.clone();
    let key = ClaimView(claim).key();

    if volume.capacity_bytes < req.claim.requested_bytes {
        return Err(Error::CapacityTooSmall {
            volume: name,
            claim: key,
            capacity: volume.capacity_bytes,
            requested: req.claim.requested_bytes,
        });
    }

    let (allowed, why) = largest_capacity(&req.claim);
    if volume.capacity_bytes > allowed {
        return Err(Error::CapacityTooLarge {
            volume: name,
            claim: key,
            capacity: volume.capacity_bytes,
            allowed,
            why,
        });
    }

    let claim_mode = volume_mode_str(req.claim.volume_mode);
    let volume_mode = volume.volume_mode.map_or(claim_mode, volume_mode_str);
    if volume_mode != claim_mode {
        return Err(Error::VolumeModeMismatch {
            volume: name,
            claim: key,
            claim_mode,
            volume_mode,
        });
    }

    let labels = checked_map(&name, "label", volume.labels)?;
    let mut annotations = checked_map(&name, "annotation", volume.annotations)?;
    annotations.insert(names::ANN_PROVISIONED_BY.into(), provisioner_name.into());
    if let Some(module) = class
        .parameters
        .as_ref()
        .and_then(|p| p.get(names::PARAM_MODULE))
    {
        annotations.insert(names::ANN_MODULE.into(), module.clone());
    }
    if let Some(secret) = &req.secret {
        // The reference, never the value: `delete` and `expand` read it again.
        annotations.insert(
            names::ANN_SECRET.into(),
            format!("{}/{}", secret.namespace, secret.name),
        );
    }

    let mut spec = source_spec(&name, volume.source)?;
    spec.node_affinity = node_affinity(&name, volume.node_affinity)?;
    if spec.local.is_some() && spec.node_affinity.is_none() {
        return Err(Error::LocalWithoutNodeAffinity { volume: name });
    }

    let reclaim_policy = class
        .reclaim_policy
        .clone()
        .unwrap_or_else(|| names::RECLAIM_DELETE.into());
    let finalizers = (protection_finalizer && reclaim_policy == names::RECLAIM_DELETE)
        .then(|| vec![names::FINALIZER_PV_PROTECTION.into()]);

    let mut mount_options: Vec<String> = Vec::new();
    for option in class
        .mount_options
        .iter()
        .flatten()
        .chain(&volume.mount_options)
    {
        if !mount_options.contains(option) {
            mount_options.push(option.clone());
        }
    }

    spec.claim_ref = Some(ObjectReference {
        kind: Some(names::KIND_CLAIM.into()),
        api_version: Some(names::API_VERSION_CORE_V1.into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        field_path: None,
    });
    spec.storage_class_name = class.metadata.name.clone();
    spec.persistent_volume_reclaim_policy = Some(reclaim_policy);
    spec.mount_options = (!mount_options.is_empty()).then_some(mount_options);
    spec.access_modes = claim.spec.as_ref().and_then(|s| s.access_modes.clone());
    spec.capacity = Some(BTreeMap::from([(
        names::RESOURCE_STORAGE.to_owned(),
        quantity::format_bytes(volume.capacity_bytes),
    )]));
    spec.volume_mode = Some(volume_mode.into());

    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: Some(annotations),
            finalizers,
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// A volume may be this many times its claim's request when the claim sets no limit:
/// backends round up to their allocation unit (a GiB, a minimum size), and none rounds
/// up a thousandfold; a bigger figure is a wrong answer (capacity tracking and quota
/// tools would believe it).
pub const MAX_CAPACITY_OVER_REQUEST: u64 = 1024;

/// ...and at least this much, so small requests can still round up to a large minimum.
pub const MIN_CAPACITY_ALLOWED: u64 = 1 << 40;

/// The largest capacity a plugin may answer for `claim`, and why: its `limits.storage`
/// when set, else [`MAX_CAPACITY_OVER_REQUEST`] times its request (at least
/// [`MIN_CAPACITY_ALLOWED`]).
pub fn largest_capacity(claim: &types::Claim) -> (u64, &'static str) {
    match claim.limit_bytes {
        Some(limit) => (limit, "its limits.storage"),
        None => (
            claim
                .requested_bytes
                .saturating_mul(MAX_CAPACITY_OVER_REQUEST)
                .max(MIN_CAPACITY_ALLOWED),
            "1024 times its request, at least 1 TiB, as it sets no limits.storage",
        ),
    }
}

/// Records on a PV which module version made its backend volume (name and sha256), so
/// an admin can tell which code owns it. The runtime knows the digest it loaded; the
/// class's `module` parameter is already recorded by [`persistent_volume`].
pub fn record_module(pv: &mut PersistentVolume, module: &str, sha256: &str) {
    let annotations = pv.metadata.annotations.get_or_insert_default();
    annotations.insert(names::ANN_MODULE.into(), module.into());
    annotations.insert(names::ANN_MODULE_SHA256.into(), sha256.into());
}

fn node_affinity(
    volume: &str,
    terms: Vec<types::NodeSelectorTerm>,
) -> Result<Option<VolumeNodeAffinity>, Error> {
    if terms.is_empty() {
        return Ok(None);
    }
    let node_selector_terms = terms
        .into_iter()
        .map(|term| -> Result<NodeSelectorTerm, Error> {
            let match_expressions = term
                .match_expressions
                .into_iter()
                .map(|r| {
                    if !NODE_SELECTOR_OPERATORS.contains(&r.operator.as_str()) {
                        return Err(Error::InvalidNodeAffinity {
                            volume: volume.to_owned(),
                            key: r.key,
                            operator: r.operator,
                        });
                    }
                    Ok(NodeSelectorRequirement {
                        key: r.key,
                        operator: r.operator,
                        values: (!r.values.is_empty()).then_some(r.values),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(NodeSelectorTerm {
                match_expressions: Some(match_expressions),
                match_fields: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms,
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::provision_request;
    use crate::request::tests::{claim, class, map};
    use k8s_openapi::api::core::v1::SecretReference;
    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, LocalVolumeSource, PersistentVolumeSpec,
    };
    use serde_json::Value;

    const OURS: &str = names::DEFAULT_PROVISIONER_NAME;

    fn nfs() -> types::VolumeSource {
        types::VolumeSource::Nfs(types::NfsSource {
            server: "nfs.example".into(),
            path: "/exports/pvc-1234".into(),
            read_only: false,
        })
    }

    fn made(source: types::VolumeSource) -> types::Volume {
        types::Volume {
            capacity_bytes: 10 << 30,
            source,
            node_affinity: vec![],
            labels: vec![],
            annotations: vec![],
            mount_options: vec![],
            volume_mode: None,
        }
    }

    fn on_node(name: &str) -> Vec<types::NodeSelectorTerm> {
        vec![types::NodeSelectorTerm {
            match_expressions: vec![types::NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: "In".into(),
                values: vec![name.into()],
            }],
        }]
    }

    fn publish(volume: types::Volume) -> Result<PersistentVolume, Error> {
        let (c, k) = (claim(), class());
        let req = provision_request(&c, &k, None).unwrap();
        persistent_volume(&req, &c, &k, volume, OURS, true)
    }

    fn spec(pv: &PersistentVolume) -> &PersistentVolumeSpec {
        pv.spec.as_ref().unwrap()
    }

    /// volume -> PV -> delete request: the source the plugin gets back.
    fn round_trip(volume: types::Volume) -> types::VolumeSource {
        let pv = publish(volume).unwrap();
        delete_request(&pv, Some(&class())).unwrap().volume.source
    }

    fn same(a: &types::VolumeSource, b: &types::VolumeSource) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    #[test]
    fn pv_is_named_bound_and_annotated() {
        let pv = publish(made(nfs())).unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1234"));
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            ann.get(names::ANN_PROVISIONED_BY).map(String::as_str),
            Some(OURS)
        );
        assert_eq!(
            ann.get(names::ANN_MODULE).map(String::as_str),
            Some("hostpath")
        );
        let r = spec(&pv).claim_ref.as_ref().unwrap();
        assert_eq!(r.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        assert_eq!(r.name.as_deref(), Some("data"));
        assert_eq!(r.uid.as_deref(), Some("1234"));
        assert_eq!(r.resource_version.as_deref(), Some("42"));
        assert_eq!(spec(&pv).storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec(&pv).access_modes,
            Some(vec!["ReadWriteOnce".to_string()])
        );
        assert_eq!(spec(&pv).volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec(&pv).capacity.as_ref().unwrap()["storage"].0, "10Gi");
        assert!(pv.metadata.labels.is_none());
        assert!(spec(&pv).node_affinity.is_none());
        assert!(spec(&pv).mount_options.is_none());
    }

    #[test]
    fn record_module_sets_name_and_digest() {
        let mut pv = publish(made(nfs())).unwrap();
        record_module(&mut pv, "hostpath", "deadbeef");
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[names::ANN_MODULE], "hostpath");
        assert_eq!(ann[names::ANN_MODULE_SHA256], "deadbeef");
    }

    #[test]
    fn reclaim_policy_defaults_to_delete_with_the_protection_finalizer() {
        let pv = publish(made(nfs())).unwrap();
        assert_eq!(
            spec(&pv).persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(
            pv.metadata.finalizers,
            Some(vec![names::FINALIZER_PV_PROTECTION.to_string()])
        );

        let (c, mut k) = (claim(), class());
        k.reclaim_policy = Some("Retain".into());
        let req = provision_request(&c, &k, None).unwrap();
        let pv = persistent_volume(&req, &c, &k, made(nfs()), OURS, true).unwrap();
        assert_eq!(
            spec(&pv).persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(pv.metadata.finalizers, None);

        // --volume-protection-finalizer=false: never added (the rollback switch).
        let (c, k) = (claim(), class());
        let req = provision_request(&c, &k, None).unwrap();
        let pv = persistent_volume(&req, &c, &k, made(nfs()), OURS, false).unwrap();
        assert_eq!(pv.metadata.finalizers, None);
    }

    #[test]
    fn mount_options_are_the_class_then_the_plugin_deduplicated() {
        let (c, mut k) = (claim(), class());
        k.mount_options = Some(vec!["noatime".into(), "nfsvers=4.1".into()]);
        let req = provision_request(&c, &k, None).unwrap();
        let mut v = made(nfs());
        v.mount_options = vec!["hard".into(), "noatime".into(), "hard".into()];
        let pv = persistent_volume(&req, &c, &k, v, OURS, true).unwrap();
        assert_eq!(
            spec(&pv).mount_options,
            Some(vec!["noatime".into(), "nfsvers=4.1".into(), "hard".into()])
        );
    }

    #[test]
    fn capacity_must_cover_the_request() {
        let mut v = made(nfs());
        v.capacity_bytes = (10 << 30) - 1;
        let err = publish(v).unwrap_err();
        assert_eq!(
            err,
            Error::CapacityTooSmall {
                volume: "pvc-1234".into(),
                claim: "ns/data".into(),
                capacity: (10 << 30) - 1,
                requested: 10 << 30
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("10737418239") && message.contains("10737418240"),
            "{message}"
        );
        // More than asked is fine, and published as is.
        let mut v = made(nfs());
        v.capacity_bytes = 11_000_000_000;
        let pv = publish(v).unwrap();
        assert_eq!(
            spec(&pv).capacity.as_ref().unwrap()["storage"].0,
            "11000000000"
        );
    }

    #[test]
    fn volume_mode_is_the_claims_and_must_match_it() {
        let mut v = made(nfs());
        v.volume_mode = Some(types::VolumeMode::Filesystem);
        assert_eq!(
            spec(&publish(v).unwrap()).volume_mode.as_deref(),
            Some("Filesystem")
        );
        let mut v = made(nfs());
        v.volume_mode = Some(types::VolumeMode::Block);
        assert!(matches!(
            publish(v),
            Err(Error::VolumeModeMismatch {
                claim_mode: "Filesystem",
                volume_mode: "Block",
                ..
            })
        ));

        let mut c = claim();
        c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let k = class();
        let req = provision_request(&c, &k, None).unwrap();
        let pv = persistent_volume(&req, &c, &k, made(nfs()), OURS, true).unwrap();
        assert_eq!(spec(&pv).volume_mode.as_deref(), Some("Block"));
    }

    #[test]
    fn node_affinity_becomes_required_terms() {
        let mut v = made(nfs());
        v.node_affinity = on_node("worker-1");
        v.node_affinity.push(types::NodeSelectorTerm {
            match_expressions: vec![types::NodeSelectorRequirement {
                key: "disk".into(),
                operator: "Exists".into(),
                values: vec![],
            }],
        });
        let pv = publish(v).unwrap();
        let terms = &spec(&pv)
            .node_affinity
            .as_ref()
            .unwrap()
            .required
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        let r = &terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (r.key.as_str(), r.operator.as_str()),
            ("kubernetes.io/hostname", "In")
        );
        assert_eq!(r.values, Some(vec!["worker-1".to_string()]));
        assert_eq!(terms[1].match_expressions.as_ref().unwrap()[0].values, None);

        let mut v = made(nfs());
        v.node_affinity = on_node("worker-1");
        v.node_affinity[0].match_expressions[0].operator = "Near".into();
        assert!(
            matches!(publish(v), Err(Error::InvalidNodeAffinity { operator, .. }) if operator == "Near")
        );
    }

    #[test]
    fn local_volumes_require_node_affinity() {
        let local = types::VolumeSource::Local(types::LocalSource {
            path: "/mnt/disks/1".into(),
            fs_type: None,
        });
        assert_eq!(
            publish(made(local.clone())).unwrap_err(),
            Error::LocalWithoutNodeAffinity {
                volume: "pvc-1234".into()
            }
        );
        let json = types::VolumeSource::Json(r#"{"local": {"path": "/mnt/disks/1"}}"#.into());
        assert!(matches!(
            publish(made(json)),
            Err(Error::LocalWithoutNodeAffinity { .. })
        ));
        let mut v = made(local);
        v.node_affinity = on_node("worker-1");
        assert!(spec(&publish(v).unwrap()).local.is_some());
    }

    #[test]
    fn plugin_labels_and_annotations_are_published() {
        let mut v = made(nfs());
        v.labels = vec![
            ("example.com/tier".into(), "gold".into()),
            ("topology.kubernetes.io/zone".into(), "z1".into()),
            ("plain".into(), String::new()),
        ];
        v.annotations = vec![(
            "example.com/backend-id".into(),
            "vol-0001 / any text".into(),
        )];
        let pv = publish(v).unwrap();
        assert_eq!(
            pv.metadata.labels,
            Some(map(&[
                ("example.com/tier", "gold"),
                ("plain", ""),
                ("topology.kubernetes.io/zone", "z1")
            ]))
        );
        let ann = pv.metadata.annotations.unwrap();
        assert_eq!(ann["example.com/backend-id"], "vol-0001 / any text");
    }

    #[test]
    fn reserved_annotation_domains_are_refused() {
        for key in [
            names::ANN_PROVISIONED_BY,
            "pv.kubernetes.io/bound-by-controller",
            "volume.beta.kubernetes.io/mount-options",
            "kubernetes.io/anything",
            "k8s.io/anything",
            "storage.k8s.io/anything",
            names::ANN_MODULE_SHA256,
            "sub.wasm-provisioner.dev/x",
            "topology.kubernetes.io/zone",
        ] {
            let mut v = made(nfs());
            v.annotations = vec![(key.into(), "x".into())];
            assert!(
                matches!(publish(v), Err(Error::ReservedKey { what: "annotation", key: k, .. }) if k == key),
                "{key}"
            );
        }
    }

    #[test]
    fn reserved_label_domains_are_refused_except_topology() {
        for key in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/x",
            "k8s.io/x",
            "wasm-provisioner.dev/x",
        ] {
            let mut v = made(nfs());
            v.labels = vec![(key.into(), "x".into())];
            assert!(
                matches!(publish(v), Err(Error::ReservedKey { what: "label", .. })),
                "{key}"
            );
        }
        for key in [
            "topology.kubernetes.io/region",
            "failure-domain.beta.kubernetes.io/zone",
            // Only real subdomains are reserved, not look-alikes.
            "notkubernetes.io/x",
            "kubernetes.io.example.com/x",
        ] {
            let mut v = made(nfs());
            v.labels = vec![(key.into(), "x".into())];
            assert!(publish(v).is_ok(), "{key}");
        }
    }

    #[test]
    fn invalid_keys_and_label_values_are_refused() {
        for key in [
            "",
            "/x",
            "Example.com/x",
            "a/b/c",
            "x/",
            "-x",
            "x y",
            &"a".repeat(64),
        ] {
            let mut v = made(nfs());
            v.annotations = vec![(key.to_string(), "x".into())];
            assert!(
                matches!(publish(v), Err(Error::InvalidKey { .. })),
                "{key:?}"
            );
        }
        for value in ["-x", "a b", "x/y", &"a".repeat(64)] {
            let mut v = made(nfs());
            v.labels = vec![("tier".into(), value.to_string())];
            assert!(
                matches!(publish(v), Err(Error::InvalidLabelValue { .. })),
                "{value:?}"
            );
        }
    }

    #[test]
    fn typed_sources_map_to_their_fields() {
        let pv = publish(made(nfs())).unwrap();
        let s = spec(&pv).nfs.as_ref().unwrap();
        assert_eq!(
            (s.server.as_str(), s.path.as_str(), s.read_only),
            ("nfs.example", "/exports/pvc-1234", None)
        );

        let hp = types::VolumeSource::HostPath(types::HostPathSource {
            path: "/srv/pvc-1234".into(),
            path_type: Some("DirectoryOrCreate".into()),
        });
        let pv = publish(made(hp)).unwrap();
        let s = spec(&pv).host_path.as_ref().unwrap();
        assert_eq!(
            (s.path.as_str(), s.type_.as_deref()),
            ("/srv/pvc-1234", Some("DirectoryOrCreate"))
        );

        let pv = publish(made(csi())).unwrap();
        let s = spec(&pv).csi.as_ref().unwrap();
        assert_eq!(
            (s.driver.as_str(), s.volume_handle.as_str()),
            ("csi.example.com", "vol-1")
        );
        assert_eq!(
            (s.fs_type.as_deref(), s.read_only),
            (Some("ext4"), Some(true))
        );
        assert_eq!(s.volume_attributes, Some(map(&[("pool", "a")])));

        let pv = publish(made(iscsi())).unwrap();
        let s = spec(&pv).iscsi.as_ref().unwrap();
        assert_eq!(
            (s.target_portal.as_str(), s.iqn.as_str(), s.lun),
            ("10.0.0.1:3260", "iqn.2024-01.example:t", 3)
        );
        assert_eq!(s.portals, Some(vec!["10.0.0.2:3260".to_string()]));
        assert_eq!(s.iscsi_interface.as_deref(), Some("default"));
    }

    fn csi() -> types::VolumeSource {
        types::VolumeSource::Csi(types::CsiSource {
            driver: "csi.example.com".into(),
            volume_handle: "vol-1".into(),
            fs_type: Some("ext4".into()),
            read_only: true,
            volume_attributes: vec![("pool".into(), "a".into())],
        })
    }

    fn iscsi() -> types::VolumeSource {
        types::VolumeSource::Iscsi(types::IscsiSource {
            target_portal: "10.0.0.1:3260".into(),
            iqn: "iqn.2024-01.example:t".into(),
            lun: 3,
            iscsi_interface: Some("default".into()),
            fs_type: Some("xfs".into()),
            read_only: false,
            portals: vec!["10.0.0.2:3260".into()],
        })
    }

    #[test]
    fn every_typed_source_round_trips_to_the_delete_request() {
        let mut local = made(types::VolumeSource::Local(types::LocalSource {
            path: "/mnt/disks/1".into(),
            fs_type: Some("ext4".into()),
        }));
        local.node_affinity = on_node("worker-1");
        let volumes = [
            made(nfs()),
            made(types::VolumeSource::Nfs(types::NfsSource {
                server: "s".into(),
                path: "/p".into(),
                read_only: true,
            })),
            made(types::VolumeSource::HostPath(types::HostPathSource {
                path: "/srv/x".into(),
                path_type: None,
            })),
            made(types::VolumeSource::HostPath(types::HostPathSource {
                path: "/srv/x".into(),
                path_type: Some("Directory".into()),
            })),
            local,
            made(csi()),
            made(types::VolumeSource::Csi(types::CsiSource {
                driver: "d".into(),
                volume_handle: "h".into(),
                fs_type: None,
                read_only: false,
                volume_attributes: vec![],
            })),
            made(iscsi()),
        ];
        for volume in volumes {
            let before = volume.source.clone();
            let after = round_trip(volume);
            assert!(same(&before, &after), "{before:?} came back as {after:?}");
        }
    }

    #[test]
    fn json_source_round_trips_as_json() {
        let text =
            r#"{"cephfs": {"monitors": ["10.0.0.1:6789"], "path": "/vols/1", "user": "admin"}}"#;
        let pv = publish(made(types::VolumeSource::Json(text.into()))).unwrap();
        let cephfs = spec(&pv).cephfs.as_ref().unwrap();
        assert_eq!(cephfs.monitors, vec!["10.0.0.1:6789".to_string()]);
        assert_eq!(cephfs.user.as_deref(), Some("admin"));
        let types::VolumeSource::Json(back) =
            round_trip(made(types::VolumeSource::Json(text.into())))
        else {
            panic!("cephfs did not come back as json");
        };
        let a: Value = serde_json::from_str(text).unwrap();
        let b: Value = serde_json::from_str(&back).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn json_for_a_typed_kind_comes_back_typed() {
        let text = r#"{"nfs": {"server": "nfs.example", "path": "/exports/pvc-1234"}}"#;
        let back = round_trip(made(types::VolumeSource::Json(text.into())));
        assert!(same(&back, &nfs()), "{back:?}");
    }

    #[test]
    fn typed_sources_with_fields_the_wit_lacks_come_back_as_json() {
        let text = r#"{"csi": {"driver": "d", "volumeHandle": "h", "nodePublishSecretRef": {"name": "s", "namespace": "ns"}}}"#;
        let pv = publish(made(types::VolumeSource::Json(text.into()))).unwrap();
        assert_eq!(
            spec(&pv).csi.as_ref().unwrap().node_publish_secret_ref,
            Some(SecretReference {
                name: Some("s".into()),
                namespace: Some("ns".into())
            })
        );
        let back = volume_source_of(&pv).unwrap();
        let types::VolumeSource::Json(back) = back else {
            panic!("a csi source with a secret must not lose it: {back:?}");
        };
        assert_eq!(
            serde_json::from_str::<Value>(&back).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );

        let text = r#"{"iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0, "chapAuthSession": true, "secretRef": {"name": "chap"}}}"#;
        let pv = publish(made(types::VolumeSource::Json(text.into()))).unwrap();
        assert!(matches!(
            volume_source_of(&pv),
            Ok(types::VolumeSource::Json(_))
        ));
    }

    #[test]
    fn json_must_be_one_known_source_key() {
        let cases = [
            ("not json", "JsonSyntax"),
            ("[1]", "JsonSyntax"),
            ("{}", "JsonKeyCount"),
            (
                r#"{"nfs": {"server": "s", "path": "/"}, "hostPath": {"path": "/"}}"#,
                "JsonKeyCount",
            ),
            (r#"{"capacity": {"storage": "1Gi"}}"#, "JsonUnknownSource"),
            (r#"{"claimRef": {"name": "other"}}"#, "JsonUnknownSource"),
            (r#"{"emptyDir": {}}"#, "JsonUnknownSource"),
            (r#"{"nfs": "server:/path"}"#, "JsonInvalid"),
            (r#"{"nfs": {"server": "s"}}"#, "JsonMissingField"),
            (r#"{"cephfs": {"path": "/"}}"#, "JsonMissingField"),
            (
                r#"{"iscsi": {"targetPortal": "t", "iqn": "q"}}"#,
                "JsonMissingField",
            ),
            (r#"{"cephfs": {"monitors": "one"}}"#, "JsonInvalid"),
            (
                r#"{"nfs": {"server": "s", "path": "/", "readonly": true}}"#,
                "JsonUnknownField",
            ),
            (
                r#"{"csi": {"driver": "d", "volumeHandle": "h", "nodePublishSecretRef": {"nam": "s"}}}"#,
                "JsonUnknownField",
            ),
        ];
        for (text, want) in cases {
            let err = publish(made(types::VolumeSource::Json(text.into()))).unwrap_err();
            let got = format!("{err:?}");
            assert!(got.starts_with(want), "{text}: {got}");
            assert!(err.to_string().contains("pvc-1234"), "{err}");
        }
        let err = publish(made(types::VolumeSource::Json(
            r#"{"csi": {"driver": "d", "volumeHandle": "h", "nodePublishSecretRef": {"nam": "s"}}}"#.into(),
        )))
        .unwrap_err();
        assert!(
            matches!(&err, Error::JsonUnknownField { field, .. } if field == "nodePublishSecretRef.nam"),
            "{err:?}"
        );
    }

    #[test]
    fn json_nulls_are_absent_fields() {
        let text = r#"{"nfs": {"server": "s", "path": "/", "readOnly": null}}"#;
        assert!(publish(made(types::VolumeSource::Json(text.into()))).is_ok());
    }

    #[test]
    fn delete_request_carries_the_pv_and_class() {
        let mut v = made(nfs());
        v.labels = vec![("example.com/tier".into(), "gold".into())];
        v.node_affinity = on_node("worker-1");
        let pv = publish(v).unwrap();
        let req = delete_request(&pv, Some(&class())).unwrap();
        assert_eq!(req.volume.name, "pvc-1234");
        assert_eq!(req.volume.capacity_bytes, 10 << 30);
        assert_eq!(
            req.volume.labels,
            vec![("example.com/tier".to_string(), "gold".to_string())]
        );
        assert!(
            req.volume
                .annotations
                .contains(&(names::ANN_PROVISIONED_BY.to_string(), OURS.to_string()))
        );
        assert_eq!(req.volume.claim_namespace.as_deref(), Some("ns"));
        assert_eq!(req.volume.claim_name.as_deref(), Some("data"));
        assert_eq!(req.volume.node_affinity.len(), 1);
        assert_eq!(
            req.volume.node_affinity[0].match_expressions[0].values,
            vec!["worker-1".to_string()]
        );
        assert_eq!(req.class_name, "fast");
        // Reserved parameters stay with the host.
        assert_eq!(
            req.class_parameters,
            vec![("root".to_string(), "/srv/volumes".to_string())]
        );

        let req = delete_request(&pv, None).unwrap();
        assert_eq!(req.class_name, "fast");
        assert!(req.class_parameters.is_empty());
    }

    #[test]
    fn delete_request_refuses_pvs_without_exactly_one_source() {
        let mut pv = publish(made(nfs())).unwrap();
        pv.spec.as_mut().unwrap().nfs = None;
        assert_eq!(
            delete_request(&pv, None).unwrap_err(),
            Error::NoSource {
                volume: "pvc-1234".into()
            }
        );
        pv.spec.as_mut().unwrap().host_path = Some(HostPathVolumeSource {
            path: "/a".into(),
            type_: None,
        });
        pv.spec.as_mut().unwrap().local = Some(LocalVolumeSource {
            path: "/b".into(),
            fs_type: None,
        });
        assert!(matches!(
            delete_request(&pv, None),
            Err(Error::SeveralSources { sources, .. }) if sources == "hostPath, local"
        ));
    }

    #[test]
    fn delete_request_refuses_a_bad_capacity() {
        let mut pv = publish(made(nfs())).unwrap();
        pv.spec.as_mut().unwrap().capacity = Some(BTreeMap::from([(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("ten".into()),
        )]));
        assert!(matches!(
            delete_request(&pv, None),
            Err(Error::Capacity { .. })
        ));
        pv.spec.as_mut().unwrap().capacity = None;
        assert_eq!(delete_request(&pv, None).unwrap().volume.capacity_bytes, 0);
    }
}
