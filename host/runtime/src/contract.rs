//! Conversions between the rules' contract types (`wasm_provisioner_rules::types`, what
//! the rest of the host speaks) and the bindings wasmtime generates from the WIT
//! (`bindings::types`, what a guest call takes and returns).
//!
//! Every record is converted field by field by name and every enum or variant case by
//! case, both ways: a field or case the two sides do not share fails to compile.

use wasm_provisioner_rules::types as rules;

use crate::bindings::types as wit;

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
same!(String, bool, u64, i32);

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

/// A record, both ways.
macro_rules! record {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl Mirror<wit::$name> for rules::$name {
            fn mirror(self) -> wit::$name {
                wit::$name { $($field: self.$field.mirror()),* }
            }
        }
        impl Mirror<rules::$name> for wit::$name {
            fn mirror(self) -> rules::$name {
                rules::$name { $($field: self.$field.mirror()),* }
            }
        }
    };
}

/// An enum (cases without payload) or a variant (cases with one), both ways.
macro_rules! cases {
    ($name:ident { $($case:ident),* $(,)? }) => {
        impl Mirror<wit::$name> for rules::$name {
            fn mirror(self) -> wit::$name {
                match self { $(rules::$name::$case => wit::$name::$case),* }
            }
        }
        impl Mirror<rules::$name> for wit::$name {
            fn mirror(self) -> rules::$name {
                match self { $(wit::$name::$case => rules::$name::$case),* }
            }
        }
    };
    ($name:ident { $($case:ident(_)),* $(,)? }) => {
        impl Mirror<wit::$name> for rules::$name {
            fn mirror(self) -> wit::$name {
                match self { $(rules::$name::$case(x) => wit::$name::$case(x.mirror())),* }
            }
        }
        impl Mirror<rules::$name> for wit::$name {
            fn mirror(self) -> rules::$name {
                match self { $(wit::$name::$case(x) => rules::$name::$case(x.mirror())),* }
            }
        }
    };
}

record!(PluginInfo {
    name,
    version,
    supports_block,
    data_source_kinds
});
cases!(AccessMode {
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod
});
cases!(VolumeMode { Filesystem, Block });
record!(DataSource {
    api_group,
    kind,
    name,
    namespace
});
record!(LabelRequirement {
    key,
    operator,
    values
});
record!(LabelSelector {
    match_labels,
    match_expressions
});
record!(Claim {
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
cases!(ReclaimPolicy {
    Delete,
    Retain,
    Recycle
});
cases!(BindingMode {
    Immediate,
    WaitForFirstConsumer
});
record!(TopologyRequirement { key, values });
record!(TopologyTerm { requirements });
record!(Class {
    name,
    parameters,
    reclaim_policy,
    mount_options,
    allowed_topologies,
    binding_mode,
});
record!(Node { name, labels });
record!(ProvisionRequest {
    volume_name,
    claim,
    class,
    selected_node
});
record!(HostPathSource { path, path_type });
record!(LocalSource { path, fs_type });
record!(NfsSource {
    server,
    path,
    read_only
});
record!(CsiSource {
    driver,
    volume_handle,
    fs_type,
    read_only,
    volume_attributes
});
record!(IscsiSource {
    target_portal,
    iqn,
    lun,
    iscsi_interface,
    fs_type,
    read_only,
    portals
});
cases!(VolumeSource { HostPath(_), Local(_), Nfs(_), Csi(_), Iscsi(_), Json(_) });
record!(NodeSelectorRequirement {
    key,
    operator,
    values
});
record!(NodeSelectorTerm { match_expressions });
record!(Volume {
    capacity_bytes,
    source,
    node_affinity,
    labels,
    annotations,
    mount_options,
    volume_mode,
});
cases!(ProvisionError { Ignored(_), Failed(_), InBackground(_), Reschedule(_), Infeasible(_) });
record!(PublishedVolume {
    name,
    source,
    capacity_bytes,
    labels,
    annotations,
    node_affinity,
    claim_namespace,
    claim_name,
});
record!(DeleteRequest {
    volume,
    class_name,
    class_parameters
});
cases!(DeleteError { Ignored(_), Failed(_), InBackground(_) });

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
            },
            selected_node: Some(rules::Node {
                name: "worker-1".into(),
                labels: map(&[("kubernetes.io/hostname", "worker-1")]),
            }),
        };
        let there: wit::ProvisionRequest = request.clone().mirror();
        let back: rules::ProvisionRequest = there.mirror();
        assert_eq!(back, request);
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
            };
            let there: wit::DeleteRequest = delete.clone().mirror();
            assert_eq!(Mirror::<rules::DeleteRequest>::mirror(there), delete);

            let volume = wit::Volume {
                capacity_bytes: 7,
                source: source.clone().mirror(),
                node_affinity: affinity().mirror(),
                labels: map(&[("l", "1")]),
                annotations: vec![],
                mount_options: vec!["ro".into()],
                volume_mode: Some(wit::VolumeMode::Filesystem),
            };
            let answer: rules::Volume = volume.mirror();
            assert_eq!(answer.source, source);
            assert_eq!(answer.node_affinity, affinity());
            assert_eq!(answer.volume_mode, Some(rules::VolumeMode::Filesystem));
        }
        let errors = [
            wit::ProvisionError::Ignored("i".into()),
            wit::ProvisionError::Failed("f".into()),
            wit::ProvisionError::InBackground("b".into()),
            wit::ProvisionError::Reschedule("r".into()),
            wit::ProvisionError::Infeasible("n".into()),
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
        let info = wit::PluginInfo {
            name: "hostpath".into(),
            version: "1.0.0".into(),
            supports_block: false,
            data_source_kinds: vec!["PersistentVolumeClaim".into()],
        };
        let mirrored: rules::PluginInfo = info.mirror();
        assert_eq!(mirrored.data_source_kinds, ["PersistentVolumeClaim"]);
        let delete_error: rules::DeleteError = wit::DeleteError::InBackground("x".into()).mirror();
        assert_eq!(delete_error, rules::DeleteError::InBackground("x".into()));
    }
}
