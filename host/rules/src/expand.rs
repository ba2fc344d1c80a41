//! Volume expansion, as kubernetes-csi/external-resizer does it for a volume that needs
//! no step on a node: the sizes a bound claim and its PV say, the `expand-request` a
//! plugin receives, and the claim status writes (JSON merge patches of the claim's
//! `status`) that mark an expansion in progress, infeasible, failed, finished, or cleared.
//!
//! The status is the resizer's: `conditions` (`Resizing` while the controller works,
//! `ControllerResizeError` with the reason of a failure), `allocatedResources.storage`
//! (the size being made) and `allocatedResourceStatuses.storage`
//! (`ControllerResizeInProgress`, `ControllerResizeInfeasible`). A finished expansion sets
//! `capacity.storage`, drops the resize conditions and the storage status, and keeps
//! `allocatedResources`. Conditions of other kinds are kept as they are.

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::volume::{self, delete_request};
use crate::{names, quantity, types};

/// The sizes an expansion compares, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// What the claim asks for: `spec.resources.requests.storage`.
    pub requested: u64,
    /// What the claim is known to have: `status.capacity.storage`.
    pub capacity: u64,
    /// What its PV says the volume is: `spec.capacity.storage`.
    pub volume: u64,
}

/// The claim's and its PV's sizes; `None` while one of them says none (a claim the
/// binder has not finished with has no status capacity yet).
pub fn sizes(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<Option<Sizes>, quantity::Error> {
    let requested = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(names::RESOURCE_STORAGE));
    let capacity = claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(names::RESOURCE_STORAGE));
    let volume = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(names::RESOURCE_STORAGE));
    let (Some(requested), Some(capacity), Some(volume)) = (requested, capacity, volume) else {
        return Ok(None);
    };
    Ok(Some(Sizes {
        requested: quantity::quantity_bytes(requested)?,
        capacity: quantity::quantity_bytes(capacity)?,
        volume: quantity::quantity_bytes(volume)?,
    }))
}

/// The request a plugin's `expand` receives: the PV as published (as `delete` gets it:
/// its capacity the volume's size now), its class's name and parameters, and the size
/// asked for. `class` is the PV's StorageClass when it exists.
pub fn expand_request(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
    requested_bytes: u64,
) -> Result<types::ExpandRequest, volume::Error> {
    let published = delete_request(pv, class)?;
    Ok(types::ExpandRequest {
        volume: published.volume,
        class_name: published.class_name,
        class_parameters: published.class_parameters,
        requested_bytes,
        // Filled in by the host where it reads Secrets and knows its node.
        secret: None,
        context: types::CallContext::default(),
    })
}

fn conditions(claim: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

fn storage_status(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get(names::RESOURCE_STORAGE)
        .map(String::as_str)
}

fn allocated_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    let allocated = claim
        .status
        .as_ref()?
        .allocated_resources
        .as_ref()?
        .get(names::RESOURCE_STORAGE)?;
    quantity::quantity_bytes(allocated).ok()
}

fn has_condition(claim: &PersistentVolumeClaim, kind: &str) -> bool {
    conditions(claim)
        .iter()
        .any(|c| c.type_ == kind && c.status == "True")
}

/// Whether the claim's status says the controller is expanding it to `requested` bytes
/// already (the `Resizing` condition, the storage status in progress, that size
/// allocated): marking it again would change nothing.
pub fn in_progress(claim: &PersistentVolumeClaim, requested: u64) -> bool {
    storage_status(claim) == Some(names::RESIZE_STATUS_CONTROLLER_IN_PROGRESS)
        && allocated_bytes(claim) == Some(requested)
        && has_condition(claim, names::CONDITION_RESIZING)
}

/// Whether the claim still carries a controller expansion's marks: a resize condition,
/// or a controller storage status. A claim whose request went back to its capacity
/// after an infeasible expansion has them left over.
pub fn carries_marks(claim: &PersistentVolumeClaim) -> bool {
    let controller_status = matches!(
        storage_status(claim),
        Some(names::RESIZE_STATUS_CONTROLLER_IN_PROGRESS)
            | Some(names::RESIZE_STATUS_CONTROLLER_INFEASIBLE)
    );
    controller_status
        || conditions(claim)
            .iter()
            .any(|c| names::RESIZE_CONDITIONS.contains(&c.type_.as_str()))
}

