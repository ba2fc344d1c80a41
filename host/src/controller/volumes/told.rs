//! The volumes (by UID) whose in-background delete this process already told with a
//! Normal Event: one Event per volume, not one per chunk.

use std::collections::HashSet;
use std::sync::Mutex;

static TOLD: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn told() -> std::sync::MutexGuard<'static, Option<HashSet<String>>> {
    TOLD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the in-background delete of the volume `key` was told already.
pub(super) fn was_told(key: &str) -> bool {
    told().as_ref().is_some_and(|told| told.contains(key))
}

/// Remembers that the in-background delete of the volume `key` was told.
pub(super) fn remember(key: &str) {
    told()
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string());
}

/// Forgets the volume `key`, whose delete finished.
pub(super) fn forget(key: &str) {
    if let Some(told) = told().as_mut() {
        told.remove(key);
    }
}

/// Forgets the volumes that are gone (deleted without a last reconcile), so the set
/// cannot grow for ever.
pub(in crate::controller) fn retain(live: impl Fn(&str) -> bool) {
    if let Some(told) = told().as_mut() {
        told.retain(|key| live(key));
    }
}
