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