/// The claim's conditions with the resize ones dropped (all of them, or, with `keep`,
/// all but those of `new`'s kind), then `new` added: the resizer's
/// `MergeResizeConditionsOfPVC`. `null` when none is left, so a merge patch removes the
/// list.
fn merged_conditions(
    claim: &PersistentVolumeClaim,
    new: Option<PersistentVolumeClaimCondition>,
    keep: bool,
) -> Value {
    let mut merged: Vec<PersistentVolumeClaimCondition> = conditions(claim)
        .iter()
        .filter(|c| {
            let resize = names::RESIZE_CONDITIONS.contains(&c.type_.as_str());
            let replaced = new.as_ref().is_some_and(|n| n.type_ == c.type_);
            !resize || (keep && !replaced)
        })
        .cloned()
        .collect();
    merged.extend(new);
    if merged.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(merged).unwrap_or(Value::Null)
    }
}

fn condition(kind: &str, now: &Time, message: Option<String>) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: kind.to_string(),
        status: "True".to_string(),
        last_transition_time: Some(now.clone()),
        message,
        ..Default::default()
    }
}

/// The expansion to `allocated` starts: the `Resizing` condition (other resize
/// conditions kept), `allocatedResources.storage` that size, its status
/// `ControllerResizeInProgress`.
pub fn mark_in_progress(claim: &PersistentVolumeClaim, allocated: &Quantity, now: &Time) -> Value {
    let resizing = condition(names::CONDITION_RESIZING, now, None);
    json!({ "status": {
        "conditions": merged_conditions(claim, Some(resizing), true),
        "allocatedResources": { names::RESOURCE_STORAGE: allocated },
        "allocatedResourceStatuses": {
            names::RESOURCE_STORAGE: names::RESIZE_STATUS_CONTROLLER_IN_PROGRESS,
        },
    }})
}

/// The module answered that the expansion cannot succeed as asked: status
/// `ControllerResizeInfeasible`, and a `ControllerResizeError` condition saying why.
pub fn mark_infeasible(claim: &PersistentVolumeClaim, message: &str, now: &Time) -> Value {
    let error = condition(
        names::CONDITION_CONTROLLER_RESIZE_ERROR,
        now,
        Some(format!("failed to expand pvc with {message}")),
    );
    json!({ "status": {
        "conditions": merged_conditions(claim, Some(error), true),
        "allocatedResourceStatuses": {
            names::RESOURCE_STORAGE: names::RESIZE_STATUS_CONTROLLER_INFEASIBLE,
        },
    }})
}

/// The module answered that the expansion failed: a `ControllerResizeError` condition
/// saying why; the status stays in progress (it is retried).
pub fn mark_failed(claim: &PersistentVolumeClaim, message: &str, now: &Time) -> Value {
    let error = condition(
        names::CONDITION_CONTROLLER_RESIZE_ERROR,
        now,
        Some(format!("failed to expand pvc with {message}")),
    );
    json!({ "status": {
        "conditions": merged_conditions(claim, Some(error), true),
    }})
}

/// The volume is `capacity` now: the claim's `status.capacity`, no resize condition, no
/// storage status.
pub fn mark_finished(claim: &PersistentVolumeClaim, capacity: &Quantity) -> Value {
    json!({ "status": {
        "capacity": { names::RESOURCE_STORAGE: capacity },
        "conditions": merged_conditions(claim, None, false),
        "allocatedResourceStatuses": { names::RESOURCE_STORAGE: null },
    }})
}

