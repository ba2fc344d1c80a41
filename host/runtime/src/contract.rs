//! Conversions between the rules' contract types (`wasm_provisioner_rules::types`, what
//! the rest of the host speaks) and the bindings wasmtime generates from the WIT
//! (`bindings::v1::types` and `bindings::v2::types`, what a guest call takes and
//! returns).
//!
//! Every record is converted field by field by name and every enum or variant case by
//! case, both ways: a field or case the two sides do not share fails to compile. The
//! rules' types are 0.2's; the few fields 0.1 lacks are named where its conversions are
//! declared: dropped on the way to a 0.1 guest, their default on the way back.

use wasm_provisioner_rules::types as rules;

use crate::bindings::v1::types as v1;
use crate::bindings::v2::types as v2;

/// A value converted to its twin on the other side of the contract.
pub(crate) trait Mirror<T> {
    fn mirror(self) -> T;
}

macro_rules! same {
    ($($t:ty),*) => {$(
        impl Mirror<$t> for $t {
            fn mirror(self) -> $t {
                self
            }
        }
    )*};
}
same!(String, bool, u64, i32, u8);

impl<A: Mirror<B>, B> Mirror<Vec<B>> for Vec<A> {
    fn mirror(self) -> Vec<B> {
        self.into_iter().map(Mirror::mirror).collect()
    }
}

impl<A: Mirror<B>, B> Mirror<Option<B>> for Option<A> {
    fn mirror(self) -> Option<B> {
        self.map(Mirror::mirror)
    }
}

impl<A: Mirror<C>, B: Mirror<D>, C, D> Mirror<(C, D)> for (A, B) {
    fn mirror(self) -> (C, D) {
        (self.0.mirror(), self.1.mirror())
    }
}

/// A record, both ways, for each contract version named. Fields after `+` exist only
/// in the rules' type: left out on the way to the guest, defaulted on the way back.
macro_rules! record {
    ([$($wit:ident),+] $name:ident $fields:tt) => {
        $( record!(@one $wit $name $fields {}); )+
    };
    ([$($wit:ident),+] $name:ident $fields:tt + $extra:tt) => {
        $( record!(@one $wit $name $fields $extra); )+
    };
    (@one $wit:ident $name:ident { $($field:ident),* $(,)? } { $($extra:ident),* $(,)? }) => {
        impl Mirror<$wit::$name> for rules::$name {
            fn mirror(self) -> $wit::$name {
                $wit::$name { $($field: self.$field.mirror()),* }
            }
        }
        impl Mirror<rules::$name> for $wit::$name {
            fn mirror(self) -> rules::$name {
                rules::$name {
                    $($field: self.$field.mirror(),)*
                    $($extra: Default::default(),)*
                }
            }
        }
    };
}

/// An enum (cases without payload) or a variant (cases with one), both ways, for each
/// contract version named.
macro_rules! cases {
    ([$($wit:ident),+] $name:ident $cases:tt) => {
        $( cases!(@one $wit $name $cases); )+
    };
    (@one $wit:ident $name:ident { $($case:ident),* $(,)? }) => {
        impl Mirror<$wit::$name> for rules::$name {
            fn mirror(self) -> $wit::$name {
                match self { $(rules::$name::$case => $wit::$name::$case),* }
            }
        }
        impl Mirror<rules::$name> for $wit::$name {
            fn mirror(self) -> rules::$name {
                match self { $($wit::$name::$case => rules::$name::$case),* }
            }
        }
    };
    (@one $wit:ident $name:ident { $($case:ident(_)),* $(,)? }) => {
        impl Mirror<$wit::$name> for rules::$name {
            fn mirror(self) -> $wit::$name {
                match self { $(rules::$name::$case(x) => $wit::$name::$case(x.mirror())),* }
            }
        }
        impl Mirror<rules::$name> for $wit::$name {
            fn mirror(self) -> rules::$name {
                match self { $($wit::$name::$case(x) => rules::$name::$case(x.mirror())),* }
            }
        }
    };
}

// What 0.1 lacks.
record!([v1] PluginInfo { name, version, supports_block, data_source_kinds } + { capabilities });
record!([v1] Class {
    name,
    parameters,
    reclaim_policy,
    mount_options,
    allowed_topologies,
    binding_mode,
} + { allow_volume_expansion });
record!([v1] ProvisionRequest { volume_name, claim, class, selected_node } + { secret, context });
record!([v1] DeleteRequest { volume, class_name, class_parameters } + { secret, context });

