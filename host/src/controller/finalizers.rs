//! Adding and removing one finalizer on an object, safely: the patch carries the
//! object's resourceVersion (optimistic concurrency), and on a conflict the object is
//! read again and the edit re-applied, so a concurrent change to the finalizer list
//! (another controller's finalizer) is never overwritten.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Tries before giving up on an object that keeps changing under us.
const TRIES: usize = 5;

/// What became of the edit.
pub enum Edited<K> {
    /// The object as it now is (unchanged when the finalizer already was as wanted).
    Done(K),
    /// The object is gone (or was replaced by another of the same name).
    Gone,
    /// It kept changing; the caller retries later.
    Busy,
}

/// Makes `finalizer` present (`add`) or absent on `object`.
pub async fn set<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    add: bool,
) -> Result<Edited<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let mut current = object.clone();
    for _ in 0..TRIES {
        let mut finalizers = current.finalizers().to_vec();
        if finalizers.iter().any(|f| f == finalizer) == add {
            return Ok(Edited::Done(current));
        }
        if add {
            finalizers.push(finalizer.to_string());
        } else {
            finalizers.retain(|f| f != finalizer);
        }
        let patch = json!({
            "metadata": { "resourceVersion": current.resource_version(), "finalizers": finalizers }
        });
        match api
            .patch(
                &current.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(updated) => return Ok(Edited::Done(updated)),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match api.get_opt(&current.name_any()).await? {
                    Some(fresh) if fresh.uid() == object.uid() => current = fresh,
                    _ => return Ok(Edited::Gone),
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Edited::Gone),
            Err(error) => return Err(error),
        }
    }
    Ok(Edited::Busy)
}
