//! Per-queue retry state: failure counts (keyed by object UID, so a claim recreated under
//! the same name starts afresh), the Go library's combined rate limiter, give-up after the
//! threshold, and the slow retry of infeasible requests until their class changes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::claims::decision::RetryRecord;
use wasm_provisioner_rules::backoff::Backoff;
pub use wasm_provisioner_rules::backoff::RetryPolicy;

/// What the queue should do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Retry after this delay.
    RetryAfter(Duration),
    /// The threshold is passed: stop the fast retries (the caller retries once per resync
    /// period, or when the object changes).
    GiveUp {
        failures: u32,
        /// The first give-up since the object last changed or succeeded: the only one
        /// told with a Warning Event.
        first: bool,
    },
}

#[derive(Default)]
struct State {
    backoff: Option<Backoff<String>>,
    /// Keys given up on, with the fingerprint of the object at that time.
    given_up: HashMap<String, u64>,
    /// Keys whose last failure was infeasible, with their class's resourceVersion.
    infeasible: HashMap<String, String>,
    /// Keys whose class was rejected by its module, with the class's resourceVersion
    /// and the module's sha256.
    rejected: HashMap<String, (String, String)>,
    /// Keys waiting out a retry delay: the object's fingerprint then, and until when.
    held: HashMap<String, (u64, Instant)>,
}

/// The retry state of one queue.
pub struct Retries {
    policy: RetryPolicy,
    state: Mutex<State>,
}

