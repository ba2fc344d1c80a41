//! Adding and removing one finalizer on an object in one request, without a conflict:
//! a strategic merge patch, which the API server applies to the object as it is when the
//! patch arrives. `metadata.finalizers` is a set merged by value, so the patch adds our
//! entry to the list (or `$deleteFromPrimitiveList` takes it out) and never touches
//! another controller's finalizer, however recent. No resourceVersion precondition, so
//! no 409 when another controller (the binder, pv-protection) wrote the object a moment
//! before, and no read.
//!
//! The patch carries the object's UID: metadata.uid is immutable, so the API server
//! refuses (422) the patch of another object that took the same name, and the edit
//! reports [`Edited::Gone`], as for an object that no longer exists.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// What became of the edit.
pub enum Edited<K> {
    /// The object as it now is (the given one, unchanged and with no request made, when
    /// the finalizer already was as wanted).
    Done(K),
    /// The object is gone, was replaced by another of the same name, or (when adding) is
    /// being deleted, so no finalizer can be added.
    Gone,
}

/// Makes `finalizer` present (`add`) or absent on `object`. `object` must be as fresh
/// as the last write of ours to it: a stale copy that does not show an edit of ours
/// would make this a no-op. `annotation`, when adding, is set in the same patch (an
/// annotations map merges by key, so no other annotation is touched).
pub async fn set<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    add: bool,
    annotation: Option<(&str, &str)>,
) -> Result<Edited<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    if object.finalizers().iter().any(|f| f == finalizer) == add {
        return Ok(Edited::Done(object.clone()));
    }
    let mut patch = patch(object.uid().as_deref(), finalizer, add);
    if let Some((key, value)) = annotation.filter(|_| add) {
        patch["metadata"]["annotations"] = json!({ key: value });
    }
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(updated) => Ok(Edited::Done(updated)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Edited::Gone),
        Err(kube::Error::Api(status)) if status.code == 422 && refused_as_gone(&status.message) => {
            Ok(Edited::Gone)
        }
        Err(error) => Err(error),
    }
}

/// The strategic merge patch that adds or removes `finalizer`, on the object with `uid`.
fn patch(uid: Option<&str>, finalizer: &str, add: bool) -> serde_json::Value {
    let mut metadata = serde_json::Map::new();
    if let Some(uid) = uid {
        metadata.insert("uid".into(), json!(uid));
    }
    if add {
        metadata.insert("finalizers".into(), json!([finalizer]));
    } else {
        metadata.insert(
            "$deleteFromPrimitiveList/finalizers".into(),
            json!([finalizer]),
        );
    }
    json!({ "metadata": metadata })
}

/// Whether a 422 says the object is not the one we meant (its UID differs: it was
/// deleted and recreated under the name) or is being deleted (no finalizer may be added
/// then). Any other invalid answer is an error the caller reports.
fn refused_as_gone(message: &str) -> bool {
    message.contains("metadata.uid") || message.contains("being deleted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_sends_only_our_finalizer_and_the_uid() {
        assert_eq!(
            patch(Some("u-1"), "a.example/f", true),
            json!({ "metadata": { "uid": "u-1", "finalizers": ["a.example/f"] } })
        );
    }

    #[test]
    fn removing_deletes_only_our_entry_from_the_set() {
        assert_eq!(
            patch(Some("u-1"), "a.example/f", false),
            json!({ "metadata": { "uid": "u-1", "$deleteFromPrimitiveList/finalizers": ["a.example/f"] } })
        );
    }

    #[test]
    fn a_replaced_or_deleting_object_counts_as_gone() {
        assert!(refused_as_gone(
            r#"PersistentVolumeClaim "c1" is invalid: metadata.uid: Invalid value: "0": field is immutable"#
        ));
        assert!(refused_as_gone(
            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"x\"}"
        ));
        assert!(!refused_as_gone(
            "spec.resources.requests: Forbidden: field can not be less than status.capacity"
        ));
    }
}
