//! Request builders for native unit tests of plugins.

use crate::types::*;

/// The claim UID used by [`provision_request`].
pub const CLAIM_UID: &str = "0b5c6f8e-7d1a-4c3b-9a2e-1f0d9c8b7a65";

/// A string map from pairs.
pub fn string_map(pairs: &[(&str, &str)]) -> StringMap {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A 1 GiB ReadWriteOnce filesystem claim `namespace/name` with [`CLAIM_UID`].
pub fn claim(namespace: &str, name: &str) -> Claim {
    Claim {
        name: name.to_string(),
        namespace: namespace.to_string(),
        uid: CLAIM_UID.to_string(),
        labels: Vec::new(),
        annotations: Vec::new(),
        access_modes: vec![AccessMode::ReadWriteOnce],
        requested_bytes: 1 << 30,
        limit_bytes: None,
        volume_mode: VolumeMode::Filesystem,
        data_source: None,
        selector: None,
    }
}

/// An Immediate class `test-class` with reclaim policy Delete, volume expansion allowed,
/// and `parameters`.
pub fn class(parameters: &[(&str, &str)]) -> Class {
    Class {
        name: "test-class".to_string(),
        parameters: string_map(parameters),
        reclaim_policy: ReclaimPolicy::Delete,
        mount_options: Vec::new(),
        allowed_topologies: Vec::new(),
        binding_mode: BindingMode::Immediate,
        allow_volume_expansion: true,
    }
}

/// A request for claim `default/data` ([`claim`]) in [`class`]`(parameters)`, volume
/// name `pvc-<CLAIM_UID>`, no selected node.
pub fn provision_request(parameters: &[(&str, &str)]) -> ProvisionRequest {
    ProvisionRequest {
        volume_name: format!("pvc-{CLAIM_UID}"),
        claim: claim("default", "data"),
        class: class(parameters),
        selected_node: None,
        secret: None,
        context: CallContext { node: None },
    }
}

/// A node named `name` with no labels.
pub fn node(name: &str) -> Node {
    Node {
        name: name.to_string(),
        labels: Vec::new(),
    }
}

/// The delete request the host would send for `volume`, published as `request`'s PV, with
/// the class's parameters `parameters` (empty: the class is gone).
pub fn delete_request(
    request: &ProvisionRequest,
    volume: &Volume,
    parameters: &[(&str, &str)],
) -> DeleteRequest {
    DeleteRequest {
        volume: PublishedVolume {
            name: request.volume_name.clone(),
            source: volume.source.clone(),
            capacity_bytes: volume.capacity_bytes,
            labels: volume.labels.clone(),
            annotations: volume.annotations.clone(),
            node_affinity: volume.node_affinity.clone(),
            claim_namespace: Some(request.claim.namespace.clone()),
            claim_name: Some(request.claim.name.clone()),
        },
        class_name: request.class.name.clone(),
        class_parameters: string_map(parameters),
        secret: None,
        context: CallContext { node: None },
    }
}

/// The expand request the host would send to grow `volume`, published as `request`'s
/// PV, to `requested_bytes`, with the class's parameters `parameters`.
pub fn expand_request(
    request: &ProvisionRequest,
    volume: &Volume,
    parameters: &[(&str, &str)],
    requested_bytes: u64,
) -> ExpandRequest {
    let delete = delete_request(request, volume, parameters);
    ExpandRequest {
        volume: delete.volume,
        class_name: delete.class_name,
        class_parameters: delete.class_parameters,
        requested_bytes,
        secret: None,
        context: CallContext { node: None },
    }
}

/// The capacity request the host would send for [`class`]`(parameters)`, on `node`.
pub fn capacity_request(parameters: &[(&str, &str)], node: Option<&str>) -> CapacityRequest {
    CapacityRequest {
        class: class(parameters),
        node: node.map(self::node),
        context: CallContext {
            node: node.map(str::to_string),
        },
    }
}