// 0.2 only.
record!([v2] PluginInfo {
    name,
    version,
    supports_block,
    data_source_kinds,
    capabilities
});
cases!([v2] Capability { Expand, ReportCapacity, ValidateClass });
record!([v2] Class {
    name,
    parameters,
    reclaim_policy,
    mount_options,
    allowed_topologies,
    binding_mode,
    allow_volume_expansion,
});
record!([v2] Secret { namespace, name, data });
record!([v2] CallContext { node });
record!([v2] ProvisionRequest {
    volume_name,
    claim,
    class,
    selected_node,
    secret,
    context
});
record!([v2] DeleteRequest {
    volume,
    class_name,
    class_parameters,
    secret,
    context
});
record!([v2] ExpandRequest {
    volume,
    class_name,
    class_parameters,
    requested_bytes,
    secret,
    context
});
cases!([v2] ExpandError { Failed(_), InBackground(_), Infeasible(_) });
record!([v2] CapacityRequest { class, node, context });
record!([v2] BackendCapacity {
    total_bytes,
    available_bytes,
    maximum_volume_bytes
});

// The same in both.
cases!([v1, v2] AccessMode {
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod
});
cases!([v1, v2] VolumeMode { Filesystem, Block });
record!([v1, v2] DataSource {
    api_group,
    kind,
    name,
    namespace
});
record!([v1, v2] LabelRequirement {
    key,
    operator,
    values
});
record!([v1, v2] LabelSelector {
    match_labels,
    match_expressions
});
record!([v1, v2] Claim {
    name,
    namespace,
    uid,
    labels,
    annotations,
    access_modes,
    requested_bytes,
    limit_bytes,
    volume_mode,
    data_source,
    selector,
});
cases!([v1, v2] ReclaimPolicy {
    Delete,
    Retain,
    Recycle
});
cases!([v1, v2] BindingMode {
    Immediate,
    WaitForFirstConsumer
});
record!([v1, v2] TopologyRequirement { key, values });
record!([v1, v2] TopologyTerm { requirements });
record!([v1, v2] Node { name, labels });
record!([v1, v2] HostPathSource { path, path_type });
record!([v1, v2] LocalSource { path, fs_type });
record!([v1, v2] NfsSource {
    server,
    path,
    read_only
});
record!([v1, v2] CsiSource {
    driver,
    volume_handle,
    fs_type,
    read_only,
    volume_attributes
});
record!([v1, v2] IscsiSource {
    target_portal,
    iqn,
    lun,
    iscsi_interface,
    fs_type,
    read_only,
    portals
});
cases!([v1, v2] VolumeSource { HostPath(_), Local(_), Nfs(_), Csi(_), Iscsi(_), Json(_) });
record!([v1, v2] NodeSelectorRequirement {
    key,
    operator,
    values
});
record!([v1, v2] NodeSelectorTerm { match_expressions });
record!([v1, v2] Volume {
    capacity_bytes,
    source,
    node_affinity,
    labels,
    annotations,
    mount_options,
    volume_mode,
});
cases!([v1, v2] ProvisionError { Ignored(_), Failed(_), InBackground(_), Reschedule(_), Infeasible(_) });
record!([v1, v2] PublishedVolume {
    name,
    source,
    capacity_bytes,
    labels,
    annotations,
    node_affinity,
    claim_namespace,
    claim_name,
});
cases!([v1, v2] DeleteError { Ignored(_), Failed(_), InBackground(_) });

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> rules::StringMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn affinity() -> Vec<rules::NodeSelectorTerm> {
        vec![rules::NodeSelectorTerm {
            match_expressions: vec![rules::NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: "In".into(),
                values: vec!["worker-1".into()],
            }],
        }]
    }

    /// Every field of a request survives the trip to the bindings and back.
    #[test]
    fn a_provision_request_survives_the_round_trip() {
        let request = rules::ProvisionRequest {
            volume_name: "pvc-1".into(),
            claim: rules::Claim {
                name: "data".into(),
                namespace: "ns".into(),
                uid: "u-1".into(),
                labels: map(&[("app", "db")]),
                annotations: map(&[("note", "x")]),
                access_modes: vec![
                    rules::AccessMode::ReadWriteOnce,
                    rules::AccessMode::ReadWriteOncePod,
                ],
                requested_bytes: 1 << 30,
                limit_bytes: Some(2 << 30),
                volume_mode: rules::VolumeMode::Block,
                data_source: Some(rules::DataSource {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: "snap".into(),
                    namespace: None,
                }),
                selector: Some(rules::LabelSelector {
                    match_labels: map(&[("tier", "gold")]),
                    match_expressions: vec![rules::LabelRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: vec!["a".into(), "b".into()],
                    }],
                }),
            },
            class: rules::Class {
                name: "fast".into(),
                parameters: map(&[("pathPattern", "x")]),
                reclaim_policy: rules::ReclaimPolicy::Retain,
                mount_options: vec!["noatime".into()],
                allowed_topologies: vec![rules::TopologyTerm {
                    requirements: vec![rules::TopologyRequirement {
                        key: "zone".into(),
                        values: vec!["a".into()],
                    }],
                }],
                binding_mode: rules::BindingMode::WaitForFirstConsumer,
                allow_volume_expansion: true,
            },
            selected_node: Some(rules::Node {
                name: "worker-1".into(),
                labels: map(&[("kubernetes.io/hostname", "worker-1")]),
            }),
            secret: Some(secret()),
            context: rules::CallContext {
                node: Some("worker-1".into()),
            },
        };
        let there: v2::ProvisionRequest = request.clone().mirror();
        let back: rules::ProvisionRequest = there.mirror();
        assert_eq!(back, request);

        // A 0.1 guest gets all but what 0.1 lacks.
        let there: v1::ProvisionRequest = request.clone().mirror();
        let back: rules::ProvisionRequest = there.mirror();
        let mut without = request;
        without.secret = None;
        without.context = rules::CallContext::default();
        without.class.allow_volume_expansion = false;
        assert_eq!(back, without);
    }

    fn secret() -> rules::Secret {
        rules::Secret {
            namespace: "storage".into(),
            name: "api-token".into(),
            data: vec![("token".into(), b"s3cr3t".to_vec())],
        }
    }

    /// The 0.2 requests and answers of the optional capabilities survive the round trip.
    #[test]
    fn capability_requests_and_answers_survive_the_round_trip() {
        let expand = rules::ExpandRequest {
            volume: rules::PublishedVolume {
                name: "pvc-1".into(),
                source: rules::VolumeSource::Json("{}".into()),
                capacity_bytes: 1 << 30,
                labels: vec![],
                annotations: map(&[("a", "b")]),
                node_affinity: affinity(),
                claim_namespace: Some("ns".into()),
                claim_name: Some("data".into()),
            },
            class_name: "fast".into(),
            class_parameters: map(&[("maxSize", "10Gi")]),
            requested_bytes: 2 << 30,
            secret: Some(secret()),
            context: rules::CallContext { node: None },
        };
        let there: v2::ExpandRequest = expand.clone().mirror();
        assert_eq!(Mirror::<rules::ExpandRequest>::mirror(there), expand);
        for (error, want) in [
            (
                v2::ExpandError::Failed("f".into()),
                rules::ExpandError::Failed("f".into()),
            ),
            (
                v2::ExpandError::InBackground("b".into()),
                rules::ExpandError::InBackground("b".into()),
            ),
            (
                v2::ExpandError::Infeasible("n".into()),
                rules::ExpandError::Infeasible("n".into()),
            ),
        ] {
            assert_eq!(Mirror::<rules::ExpandError>::mirror(error), want);
        }
        let capacity = v2::BackendCapacity {
            total_bytes: 10,
            available_bytes: 4,
            maximum_volume_bytes: Some(3),
        };
        let capacity: rules::BackendCapacity = capacity.mirror();
        assert_eq!(
            capacity,
            rules::BackendCapacity {
                total_bytes: 10,
                available_bytes: 4,
                maximum_volume_bytes: Some(3)
            }
        );
        let info = v2::PluginInfo {
            name: "hostpath".into(),
            version: "2.0.0".into(),
            supports_block: false,
            data_source_kinds: vec![],
            capabilities: vec![
                v2::Capability::Expand,
                v2::Capability::ReportCapacity,
                v2::Capability::ValidateClass,
            ],
        };
        let info: rules::PluginInfo = info.mirror();
        assert_eq!(info.capabilities, rules::Capability::ALL);
    }

    /// Every source kind, and a delete request carrying one, survive the round trip;
    /// so do the answers' variants.
    #[test]
    fn sources_delete_requests_and_answers_survive_the_round_trip() {
        let sources = [
            rules::VolumeSource::HostPath(rules::HostPathSource {
                path: "/var/lib/x/pvc-1".into(),
                path_type: Some("DirectoryOrCreate".into()),
            }),
            rules::VolumeSource::Local(rules::LocalSource {
                path: "/mnt/pvc-1".into(),
                fs_type: Some("ext4".into()),
            }),
            rules::VolumeSource::Nfs(rules::NfsSource {
                server: "nfs".into(),
                path: "/export/pvc-1".into(),
                read_only: true,
            }),
            rules::VolumeSource::Csi(rules::CsiSource {
                driver: "d".into(),
                volume_handle: "h".into(),
                fs_type: None,
                read_only: false,
                volume_attributes: map(&[("a", "b")]),
            }),
            rules::VolumeSource::Iscsi(rules::IscsiSource {
                target_portal: "10.0.0.1:3260".into(),
                iqn: "iqn.x".into(),
                lun: -1,
                iscsi_interface: Some("default".into()),
                fs_type: Some("xfs".into()),
                read_only: true,
                portals: vec!["10.0.0.2:3260".into()],
            }),
            rules::VolumeSource::Json(r#"{"cephfs":{}}"#.into()),
        ];
        for source in sources {
            let delete = rules::DeleteRequest {
                volume: rules::PublishedVolume {
                    name: "pvc-1".into(),
                    source: source.clone(),
                    capacity_bytes: 5,
                    labels: map(&[("l", "1")]),
                    annotations: map(&[("a", "2")]),
                    node_affinity: affinity(),
                    claim_namespace: Some("ns".into()),
                    claim_name: None,
                },
                class_name: "fast".into(),
                class_parameters: map(&[("p", "v")]),
                secret: Some(secret()),
                context: rules::CallContext::default(),
            };
            let there: v2::DeleteRequest = delete.clone().mirror();
            assert_eq!(Mirror::<rules::DeleteRequest>::mirror(there), delete);
            let there: v1::DeleteRequest = delete.clone().mirror();
            let back: rules::DeleteRequest = there.mirror();
            assert_eq!(back.volume, delete.volume);
            assert_eq!(back.secret, None);

            let volume = v1::Volume {
                capacity_bytes: 7,
                source: source.clone().mirror(),
                node_affinity: affinity().mirror(),
                labels: map(&[("l", "1")]),
                annotations: vec![],
                mount_options: vec!["ro".into()],
                volume_mode: Some(v1::VolumeMode::Filesystem),
            };
            let answer: rules::Volume = volume.mirror();
            assert_eq!(answer.source, source);
            assert_eq!(answer.node_affinity, affinity());
            assert_eq!(answer.volume_mode, Some(rules::VolumeMode::Filesystem));
        }
        let errors = [
            v1::ProvisionError::Ignored("i".into()),
            v1::ProvisionError::Failed("f".into()),
            v1::ProvisionError::InBackground("b".into()),
            v1::ProvisionError::Reschedule("r".into()),
            v1::ProvisionError::Infeasible("n".into()),
        ];
        let expected = [
            rules::ProvisionError::Ignored("i".into()),
            rules::ProvisionError::Failed("f".into()),
            rules::ProvisionError::InBackground("b".into()),
            rules::ProvisionError::Reschedule("r".into()),
            rules::ProvisionError::Infeasible("n".into()),
        ];
        for (error, want) in errors.into_iter().zip(expected) {
            assert_eq!(Mirror::<rules::ProvisionError>::mirror(error), want);
        }
        let info = v1::PluginInfo {
            name: "hostpath".into(),
            version: "1.0.0".into(),
            supports_block: false,
            data_source_kinds: vec!["PersistentVolumeClaim".into()],
        };
        let mirrored: rules::PluginInfo = info.mirror();
        assert_eq!(mirrored.data_source_kinds, ["PersistentVolumeClaim"]);
        assert!(mirrored.capabilities.is_empty(), "0.1 has no capabilities");
        let delete_error: rules::DeleteError = v1::DeleteError::InBackground("x".into()).mirror();
        assert_eq!(delete_error, rules::DeleteError::InBackground("x".into()));
    }
}
