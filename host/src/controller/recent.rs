//! What this process just wrote that its caches may not show yet, so that no reconcile
//! needs a live read to tell (docs/design.md, "No claim write, no read the caches can answer"):
//!
//! - the PVs it created: a claim reconciled again before its PV reaches the volume cache
//!   (the binder's edits of the claim arrive first) is known to be provisioned;
//! - the claims it took its provisioning finalizer off: a reconcile that still sees the
//!   finalizer in a cache that has not caught up makes no second (no-op) patch;
//! - the volumes whose backend it deleted: a PV the cache still shows as Released after
//!   its backend delete gets no second delete call, only the rest of its cleanup.
//!
//! A PV made by another process (an earlier leader) that the cache does not show yet is
//! not in here; its claim is provisioned again, which the module answers with the same
//! volume (idempotent by PV name), and the PV create's 409 finds the PV. Entries go when
//! the caches catch up ([`Recent::retain`], run with the retry sweep).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a created PV is remembered when the volume cache never shows it (it was
/// deleted again at once).
const CREATED_MEMORY: Duration = Duration::from_secs(600);

/// How far the cleanup of a released volume got in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeStage {
    /// The module deleted the backend volume; the PV object still has to go.
    BackendDeleted,
    /// The PV was deleted and our finalizer removed: nothing is left to do.
    Finished,
}

#[derive(Default)]
pub struct Recent {
    /// PV name → when this process created it.
    created: Mutex<HashMap<String, Instant>>,
    /// UIDs of claims whose provisioning finalizer this process removed.
    released: Mutex<HashSet<String>>,
    /// PV UID → how far its cleanup got.
    volumes: Mutex<HashMap<String, VolumeStage>>,
}

impl Recent {
    /// This process created (or found, by a create's 409, as the claim's) the PV `name`.
    pub fn created(&self, name: &str) {
        lock(&self.created).insert(name.to_string(), Instant::now());
    }

    /// Whether this process created the PV `name`.
    pub fn was_created(&self, name: &str) -> bool {
        lock(&self.created).contains_key(name)
    }

    /// This process removed its finalizer from the claim with UID `uid` (`true`), or
    /// added it again (`false`: provisioning is under way once more).
    pub fn set_released(&self, uid: &str, released: bool) {
        let mut set = lock(&self.released);
        if released {
            set.insert(uid.to_string());
        } else {
            set.remove(uid);
        }
    }

    /// Whether this process removed its finalizer from the claim with UID `uid` (and
    /// has not added it since).
    pub fn was_released(&self, uid: &str) -> bool {
        lock(&self.released).contains(uid)
    }

    /// How far the cleanup of the volume with UID `uid` got in this process.
    pub fn volume_stage(&self, uid: &str) -> Option<VolumeStage> {
        lock(&self.volumes).get(uid).copied()
    }

    pub fn set_volume_stage(&self, uid: &str, stage: VolumeStage) {
        lock(&self.volumes).insert(uid.to_string(), stage);
    }

    /// Forgets what the caches show now: created PVs the volume cache holds (or that it
    /// never showed for [`CREATED_MEMORY`]), released claims the claim cache no longer
    /// shows with the finalizer, and volumes no longer in the volume cache.
    pub fn retain(
        &self,
        volume_cached: impl Fn(&str) -> bool,
        claim_cached_with_finalizer: impl Fn(&str) -> bool,
        volume_uid_cached: impl Fn(&str) -> bool,
    ) {
        lock(&self.created)
            .retain(|name, at| !volume_cached(name) && at.elapsed() < CREATED_MEMORY);
        lock(&self.released).retain(|uid| claim_cached_with_finalizer(uid));
        lock(&self.volumes).retain(|uid, _| volume_uid_cached(uid));
    }

    /// Entries held (all maps).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.created).len() + lock(&self.released).len() + lock(&self.volumes).len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_volume_is_remembered_until_the_cache_shows_it() {
        let recent = Recent::default();
        recent.created("pvc-1");
        recent.created("pvc-2");
        assert!(recent.was_created("pvc-1"));
        recent.retain(|name| name == "pvc-1", |_| false, |_| false);
        assert!(!recent.was_created("pvc-1"), "the cache answers for it now");
        assert!(recent.was_created("pvc-2"), "not in the cache yet");
    }

    #[test]
    fn a_released_claim_is_remembered_until_the_cache_drops_the_finalizer() {
        let recent = Recent::default();
        recent.set_released("c-1", true);
        recent.set_released("c-2", true);
        recent.set_released("c-3", true);
        recent.set_released("c-3", false);
        assert!(recent.was_released("c-1"));
        assert!(
            !recent.was_released("c-3"),
            "added again: provisioning anew"
        );
        recent.retain(|_| false, |uid| uid == "c-1", |_| false);
        assert!(
            recent.was_released("c-1"),
            "the cache still shows the finalizer"
        );
        assert!(!recent.was_released("c-2"));
        assert_eq!(recent.len(), 1);
    }

    #[test]
    fn a_volume_stage_is_forgotten_once_the_volume_left_the_cache() {
        let recent = Recent::default();
        recent.set_volume_stage("u-1", VolumeStage::BackendDeleted);
        recent.set_volume_stage("u-2", VolumeStage::Finished);
        recent.retain(|_| false, |_| false, |uid| uid == "u-1");
        assert_eq!(
            recent.volume_stage("u-1"),
            Some(VolumeStage::BackendDeleted)
        );
        assert_eq!(recent.volume_stage("u-2"), None);
        assert_eq!(recent.len(), 1);
    }
}
