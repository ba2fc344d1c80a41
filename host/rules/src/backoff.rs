//! Retry arithmetic: how long a failed claim or volume waits before its next attempt,
//! and when to give up.
//!
//! The Go library's work queues (docs/design.md, "Retries, give-up and resync, as the
//! Go library") use the maximum of two limiters: a per-item exponential
//! back-off (15 s, doubling, capped at 1000 s; a fixed 15 s when exponential back-off is
//! off) and one token bucket shared by all items (10 per second, burst 100) so a storm
//! of failures cannot hammer the API server or the plugins. After a threshold of
//! failures (15 by default; 0 means never) the library gives up on the item. This module
//! is that arithmetic with no clock of its own: callers pass `Instant`s in, so tests
//! are exact and the controller decides what "now" is.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// First per-item delay after a failure.
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_secs(15);
/// Longest per-item delay; also the slow retry of infeasible requests.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1000);
/// Failures after which the controller stops retrying an item; 0 means never.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 15;
/// Overall retry rate: tokens per second of the shared bucket.
pub const DEFAULT_BUCKET_RATE: f64 = 10.0;
/// Overall retry burst: size of the shared bucket.
pub const DEFAULT_BUCKET_BURST: u32 = 100;

/// Tunable retry settings; [`Default`] is the Go library's.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failure of an item.
    pub base_delay: Duration,
    /// Cap of the per-item delay.
    pub max_delay: Duration,
    /// Double the delay on each failure; when false every retry waits `base_delay`.
    pub exponential: bool,
    /// Failures after which to give up; 0 retries forever.
    pub failure_threshold: u32,
    /// Tokens per second of the shared bucket.
    pub bucket_rate: f64,
    /// Capacity of the shared bucket.
    pub bucket_burst: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base_delay: DEFAULT_BASE_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            exponential: true,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            bucket_rate: DEFAULT_BUCKET_RATE,
            bucket_burst: DEFAULT_BUCKET_BURST,
        }
    }
}

impl RetryPolicy {
    /// The per-item delay before the retry that follows `failures` earlier failures of
    /// the item (0 for the first retry): `base * 2^failures`, capped at `max`; always
    /// `base` when exponential back-off is off.
    pub fn item_delay(&self, failures: u32) -> Duration {
        if !self.exponential {
            return self.base_delay;
        }
        2u32.checked_pow(failures)
            .and_then(|factor| self.base_delay.checked_mul(factor))
            .map_or(self.max_delay, |delay| delay.min(self.max_delay))
    }

    /// Whether to stop retrying an item that has failed `failures` times.
    pub fn should_give_up(&self, failures: u32) -> bool {
        should_give_up(failures, self.failure_threshold)
    }

    /// The slow retry for requests that cannot succeed as asked (a plugin's
    /// `infeasible`): the longest back-off, retried at once when the class changes.
    pub fn infeasible_delay(&self) -> Duration {
        self.max_delay
    }

    /// A full token bucket for this policy, starting at `now`.
    pub fn bucket(&self, now: Instant) -> TokenBucket {
        TokenBucket::new(self.bucket_rate, self.bucket_burst, now)
    }
}

/// Whether to stop the fast retries after `failures` failures (this one included) with
/// `threshold`. As the Go library: it requeues a failed item while its requeue count is below
/// the threshold, so it gives up at the failure after `threshold` requeues, the
/// `threshold + 1`-th. A threshold of 0 never gives up.
pub fn should_give_up(failures: u32, threshold: u32) -> bool {
    threshold != 0 && failures > threshold
}

/// A token bucket with an injected clock, like Go's `rate.Limiter` used through
/// `Reserve`: each reservation takes a token at once and returns how long to wait
/// until that token would have been there. Tokens refill at `rate` per second up to
/// `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`. A rate of zero or less never refills.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        Self {
            rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Takes one token at `now` and returns the wait before using it (zero when the
    /// bucket had one). A `now` earlier than the last call counts as no time passing.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        if now > self.last {
            self.last = now;
        }
        if self.rate > 0.0 {
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else if self.rate > 0.0 {
            Duration::from_secs_f64(-self.tokens / self.rate)
        } else {
            Duration::MAX
        }
    }
}

