//! The `delete-request` a plugin receives: for a released PV, and for a volume the host
//! never published.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

use super::Error;
use super::source::volume_source_of;
use crate::request::{plugin_parameters, string_map};
use crate::types;
use crate::{names, quantity};

/// The request a plugin's `should-delete` and `delete` receive for a released PV.
/// `class` is the PV's StorageClass when it still exists; without it the plugin gets
/// the class name only and no parameters.
pub fn delete_request(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
) -> Result<types::DeleteRequest, Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    let capacity_bytes = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get(names::RESOURCE_STORAGE))
        .map(quantity::quantity_bytes)
        .transpose()
        .map_err(|source| Error::Capacity {
            volume: name.clone(),
            source,
        })?
        .unwrap_or(0);
    let node_affinity = spec
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default()
        .into_iter()
        .map(|term| types::NodeSelectorTerm {
            match_expressions: term
                .match_expressions
                .into_iter()
                .flatten()
                .map(|r| types::NodeSelectorRequirement {
                    key: r.key,
                    operator: r.operator,
                    values: r.values.unwrap_or_default(),
                })
                .collect(),
        })
        .collect();
    let claim_ref = spec.claim_ref.as_ref();
    let class_name = spec
        .storage_class_name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| class.and_then(|c| c.metadata.name.clone()))
        .unwrap_or_default();
    Ok(types::DeleteRequest {
        volume: types::PublishedVolume {
            source: volume_source_of(pv)?,
            name,
            capacity_bytes,
            labels: string_map(pv.metadata.labels.as_ref()),
            annotations: string_map(pv.metadata.annotations.as_ref()),
            node_affinity,
            claim_namespace: claim_ref.and_then(|r| r.namespace.clone()),
            claim_name: claim_ref.and_then(|r| r.name.clone()),
        },
        class_name,
        class_parameters: class.map(plugin_parameters).unwrap_or_default(),
        // Filled in by the host where it reads Secrets and knows its node.
        secret: None,
        context: types::CallContext::default(),
    })
}

/// The request that deletes a volume the plugin made for `req` but the host did not
/// publish (the answer could not become a PV, or its source was not granted). Built
/// from the answer itself, unchecked, so that a volume that can never be published can
/// still always be cleaned up: the plugin gets back exactly what it answered.
pub fn unpublished_delete_request(
    req: &types::ProvisionRequest,
    volume: &types::Volume,
) -> types::DeleteRequest {
    types::DeleteRequest {
        volume: types::PublishedVolume {
            name: req.volume_name.clone(),
            source: volume.source.clone(),
            capacity_bytes: volume.capacity_bytes,
            labels: volume.labels.clone(),
            annotations: volume.annotations.clone(),
            node_affinity: volume.node_affinity.clone(),
            claim_namespace: Some(req.claim.namespace.clone()),
            claim_name: Some(req.claim.name.clone()),
        },
        class_name: req.class.name.clone(),
        class_parameters: req.class.parameters.clone(),
        secret: req.secret.clone(),
        context: req.context.clone(),
    }
}
