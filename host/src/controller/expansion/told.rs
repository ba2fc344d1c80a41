//! The claims (by UID) whose refused expansion this process told already, with the
//! request it was told for: a shrink, a module that cannot expand, or a class that does
//! not allow it is one Warning per request, not one per reconcile.

use std::collections::HashMap;
use std::sync::Mutex;

static TOLD: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

fn told() -> std::sync::MutexGuard<'static, Option<HashMap<String, String>>> {
    TOLD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the refusal of the claim `key`'s `request` was told already.
pub(super) fn was_told(key: &str, request: &str) -> bool {
    told()
        .as_ref()
        .is_some_and(|told| told.get(key).is_some_and(|r| r == request))
}

/// Remembers that the refusal of the claim `key`'s `request` was told.
pub(super) fn remember(key: &str, request: &str) {
    told()
        .get_or_insert_with(HashMap::new)
        .insert(key.to_string(), request.to_string());
}

/// Forgets the claim `key` (nothing left to expand).
pub(super) fn forget(key: &str) {
    if let Some(told) = told().as_mut() {
        told.remove(key);
    }
}

/// Forgets the claims that are gone, so the map cannot grow for ever.
pub(in crate::controller) fn retain(live: impl Fn(&str) -> bool) {
    if let Some(told) = told().as_mut() {
        told.retain(|key, _| live(key));
    }
}
