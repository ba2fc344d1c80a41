//! Turning a claim, its StorageClass and the selected node into the plugin's
//! `provision-request`.
//!
//! This is the one place Kubernetes objects become the WIT types a plugin sees: the PV
//! name (`pvc-<claim uid>`, the idempotency key), the claim's sizes in bytes, its access
//! and volume modes as enums, its data source (`dataSourceRef` preferred over
//! `dataSource`), the class's settings with the upstream defaults filled in (reclaim
//! policy Delete, binding mode Immediate) and the host's reserved parameters taken out.
//! Anything the contract cannot express faithfully (an unknown access mode, a size that
//! is not a quantity) is an error naming the object, never a silent guess.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::claim::ClaimView;
use crate::names;
use crate::quantity;
use crate::types;

/// Why a claim or class cannot be put to a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "claim {claim} has no metadata.uid; it cannot be provisioned until the API server assigns one"
    )]
    MissingUid { claim: String },
    #[error(
        "claim {claim} asks for access mode {value:?}, which this provisioner does not know; use ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod"
    )]
    UnknownAccessMode { claim: String, value: String },
    #[error("claim {claim} asks for volume mode {value:?}; use Filesystem or Block")]
    UnknownVolumeMode { claim: String, value: String },
    #[error("claim {claim} has an invalid {field}: {source}")]
    Size {
        claim: String,
        field: &'static str,
        source: quantity::Error,
    },
    #[error("storage class {class} has reclaimPolicy {value:?}; use Delete, Retain or Recycle")]
    UnknownReclaimPolicy { class: String, value: String },
    #[error(
        "storage class {class} has volumeBindingMode {value:?}; use Immediate or WaitForFirstConsumer"
    )]
    UnknownBindingMode { class: String, value: String },
}

impl Error {
    /// The metric label of this error: one per kind, bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::MissingUid { .. } => "missing_uid",
            Error::UnknownAccessMode { .. } => "unknown_access_mode",
            Error::UnknownVolumeMode { .. } => "unknown_volume_mode",
            Error::Size { .. } => "invalid_size",
            Error::UnknownReclaimPolicy { .. } => "unknown_reclaim_policy",
            Error::UnknownBindingMode { .. } => "unknown_binding_mode",
        }
    }
}

/// Builds the request a plugin's `should-provision` and `provision` receive.
pub fn provision_request(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: Option<&ObjectMeta>,
) -> Result<types::ProvisionRequest, Error> {
    let key = ClaimView(claim).key();
    let volume_name = ClaimView(claim)
        .volume_name()
        .ok_or_else(|| Error::MissingUid { claim: key.clone() })?;
    Ok(types::ProvisionRequest {
        volume_name,
        claim: claim_of(claim, &key)?,
        class: class_of(class)?,
        selected_node: node.map(node_of),
        // Filled in by the host where it reads Secrets and knows its node.
        secret: None,
        context: types::CallContext::default(),
    })
}

/// A StorageClass as a plugin sees it (`validate-class`, `get-capacity`, and inside
/// `provision-request`): the upstream defaults filled in, the reserved parameters out.
pub fn plugin_class(class: &StorageClass) -> Result<types::Class, Error> {
    class_of(class)
}

/// A class's parameters as a plugin sees them: without the host's reserved keys
/// (`module`, `moduleSHA256`), sorted by key.
pub fn plugin_parameters(class: &StorageClass) -> types::StringMap {
    class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !names::RESERVED_PARAMETERS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A Kubernetes access mode string as the WIT enum; none for an unknown one.
pub fn access_mode(value: &str) -> Option<types::AccessMode> {
    Some(match value {
        names::ACCESS_MODE_READ_WRITE_ONCE => types::AccessMode::ReadWriteOnce,
        names::ACCESS_MODE_READ_ONLY_MANY => types::AccessMode::ReadOnlyMany,
        names::ACCESS_MODE_READ_WRITE_MANY => types::AccessMode::ReadWriteMany,
        names::ACCESS_MODE_READ_WRITE_ONCE_POD => types::AccessMode::ReadWriteOncePod,
        _ => return None,
    })
}

/// A volume mode string (`spec.volumeMode`) as the WIT enum; absent means Filesystem.
pub fn volume_mode(value: Option<&str>) -> Option<types::VolumeMode> {
    match value {
        None | Some(names::VOLUME_MODE_FILESYSTEM) => Some(types::VolumeMode::Filesystem),
        Some(names::VOLUME_MODE_BLOCK) => Some(types::VolumeMode::Block),
        Some(_) => None,
    }
}

/// The WIT volume mode as the Kubernetes string.
pub fn volume_mode_str(mode: types::VolumeMode) -> &'static str {
    match mode {
        types::VolumeMode::Filesystem => names::VOLUME_MODE_FILESYSTEM,
        types::VolumeMode::Block => names::VOLUME_MODE_BLOCK,
    }
}