/// Nothing is to be expanded any more (the request went back to the capacity): the
/// marks of an earlier expansion go, and what is allocated is the capacity again.
pub fn clear_marks(claim: &PersistentVolumeClaim, capacity: &Quantity) -> Value {
    json!({ "status": {
        "conditions": merged_conditions(claim, None, false),
        "allocatedResources": { names::RESOURCE_STORAGE: capacity },
        "allocatedResourceStatuses": { names::RESOURCE_STORAGE: null },
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(status: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": { "name": "data", "namespace": "ns", "uid": "u-1" },
            "spec": { "resources": { "requests": { "storage": "2Gi" } } },
            "status": status,
        }))
        .expect("a claim")
    }

    fn pv(capacity: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": { "name": "pvc-u-1", "annotations": { "a": "b" } },
            "spec": {
                "capacity": { "storage": capacity },
                "storageClassName": "fast",
                "hostPath": { "path": "/srv/volumes/pvc-u-1" },
                "claimRef": { "namespace": "ns", "name": "data", "uid": "u-1" },
            },
        }))
        .expect("a PV")
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    const GI: u64 = 1 << 30;

    #[test]
    fn sizes_are_the_request_the_status_and_the_pv() {
        let c = claim(json!({ "phase": "Bound", "capacity": { "storage": "1Gi" } }));
        assert_eq!(
            sizes(&c, &pv("1Gi")).unwrap(),
            Some(Sizes {
                requested: 2 * GI,
                capacity: GI,
                volume: GI
            })
        );
        let unbound = claim(json!({ "phase": "Pending" }));
        assert_eq!(sizes(&unbound, &pv("1Gi")).unwrap(), None);
        assert!(sizes(&c, &pv("lots")).is_err());
    }

    #[test]
    fn the_request_is_the_published_volume_and_the_new_size() {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": { "name": "fast" },
            "provisioner": "p",
            "parameters": { "module": "hostpath", "maxSize": "4Gi" },
        }))
        .unwrap();
        let request = expand_request(&pv("1Gi"), Some(&class), 2 * GI).unwrap();
        assert_eq!(request.volume.name, "pvc-u-1");
        assert_eq!(request.volume.capacity_bytes, GI);
        assert_eq!(request.volume.claim_name.as_deref(), Some("data"));
        assert_eq!(request.class_name, "fast");
        assert_eq!(
            request.class_parameters,
            vec![("maxSize".to_string(), "4Gi".to_string())],
            "the host's own parameters are not the plugin's"
        );
        assert_eq!(request.requested_bytes, 2 * GI);
        assert_eq!(request.secret, None);
    }

    #[test]
    fn in_progress_is_the_resizers_three_marks_for_the_size() {
        let marked = claim(json!({
            "conditions": [{ "type": "Resizing", "status": "True" }],
            "allocatedResources": { "storage": "2Gi" },
            "allocatedResourceStatuses": { "storage": "ControllerResizeInProgress" },
        }));
        assert!(in_progress(&marked, 2 * GI));
        assert!(!in_progress(&marked, 3 * GI), "another size");
        assert!(carries_marks(&marked));
        let infeasible = claim(json!({
            "allocatedResources": { "storage": "2Gi" },
            "allocatedResourceStatuses": { "storage": "ControllerResizeInfeasible" },
        }));
        assert!(!in_progress(&infeasible, 2 * GI));
        assert!(carries_marks(&infeasible));
        let settled = claim(json!({
            "conditions": [{ "type": "Other", "status": "True" }],
            "allocatedResources": { "storage": "2Gi" },
        }));
        assert!(!carries_marks(&settled));
    }

    #[test]
    fn the_status_patches_keep_other_conditions() {
        let c = claim(json!({
            "capacity": { "storage": "1Gi" },
            "conditions": [
                { "type": "Other", "status": "True" },
                { "type": "ControllerResizeError", "status": "True", "message": "before" },
            ],
        }));
        let patch = mark_in_progress(&c, &Quantity("2Gi".into()), &now());
        let types: Vec<&str> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Other", "ControllerResizeError", "Resizing"]);
        assert_eq!(patch["status"]["allocatedResources"]["storage"], "2Gi");
        assert_eq!(
            patch["status"]["allocatedResourceStatuses"]["storage"],
            "ControllerResizeInProgress"
        );

        let patch = mark_infeasible(&c, "too big", &now());
        let errors: Vec<&Value> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["type"] == "ControllerResizeError")
            .collect();
        assert_eq!(errors.len(), 1, "replaced, not added: {patch}");
        assert_eq!(errors[0]["message"], "failed to expand pvc with too big");
        assert_eq!(
            patch["status"]["allocatedResourceStatuses"]["storage"],
            "ControllerResizeInfeasible"
        );
        assert!(
            mark_failed(&c, "no", &now())["status"]
                .get("allocatedResourceStatuses")
                .is_none(),
            "a failure leaves the status in progress"
        );

        let patch = mark_finished(&c, &Quantity("2Gi".into()));
        assert_eq!(patch["status"]["capacity"]["storage"], "2Gi");
        assert_eq!(
            patch["status"]["conditions"],
            json!([{ "type": "Other", "status": "True" }])
        );
        assert!(patch["status"]["allocatedResourceStatuses"]["storage"].is_null());
        let alone = claim(json!({ "conditions": [{ "type": "Resizing", "status": "True" }] }));
        assert!(
            mark_finished(&alone, &Quantity("2Gi".into()))["status"]["conditions"].is_null(),
            "no condition left: the list goes"
        );
        let patch = clear_marks(&alone, &Quantity("1Gi".into()));
        assert_eq!(patch["status"]["allocatedResources"]["storage"], "1Gi");
        assert!(patch["status"]["conditions"].is_null());
    }
}