/// A rate limiter for one work queue: per-item exponential back-off combined (max) with
/// the shared token bucket, counting failures per key until the key is forgotten.
#[derive(Debug, Clone)]
pub struct Backoff<K> {
    policy: RetryPolicy,
    failures: HashMap<K, u32>,
    bucket: TokenBucket,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// A limiter for `policy`, its bucket full at `now`.
    pub fn new(policy: RetryPolicy, now: Instant) -> Self {
        Self {
            bucket: policy.bucket(now),
            policy,
            failures: HashMap::new(),
        }
    }

    /// Records a failure of `key` at `now` and returns how long to wait before the
    /// retry: the larger of the item's back-off and the bucket's wait.
    pub fn failed(&mut self, key: &K, now: Instant) -> Duration {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        let item = self.policy.item_delay(*failures);
        *failures = failures.saturating_add(1);
        item.max(self.bucket.reserve(now))
    }

    /// How many times `key` has failed since it was last forgotten.
    pub fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Whether to stop retrying `key` (its failures reached the threshold).
    pub fn should_give_up(&self, key: &K) -> bool {
        self.policy.should_give_up(self.failures(key))
    }

    /// Forgets `key`'s failures: after a success, or when its object changed.
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Keeps the failures of the keys `keep` says yes to, forgets the others.
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.failures.retain(|key, _| keep(key));
    }

    /// The keys with failures on record.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.failures.keys()
    }

    /// How many keys have failures on record.
    pub fn len(&self) -> usize {
        self.failures.len()
    }

    /// Whether no key has failures on record.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }

    /// The policy in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_are_the_seeds() {
        let p = RetryPolicy::default();
        assert_eq!(p.base_delay, secs(15));
        assert_eq!(p.max_delay, secs(1000));
        assert!(p.exponential);
        assert_eq!(p.failure_threshold, 15);
        assert_eq!(p.bucket_rate, 10.0);
        assert_eq!(p.bucket_burst, 100);
        assert_eq!(p.infeasible_delay(), secs(1000));
    }

    #[test]
    fn item_delay_doubles_from_15s_and_caps_at_1000s() {
        let p = RetryPolicy::default();
        let got: Vec<u64> = (0..10).map(|n| p.item_delay(n).as_secs()).collect();
        assert_eq!(got, [15, 30, 60, 120, 240, 480, 960, 1000, 1000, 1000]);
        // No overflow however long an item keeps failing.
        assert_eq!(p.item_delay(31), secs(1000));
        assert_eq!(p.item_delay(32), secs(1000));
        assert_eq!(p.item_delay(u32::MAX), secs(1000));
    }

    #[test]
    fn item_delay_is_fixed_without_exponential_back_off() {
        let p = RetryPolicy {
            exponential: false,
            ..RetryPolicy::default()
        };
        assert!((0..20).all(|n| p.item_delay(n) == secs(15)));
    }

    #[test]
    fn base_and_max_are_configurable() {
        let p = RetryPolicy {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            ..RetryPolicy::default()
        };
        let got: Vec<u128> = (0..5).map(|n| p.item_delay(n).as_millis()).collect();
        assert_eq!(got, [10, 20, 40, 50, 50]);
    }

    #[test]
    fn gives_up_after_threshold_requeues_and_never_with_zero() {
        assert!(!should_give_up(0, 15));
        assert!(
            !should_give_up(15, 15),
            "the Go library requeues while requeues < 15"
        );
        assert!(should_give_up(16, 15));
        assert!(!should_give_up(u32::MAX, 0));
        assert!(!should_give_up(1, 1));
        assert!(should_give_up(2, 1));
        let p = RetryPolicy::default();
        assert!(!p.should_give_up(15) && p.should_give_up(16));
    }

    #[test]
    fn bucket_allows_the_burst_then_limits_to_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 100, t0);
        for n in 0..100 {
            assert_eq!(b.reserve(t0), Duration::ZERO, "token {n}");
        }
        assert_eq!(b.reserve(t0), Duration::from_millis(100));
        assert_eq!(b.reserve(t0), Duration::from_millis(200));
        // One second later ten tokens came back; two of them were already promised.
        let t1 = t0 + secs(1);
        for n in 0..8 {
            assert_eq!(b.reserve(t1), Duration::ZERO, "token {n}");
        }
        assert_eq!(b.reserve(t1), Duration::from_millis(100));
        // Half a second later, five more.
        let t2 = t1 + Duration::from_millis(500);
        assert_eq!(b.reserve(t2), Duration::ZERO);
        for _ in 0..3 {
            b.reserve(t2);
        }
        assert_eq!(b.reserve(t2), Duration::from_millis(100));
    }

    #[test]
    fn bucket_refills_up_to_its_burst_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 100, t0);
        for _ in 0..100 {
            b.reserve(t0);
        }
        // An hour idle refills 100 tokens, not 36000.
        let later = t0 + secs(3600);
        for n in 0..100 {
            assert_eq!(b.reserve(later), Duration::ZERO, "token {n}");
        }
        assert_eq!(b.reserve(later), Duration::from_millis(100));
    }

    #[test]
    fn bucket_ignores_time_going_backwards() {
        let t0 = Instant::now() + secs(10);
        let mut b = TokenBucket::new(1.0, 1, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0 - secs(5)), secs(1));
    }

    #[test]
    fn a_zero_rate_bucket_never_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.0, 1, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0 + secs(100)), Duration::MAX);
    }

    #[test]
    fn backoff_counts_per_key_and_forgets() {
        let t0 = Instant::now();
        let mut q = Backoff::new(RetryPolicy::default(), t0);
        assert_eq!(q.failed(&"a", t0), secs(15));
        assert_eq!(q.failed(&"a", t0), secs(30));
        assert_eq!(q.failed(&"b", t0), secs(15));
        assert_eq!(q.failed(&"a", t0), secs(60));
        assert_eq!((q.failures(&"a"), q.failures(&"b")), (3, 1));
        assert_eq!(q.len(), 2);
        q.forget(&"a");
        assert_eq!(q.failures(&"a"), 0);
        assert_eq!(q.len(), 1);
        q.forget(&"b");
        assert!(q.is_empty());
        assert_eq!(q.failed(&"a", t0), secs(15));
    }

    #[test]
    fn backoff_gives_up_after_the_threshold() {
        let t0 = Instant::now();
        let policy = RetryPolicy {
            failure_threshold: 3,
            ..RetryPolicy::default()
        };
        let mut q = Backoff::new(policy, t0);
        for _ in 0..3 {
            q.failed(&1, t0);
            assert!(!q.should_give_up(&1));
        }
        q.failed(&1, t0);
        assert!(q.should_give_up(&1), "the failure after three requeues");
        assert!(!q.should_give_up(&2));
    }

    #[test]
    fn backoff_is_the_max_of_item_delay_and_bucket() {
        // Short per-item delays so the bucket dominates in a storm.
        let t0 = Instant::now();
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            bucket_rate: 10.0,
            bucket_burst: 2,
            ..RetryPolicy::default()
        };
        let mut q = Backoff::new(policy, t0);
        assert_eq!(q.failed(&1, t0), Duration::from_millis(1));
        assert_eq!(q.failed(&2, t0), Duration::from_millis(1));
        assert_eq!(q.failed(&3, t0), Duration::from_millis(100));
        assert_eq!(q.failed(&4, t0), Duration::from_millis(200));
        // With the default policy, the item's back-off dominates a full bucket.
        let mut q = Backoff::new(RetryPolicy::default(), t0);
        assert_eq!(q.failed(&1, t0), secs(15));
    }
}