impl Retries {
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            state: Mutex::new(State::default()),
        }
    }

    fn with_backoff<T>(&self, f: impl FnOnce(&mut Backoff<String>, &mut State) -> T) -> T {
        let mut state = self.state.lock().expect("retry state lock");
        let mut backoff = state
            .backoff
            .take()
            .unwrap_or_else(|| Backoff::new(self.policy.clone(), Instant::now()));
        let result = f(&mut backoff, &mut state);
        state.backoff = Some(backoff);
        result
    }

    /// Records a failure of `key` and says when to retry, or to give up. Give-up is
    /// remembered with `fingerprint`, so the object is left alone until it changes.
    pub fn failed(&self, key: &str, fingerprint: u64) -> Next {
        self.with_backoff(|backoff, state| {
            let delay = backoff.failed(&key.to_string(), Instant::now());
            if backoff.should_give_up(&key.to_string()) {
                let first = state
                    .given_up
                    .insert(key.to_string(), fingerprint)
                    .is_none();
                Next::GiveUp {
                    failures: backoff.failures(&key.to_string()),
                    first,
                }
            } else {
                Next::RetryAfter(delay)
            }
        })
    }

    /// Records a failure of `key` that must be retried whatever the threshold (cleaning
    /// up a deleted claim's backend volume): the usual back-off, never a give-up.
    pub fn failed_forever(&self, key: &str) -> Duration {
        self.with_backoff(|backoff, _| backoff.failed(&key.to_string(), Instant::now()))
    }

    /// Records an infeasible answer for `key` under class version `class_version`: the
    /// slow retry, unless the class changed since the last one (then at once).
    pub fn infeasible(&self, key: &str, class_version: &str) -> Duration {
        let mut state = self.state.lock().expect("retry state lock");
        state
            .infeasible
            .insert(key.to_string(), class_version.to_string());
        self.policy.infeasible_delay()
    }

    /// Records that `key`'s class was rejected (or could not be validated) under class
    /// version `class_version` and module version `module_sha256`: the slow retry, as
    /// for an infeasible answer; the decision forgives it once either version changes.
    pub fn rejected(&self, key: &str, class_version: &str, module_sha256: &str) -> Duration {
        let mut state = self.state.lock().expect("retry state lock");
        state.rejected.insert(
            key.to_string(),
            (class_version.to_string(), module_sha256.to_string()),
        );
        self.policy.infeasible_delay()
    }

    /// Whether `key` was infeasible under a class version other than `class_version`:
    /// the class changed, so its back-off starts over.
    pub fn class_changed(&self, key: &str, class_version: &str) -> bool {
        let mut state = self.state.lock().expect("retry state lock");
        match state.infeasible.get(key) {
            Some(version) if version != class_version => {
                state.infeasible.remove(key);
                drop(state);
                self.forget(key);
                true
            }
            _ => false,
        }
    }

    /// Whether `key` was given up on and has not changed since (same fingerprint). A
    /// changed object is forgiven: its failures start from zero.
    pub fn given_up(&self, key: &str, fingerprint: u64) -> bool {
        let mut state = self.state.lock().expect("retry state lock");
        match state.given_up.get(key) {
            Some(&at) if at == fingerprint => true,
            Some(_) => {
                state.given_up.remove(key);
                drop(state);
                self.forget(key);
                false
            }
            None => false,
        }
    }

    /// Holds `key` for `delay`: until then, a reconcile of the same object (same
    /// fingerprint) waits. Our own writes to an object (a finalizer added and removed
    /// in one attempt) trigger a reconcile at once; without the hold they would bypass
    /// the back-off and loop.
    pub fn hold(&self, key: &str, fingerprint: u64, delay: Duration) {
        let mut state = self.state.lock().expect("retry state lock");
        let until = Instant::now()
            .checked_add(delay)
            .unwrap_or_else(Instant::now);
        state.held.insert(key.to_string(), (fingerprint, until));
    }

    /// How long `key` must still wait, if it is held and the object did not change.
    pub fn held(&self, key: &str, fingerprint: u64) -> Option<Duration> {
        let mut state = self.state.lock().expect("retry state lock");
        let (at, until) = *state.held.get(key)?;
        let now = Instant::now();
        if at != fingerprint || until <= now {
            state.held.remove(key);
            return None;
        }
        Some(until - now)
    }

    /// Everything on record for `key`, for the claim controller's decision.
    pub fn record(&self, key: &str) -> RetryRecord {
        let state = self.state.lock().expect("retry state lock");
        RetryRecord {
            given_up: state.given_up.get(key).copied(),
            held: state.held.get(key).copied(),
            infeasible_under: state.infeasible.get(key).cloned(),
            rejected_under: state.rejected.get(key).cloned(),
        }
    }

    /// Drops the hold of `key` (expired, or its object changed since).
    pub fn drop_hold(&self, key: &str) {
        let mut state = self.state.lock().expect("retry state lock");
        state.held.remove(key);
    }

    /// Forgets everything about `key`: after a success, or when it is gone.
    pub fn forget(&self, key: &str) {
        self.with_backoff(|backoff, state| {
            backoff.forget(&key.to_string());
            state.given_up.remove(key);
            state.infeasible.remove(key);
            state.rejected.remove(key);
            state.held.remove(key);
        });
    }

    /// Forgets every key `live` says is gone. An object deleted without a final
    /// reconcile (deleted while held, or while the controller was busy) never reaches
    /// [`Retries::forget`]; without this its entries would stay for the life of the
    /// process, and a churn of create/delete cycles would grow memory without bound.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.with_backoff(|backoff, state| {
            backoff.retain(|key| live(key));
            state.given_up.retain(|key, _| live(key));
            state.infeasible.retain(|key, _| live(key));
            state.rejected.retain(|key, _| live(key));
            state.held.retain(|key, _| live(key));
        });
    }

    /// Keys with any retry state on record (failures, holds, give-ups, infeasible).
    pub fn tracked(&self) -> usize {
        let state = self.state.lock().expect("retry state lock");
        let mut keys: std::collections::HashSet<&String> = state.given_up.keys().collect();
        keys.extend(state.infeasible.keys());
        keys.extend(state.rejected.keys());
        keys.extend(state.held.keys());
        keys.extend(state.backoff.iter().flat_map(Backoff::keys));
        keys.len()
    }

    /// How many times `key` has failed since it was last forgotten.
    pub fn failures(&self, key: &str) -> u32 {
        self.with_backoff(|backoff, _| backoff.failures(&key.to_string()))
    }

    /// Items currently failing and waiting for a retry (not given up).
    pub fn depth(&self) -> usize {
        let state = self.state.lock().expect("retry state lock");
        let failing = state.backoff.as_ref().map_or(0, Backoff::len);
        failing.saturating_sub(state.given_up.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(threshold: u32) -> RetryPolicy {
        RetryPolicy {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
            failure_threshold: threshold,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn backs_off_then_gives_up_until_the_object_changes() {
        let retries = Retries::new(policy(3));
        assert_eq!(
            retries.failed("a", 1),
            Next::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(
            retries.failed("a", 1),
            Next::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            retries.failed("a", 1),
            Next::RetryAfter(Duration::from_secs(4))
        );
        assert_eq!(
            retries.failed("a", 1),
            Next::GiveUp {
                failures: 4,
                first: true
            },
            "as the Go library: given up at the failure after `threshold` requeues"
        );
        assert!(retries.given_up("a", 1));
        assert_eq!(
            retries.failed("a", 1),
            Next::GiveUp {
                failures: 5,
                first: false
            },
            "a later try (once per resync) fails again: not told again"
        );
        assert_eq!(retries.depth(), 0);
        // The object changed: forgiven, failures start over.
        assert!(!retries.given_up("a", 2));
        assert_eq!(retries.failures("a"), 0);
        assert_eq!(
            retries.failed("a", 2),
            Next::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(retries.depth(), 1);
    }

    #[test]
    fn threshold_zero_retries_forever() {
        let retries = Retries::new(policy(0));
        for _ in 0..50 {
            assert!(matches!(retries.failed("a", 1), Next::RetryAfter(_)));
        }
        assert_eq!(
            retries.failed("a", 1),
            Next::RetryAfter(Duration::from_secs(8))
        );
    }

    #[test]
    fn a_held_key_waits_unless_its_object_changed() {
        let retries = Retries::new(policy(15));
        retries.hold("a", 7, Duration::from_secs(60));
        let wait = retries.held("a", 7).expect("held");
        assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
        assert_eq!(retries.held("a", 8), None, "a changed object goes at once");
        assert_eq!(retries.held("a", 7), None, "and the hold is gone");
        retries.hold("b", 1, Duration::ZERO);
        assert_eq!(retries.held("b", 1), None, "an expired hold is gone");
        retries.hold("c", 1, Duration::from_secs(60));
        retries.forget("c");
        assert_eq!(retries.held("c", 1), None);
    }

    #[test]
    fn infeasible_waits_long_until_the_class_changes() {
        let retries = Retries::new(policy(15));
        assert_eq!(retries.infeasible("a", "100"), Duration::from_secs(8));
        assert!(!retries.class_changed("a", "100"));
        assert!(retries.class_changed("a", "101"));
        assert!(!retries.class_changed("a", "101"));
    }

    #[test]
    fn keys_of_objects_that_are_gone_are_forgotten() {
        let retries = Retries::new(policy(3));
        for key in ["a", "b", "c"] {
            retries.failed(key, 1);
            retries.hold(key, 1, Duration::from_secs(60));
        }
        retries.infeasible("b", "v1");
        retries.failed("c", 1);
        retries.failed("c", 1);
        retries.failed("c", 1);
        assert!(retries.given_up("c", 1));
        assert_eq!(retries.tracked(), 3);

        retries.retain(|key| key == "a");
        assert_eq!(retries.tracked(), 1);
        assert_eq!(retries.failures("a"), 1);
        assert_eq!(retries.failures("b"), 0);
        assert!(retries.held("b", 1).is_none());
        assert!(!retries.given_up("c", 1));
        assert_eq!(retries.depth(), 1);
    }
}
