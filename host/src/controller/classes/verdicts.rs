//! The verdicts of `validate-class`, one per class version and module version: asked
//! once however many claims (and the class loop, and the version gate) want it at the
//! same moment, and kept while both versions are current.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

/// What a module said of a class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    /// The module rejected the class: its message.
    Rejected(String),
    /// The validation call failed (trapped, timed out, ...): the call's error.
    Failed(String),
}

impl Verdict {
    pub fn is_valid(&self) -> bool {
        matches!(self, Verdict::Valid)
    }
}

/// Which verdict: the class at one resourceVersion, by one version of its module.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VerdictKey {
    pub class: String,
    pub class_version: String,
    pub module: String,
    pub module_sha256: String,
}

/// How long a failed validation stands before it is asked again: a timeout may pass.
pub const FAILED_VERDICT_TTL: Duration = Duration::from_secs(60);

type Cell = Arc<OnceCell<(Verdict, Instant)>>;

/// The verdicts known, by key.
#[derive(Default)]
pub struct Verdicts {
    cells: Mutex<HashMap<VerdictKey, Cell>>,
}

/// A verdict looked up, and whether this lookup is the one that asked the module (it
/// tells the class: Event, log, gauge).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub verdict: Verdict,
    pub asked_now: bool,
}

impl Verdicts {
    fn cell(&self, key: &VerdictKey, now: Instant) -> Cell {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let stale = cells.get(key).is_some_and(|cell| {
            matches!(cell.get(), Some((Verdict::Failed(_), at)) if now.duration_since(*at) >= FAILED_VERDICT_TTL)
        });
        if stale {
            cells.remove(key);
        }
        cells.entry(key.clone()).or_default().clone()
    }

    /// The verdict for `key`, asking `ask` only if none is known: concurrent lookups of
    /// one key wait for the one call. `ask` answering `None` (the call could not start:
    /// the module busy, the instance pool full) leaves nothing known, and so does this.
    pub async fn get_or_ask<F, Fut>(&self, key: &VerdictKey, ask: F) -> Option<Lookup>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<Verdict>>,
    {
        let cell = self.cell(key, Instant::now());
        let asked_now = AtomicBool::new(false);
        let asked = &asked_now;
        let (verdict, _) = cell
            .get_or_try_init(|| async move {
                asked.store(true, Ordering::Relaxed);
                ask()
                    .await
                    .map(|verdict| (verdict, Instant::now()))
                    .ok_or(())
            })
            .await
            .ok()?;
        Some(Lookup {
            verdict: verdict.clone(),
            asked_now: asked_now.load(Ordering::Relaxed),
        })
    }

    /// The verdict for `key`, if known (never asks).
    pub fn get(&self, key: &VerdictKey) -> Option<Verdict> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells
            .get(key)
            .and_then(|cell| cell.get())
            .map(|(verdict, _)| verdict.clone())
    }

    /// Keeps only the verdicts `live` says are current (a class changed or gone, a
    /// module replaced: its old verdicts go).
    pub fn retain(&self, live: impl Fn(&VerdictKey) -> bool) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.retain(|key, _| live(key));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cells.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn key(class_version: &str, module_sha256: &str) -> VerdictKey {
        VerdictKey {
            class: "fast".into(),
            class_version: class_version.into(),
            module: "hostpath".into(),
            module_sha256: module_sha256.into(),
        }
    }

    #[tokio::test]
    async fn a_verdict_is_asked_once_however_many_want_it_at_once() {
        let verdicts = Verdicts::default();
        let asked = AtomicUsize::new(0);
        let ask = || async {
            asked.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Some(Verdict::Rejected("unknown parameter `sahre`".into()))
        };
        let first = key("1", "a");
        let lookups =
            futures::future::join_all((0..8).map(|_| verdicts.get_or_ask(&first, ask))).await;
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "one call for eight lookups"
        );
        assert_eq!(
            lookups
                .iter()
                .filter(|l| l.as_ref().unwrap().asked_now)
                .count(),
            1,
            "exactly one lookup tells the class"
        );
        for lookup in &lookups {
            assert_eq!(
                lookup.as_ref().unwrap().verdict,
                Verdict::Rejected("unknown parameter `sahre`".into())
            );
        }
        // Known from now on: not asked again.
        let again = verdicts.get_or_ask(&key("1", "a"), ask).await.unwrap();
        assert!(!again.asked_now);
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        assert_eq!(
            verdicts.get(&key("1", "a")),
            Some(Verdict::Rejected("unknown parameter `sahre`".into()))
        );
    }

    #[tokio::test]
    async fn a_new_class_version_or_module_version_is_asked_again() {
        let verdicts = Verdicts::default();
        let asked = AtomicUsize::new(0);
        let ask = || async {
            asked.fetch_add(1, Ordering::SeqCst);
            Some(Verdict::Valid)
        };
        for key in [key("1", "a"), key("2", "a"), key("2", "b"), key("2", "b")] {
            verdicts.get_or_ask(&key, ask).await.unwrap();
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        verdicts.retain(|k| k.class_version == "2" && k.module_sha256 == "b");
        assert_eq!(verdicts.len(), 1);
        assert_eq!(verdicts.get(&key("1", "a")), None);
    }

    #[tokio::test]
    async fn a_call_that_could_not_start_leaves_nothing_known() {
        let verdicts = Verdicts::default();
        assert_eq!(
            verdicts.get_or_ask(&key("1", "a"), || async { None }).await,
            None
        );
        assert_eq!(verdicts.get(&key("1", "a")), None);
        let lookup = verdicts
            .get_or_ask(&key("1", "a"), || async { Some(Verdict::Valid) })
            .await
            .unwrap();
        assert!(lookup.asked_now);
    }

    #[tokio::test]
    async fn a_failed_validation_is_asked_again_after_its_ttl() {
        let verdicts = Verdicts::default();
        let failed = || async { Some(Verdict::Failed("timed out".into())) };
        verdicts.get_or_ask(&key("1", "a"), failed).await.unwrap();
        // Within its time it stands.
        let cell = verdicts.cell(&key("1", "a"), Instant::now());
        assert!(cell.get().is_some());
        // Past it, the cell is fresh.
        let later = Instant::now() + FAILED_VERDICT_TTL;
        assert!(verdicts.cell(&key("1", "a"), later).get().is_none());
        // A rejection (the module's answer) never expires.
        let rejected = || async { Some(Verdict::Rejected("no".into())) };
        verdicts.get_or_ask(&key("2", "a"), rejected).await.unwrap();
        assert!(verdicts.cell(&key("2", "a"), later).get().is_some());
    }
}