fn claim_of(claim: &PersistentVolumeClaim, key: &str) -> Result<types::Claim, Error> {
    let meta = &claim.metadata;
    let spec = claim.spec.clone().unwrap_or_default();

    let access_modes = spec
        .access_modes
        .iter()
        .flatten()
        .map(|m| {
            access_mode(m).ok_or_else(|| Error::UnknownAccessMode {
                claim: key.to_owned(),
                value: m.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let resources = spec.resources.unwrap_or_default();
    let size = |map: Option<&BTreeMap<String, Quantity>>,
                field: &'static str|
     -> Result<Option<u64>, Error> {
        map.and_then(|m| m.get(names::RESOURCE_STORAGE))
            .map(|q| {
                quantity::quantity_bytes(q).map_err(|source| Error::Size {
                    claim: key.to_owned(),
                    field,
                    source,
                })
            })
            .transpose()
    };
    let requested_bytes = size(
        resources.requests.as_ref(),
        "spec.resources.requests.storage",
    )?
    .unwrap_or(0);
    let limit_bytes = size(resources.limits.as_ref(), "spec.resources.limits.storage")?;

    let volume_mode =
        volume_mode(spec.volume_mode.as_deref()).ok_or_else(|| Error::UnknownVolumeMode {
            claim: key.to_owned(),
            value: spec.volume_mode.clone().unwrap_or_default(),
        })?;

    let data_source = match (spec.data_source_ref, spec.data_source) {
        (Some(r), _) => Some(types::DataSource {
            api_group: r.api_group.filter(|g| !g.is_empty()),
            kind: r.kind,
            name: r.name,
            namespace: r.namespace.filter(|n| !n.is_empty()),
        }),
        (None, Some(s)) => Some(types::DataSource {
            api_group: s.api_group.filter(|g| !g.is_empty()),
            kind: s.kind,
            name: s.name,
            namespace: None,
        }),
        (None, None) => None,
    };

    let selector = spec.selector.map(|s| types::LabelSelector {
        match_labels: string_map(s.match_labels.as_ref()),
        match_expressions: s
            .match_expressions
            .into_iter()
            .flatten()
            .map(|r| types::LabelRequirement {
                key: r.key,
                operator: r.operator,
                values: r.values.unwrap_or_default(),
            })
            .collect(),
    });

    Ok(types::Claim {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: string_map(meta.labels.as_ref()),
        annotations: string_map(meta.annotations.as_ref()),
        access_modes,
        requested_bytes,
        limit_bytes,
        volume_mode,
        data_source,
        selector,
    })
}

/// A StorageClass as a plugin sees it (`validate-class`, `get-capacity`, and the class of
/// a `provision-request`).
pub fn class_of(class: &StorageClass) -> Result<types::Class, Error> {
    let name = class.metadata.name.clone().unwrap_or_default();
    let reclaim_policy = match class.reclaim_policy.as_deref() {
        None | Some(names::RECLAIM_DELETE) => types::ReclaimPolicy::Delete,
        Some(names::RECLAIM_RETAIN) => types::ReclaimPolicy::Retain,
        Some(names::RECLAIM_RECYCLE) => types::ReclaimPolicy::Recycle,
        Some(other) => {
            return Err(Error::UnknownReclaimPolicy {
                class: name,
                value: other.to_owned(),
            });
        }
    };
    let binding_mode = match class.volume_binding_mode.as_deref() {
        None | Some(names::BINDING_IMMEDIATE) => types::BindingMode::Immediate,
        Some(names::BINDING_WAIT_FOR_FIRST_CONSUMER) => types::BindingMode::WaitForFirstConsumer,
        Some(other) => {
            return Err(Error::UnknownBindingMode {
                class: name,
                value: other.to_owned(),
            });
        }
    };
    let allowed_topologies = class
        .allowed_topologies
        .iter()
        .flatten()
        .map(|term| types::TopologyTerm {
            requirements: term
                .match_label_expressions
                .iter()
                .flatten()
                .map(|r| types::TopologyRequirement {
                    key: r.key.clone(),
                    values: r.values.clone(),
                })
                .collect(),
        })
        .collect();
    Ok(types::Class {
        parameters: plugin_parameters(class),
        reclaim_policy,
        mount_options: class.mount_options.clone().unwrap_or_default(),
        allowed_topologies,
        binding_mode,
        allow_volume_expansion: class.allow_volume_expansion.unwrap_or(false),
        name,
    })
}

/// The selected node as the plugin sees it: its name and labels (all the host keeps of
/// a node: its store is a metadata-only watch).
fn node_of(node: &ObjectMeta) -> types::Node {
    types::Node {
        name: node.name.clone().unwrap_or_default(),
        labels: string_map(node.labels.as_ref()),
    }
}

/// A Kubernetes string map as the WIT `string-map`, sorted by key.
pub fn string_map(map: Option<&BTreeMap<String, String>>) -> types::StringMap {
    map.into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Node, PersistentVolumeClaimSpec, TopologySelectorLabelRequirement, TopologySelectorTerm,
        TypedLocalObjectReference, TypedObjectReference, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A claim `ns/data` (uid `1234`) for 10Gi, ReadWriteOnce, class `fast`, handed to
    /// the default provisioner.
    pub(crate) fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("ns".into()),
                uid: Some("1234".into()),
                resource_version: Some("42".into()),
                labels: Some(map(&[("app", "db")])),
                annotations: Some(map(&[(
                    names::ANN_STORAGE_PROVISIONER,
                    names::DEFAULT_PROVISIONER_NAME,
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some("fast".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("10Gi".into()))].into()),
                    limits: None,
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Class `fast` served by the default provisioner, module `hostpath`.
    pub(crate) fn class() -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("fast".into()),
                ..Default::default()
            },
            provisioner: names::DEFAULT_PROVISIONER_NAME.into(),
            parameters: Some(map(&[
                (names::PARAM_MODULE, "hostpath"),
                (names::PARAM_MODULE_SHA256, "abc123"),
                ("root", "/srv/volumes"),
            ])),
            ..Default::default()
        }
    }

    fn spec(claim: &mut PersistentVolumeClaim) -> &mut PersistentVolumeClaimSpec {
        claim.spec.as_mut().unwrap()
    }

    fn request(claim: &PersistentVolumeClaim) -> types::ProvisionRequest {
        provision_request(claim, &class(), None).unwrap()
    }

    #[test]
    fn volume_name_is_pvc_dash_uid() {
        assert_eq!(
            ClaimView(&claim()).volume_name().as_deref(),
            Some("pvc-1234")
        );
        assert_eq!(request(&claim()).volume_name, "pvc-1234");
        let mut no_uid = claim();
        no_uid.metadata.uid = None;
        assert_eq!(ClaimView(&no_uid).volume_name(), None);
        no_uid.metadata.uid = Some(String::new());
        assert_eq!(ClaimView(&no_uid).volume_name(), None);
        let err = provision_request(&no_uid, &class(), None).unwrap_err();
        assert_eq!(
            err,
            Error::MissingUid {
                claim: "ns/data".into()
            }
        );
    }

    #[test]
    fn class_name_prefers_the_legacy_annotation() {
        let mut c = claim();
        assert_eq!(ClaimView(&c).class_name().as_deref(), Some("fast"));
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert(names::ANN_BETA_STORAGE_CLASS.into(), "legacy".into());
        assert_eq!(ClaimView(&c).class_name().as_deref(), Some("legacy"));
        // Present but empty still wins, as in Kubernetes: it means "no class".
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert(names::ANN_BETA_STORAGE_CLASS.into(), String::new());
        assert_eq!(ClaimView(&c).class_name(), None);
        let mut c = claim();
        spec(&mut c).storage_class_name = None;
        assert_eq!(ClaimView(&c).class_name(), None);
        spec(&mut c).storage_class_name = Some(String::new());
        assert_eq!(ClaimView(&c).class_name(), None);
    }

    #[test]
    fn claim_fields_are_carried_over() {
        let req = request(&claim());
        let c = &req.claim;
        assert_eq!(
            (c.name.as_str(), c.namespace.as_str(), c.uid.as_str()),
            ("data", "ns", "1234")
        );
        assert_eq!(c.labels, vec![("app".to_string(), "db".to_string())]);
        assert_eq!(
            c.annotations,
            vec![(
                names::ANN_STORAGE_PROVISIONER.to_string(),
                names::DEFAULT_PROVISIONER_NAME.to_string()
            )]
        );
        assert_eq!(c.requested_bytes, 10 << 30);
        assert_eq!(c.limit_bytes, None);
        assert!(matches!(c.volume_mode, types::VolumeMode::Filesystem));
        assert!(c.data_source.is_none());
        assert!(c.selector.is_none());
        assert!(req.selected_node.is_none());
    }

    #[test]
    fn every_access_mode_maps_and_unknown_ones_are_refused() {
        let mut c = claim();
        spec(&mut c).access_modes = Some(vec![
            "ReadWriteOnce".into(),
            "ReadOnlyMany".into(),
            "ReadWriteMany".into(),
            "ReadWriteOncePod".into(),
        ]);
        let modes = request(&c).claim.access_modes;
        assert!(matches!(
            modes.as_slice(),
            [
                types::AccessMode::ReadWriteOnce,
                types::AccessMode::ReadOnlyMany,
                types::AccessMode::ReadWriteMany,
                types::AccessMode::ReadWriteOncePod
            ]
        ));
        spec(&mut c).access_modes = Some(vec!["ReadWriteOnce".into(), "ReadWriteSometimes".into()]);
        let err = provision_request(&c, &class(), None).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownAccessMode {
                claim: "ns/data".into(),
                value: "ReadWriteSometimes".into()
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("ns/data") && message.contains("ReadWriteSometimes"),
            "{message}"
        );
    }

    #[test]
    fn sizes_are_parsed_to_bytes() {
        let mut c = claim();
        spec(&mut c).resources = Some(VolumeResourceRequirements {
            requests: Some([("storage".to_string(), Quantity("1.5G".into()))].into()),
            limits: Some([("storage".to_string(), Quantity("2Gi".into()))].into()),
        });
        let req = request(&c);
        assert_eq!(req.claim.requested_bytes, 1_500_000_000);
        assert_eq!(req.claim.limit_bytes, Some(2 << 30));
    }

    #[test]
    fn absent_request_is_zero_bytes() {
        let mut c = claim();
        spec(&mut c).resources = None;
        assert_eq!(request(&c).claim.requested_bytes, 0);
        spec(&mut c).resources = Some(VolumeResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("1".into()))].into()),
            limits: None,
        });
        assert_eq!(request(&c).claim.requested_bytes, 0);
    }

    #[test]
    fn bad_sizes_are_errors_naming_the_claim_and_field() {
        for (requests, limits, field) in [
            ("-1Gi", "1Gi", "spec.resources.requests.storage"),
            ("lots", "1Gi", "spec.resources.requests.storage"),
            ("1Gi", "1GB", "spec.resources.limits.storage"),
        ] {
            let mut c = claim();
            spec(&mut c).resources = Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity(requests.into()))].into()),
                limits: Some([("storage".to_string(), Quantity(limits.into()))].into()),
            });
            let err = provision_request(&c, &class(), None).unwrap_err();
            assert!(
                matches!(&err, Error::Size { claim, field: f, .. } if claim == "ns/data" && *f == field),
                "{err:?}"
            );
            assert!(err.to_string().contains("ns/data"), "{err}");
        }
    }

    #[test]
    fn volume_mode_maps_and_defaults_to_filesystem() {
        let mut c = claim();
        spec(&mut c).volume_mode = Some("Block".into());
        assert!(matches!(
            request(&c).claim.volume_mode,
            types::VolumeMode::Block
        ));
        spec(&mut c).volume_mode = Some("Filesystem".into());
        assert!(matches!(
            request(&c).claim.volume_mode,
            types::VolumeMode::Filesystem
        ));
        spec(&mut c).volume_mode = Some("Tape".into());
        assert_eq!(
            provision_request(&c, &class(), None).unwrap_err(),
            Error::UnknownVolumeMode {
                claim: "ns/data".into(),
                value: "Tape".into()
            }
        );
    }

    #[test]
    fn data_source_ref_is_preferred_over_data_source() {
        let mut c = claim();
        spec(&mut c).data_source = Some(TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "old".into(),
        });
        let ds = request(&c).claim.data_source.unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("PersistentVolumeClaim", "old")
        );
        assert_eq!((ds.api_group, ds.namespace), (None, None));
        assert_eq!(
            ClaimView(&c).data_source_kind(),
            Some("PersistentVolumeClaim")
        );

        spec(&mut c).data_source_ref = Some(TypedObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: "snap".into(),
            namespace: Some("other".into()),
        });
        let ds = request(&c).claim.data_source.unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("VolumeSnapshot", "snap")
        );
        assert_eq!(ds.api_group.as_deref(), Some("snapshot.storage.k8s.io"));
        assert_eq!(ds.namespace.as_deref(), Some("other"));
        assert_eq!(ClaimView(&c).data_source_kind(), Some("VolumeSnapshot"));
    }

    #[test]
    fn empty_api_group_means_the_core_group() {
        let mut c = claim();
        spec(&mut c).data_source = Some(TypedLocalObjectReference {
            api_group: Some(String::new()),
            kind: "PersistentVolumeClaim".into(),
            name: "src".into(),
        });
        assert_eq!(request(&c).claim.data_source.unwrap().api_group, None);
    }

    #[test]
    fn selector_is_carried_over() {
        let mut c = claim();
        spec(&mut c).selector = Some(LabelSelector {
            match_labels: Some(map(&[("tier", "gold")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            }]),
        });
        let sel = request(&c).claim.selector.unwrap();
        assert_eq!(
            sel.match_labels,
            vec![("tier".to_string(), "gold".to_string())]
        );
        assert_eq!(sel.match_expressions.len(), 1);
        let r = &sel.match_expressions[0];
        assert_eq!((r.key.as_str(), r.operator.as_str()), ("zone", "In"));
        assert_eq!(r.values, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn class_defaults_and_reserved_parameters() {
        let req = request(&claim());
        let k = &req.class;
        assert_eq!(k.name, "fast");
        assert_eq!(
            k.parameters,
            vec![("root".to_string(), "/srv/volumes".to_string())]
        );
        assert!(matches!(k.reclaim_policy, types::ReclaimPolicy::Delete));
        assert!(matches!(k.binding_mode, types::BindingMode::Immediate));
        assert!(k.mount_options.is_empty());
        assert!(k.allowed_topologies.is_empty());
    }

    #[test]
    fn class_settings_are_carried_over() {
        let mut k = class();
        k.reclaim_policy = Some("Retain".into());
        k.volume_binding_mode = Some("WaitForFirstConsumer".into());
        k.mount_options = Some(vec!["noatime".into()]);
        k.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: "topology.kubernetes.io/zone".into(),
                values: vec!["z1".into(), "z2".into()],
            }]),
        }]);
        let req = provision_request(&claim(), &k, None).unwrap();
        assert!(matches!(
            req.class.reclaim_policy,
            types::ReclaimPolicy::Retain
        ));
        assert!(matches!(
            req.class.binding_mode,
            types::BindingMode::WaitForFirstConsumer
        ));
        assert_eq!(req.class.mount_options, vec!["noatime".to_string()]);
        let term = &req.class.allowed_topologies[0];
        assert_eq!(term.requirements[0].key, "topology.kubernetes.io/zone");
        assert_eq!(
            term.requirements[0].values,
            vec!["z1".to_string(), "z2".to_string()]
        );

        k.reclaim_policy = Some("Recycle".into());
        let req = provision_request(&claim(), &k, None).unwrap();
        assert!(matches!(
            req.class.reclaim_policy,
            types::ReclaimPolicy::Recycle
        ));
    }

    #[test]
    fn unknown_class_enums_are_errors_naming_the_class() {
        let mut k = class();
        k.reclaim_policy = Some("Shred".into());
        let err = provision_request(&claim(), &k, None).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownReclaimPolicy {
                class: "fast".into(),
                value: "Shred".into()
            }
        );
        let mut k = class();
        k.volume_binding_mode = Some("Later".into());
        let err = provision_request(&claim(), &k, None).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownBindingMode {
                class: "fast".into(),
                value: "Later".into()
            }
        );
    }

    #[test]
    fn selected_node_name_and_labels() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                labels: Some(map(&[("kubernetes.io/hostname", "worker-1")])),
                ..Default::default()
            },
            ..Default::default()
        };
        let req = provision_request(&claim(), &class(), Some(&node.metadata)).unwrap();
        let n = req.selected_node.unwrap();
        assert_eq!(n.name, "worker-1");
        assert_eq!(
            n.labels,
            vec![("kubernetes.io/hostname".to_string(), "worker-1".to_string())]
        );
    }
}
