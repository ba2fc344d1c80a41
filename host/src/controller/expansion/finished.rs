//! The claims (by UID) whose expansion this process just finished, with the request it
//! finished: until the claim cache shows the new status capacity, a reconcile of a
//! claim the cache still shows marked in progress (the echo of an earlier write of
//! ours) must not expand it, or finish it, again.

use std::collections::HashMap;
use std::sync::Mutex;

static FINISHED: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

fn finished() -> std::sync::MutexGuard<'static, Option<HashMap<String, String>>> {
    FINISHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process finished the claim `key`'s expansion to `request` already.
pub(super) fn was_finished(key: &str, request: &str) -> bool {
    finished()
        .as_ref()
        .is_some_and(|done| done.get(key).is_some_and(|r| r == request))
}

/// Remembers that the claim `key`'s expansion to `request` is finished.
pub(super) fn remember(key: &str, request: &str) {
    finished()
        .get_or_insert_with(HashMap::new)
        .insert(key.to_string(), request.to_string());
}

/// Forgets the claim `key` (the cache shows it settled).
pub(super) fn forget(key: &str) {
    if let Some(done) = finished().as_mut() {
        done.remove(key);
    }
}

/// Forgets the claims that are gone, so the map cannot grow for ever.
pub(in crate::controller) fn retain(live: impl Fn(&str) -> bool) {
    if let Some(done) = finished().as_mut() {
        done.retain(|key, _| live(key));
    }
}
