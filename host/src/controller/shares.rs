//! Each module's share of a controller's workers, so one slow module cannot starve the
//! others.
//!
//! A controller has `--threads` workers (kube-runtime's concurrency). A reconcile that
//! calls a module holds one of them for the whole call (from before the first call of
//! the reconcile until the provision or delete call returns; the API writes after it
//! need a worker, not the module): without a bound, 32 claims of a
//! class whose module takes seconds occupy every worker, and a fast module's claim waits
//! behind all of them. So each module may hold at most
//! [`share_limit`]`(threads, maxConcurrentCalls)` workers at once: its
//! `maxConcurrentCalls`, and never all of them (`threads - 1` when `threads > 1`).
//!
//! A claim (or volume: the volume controller has shares of its own) whose module is at
//! its share does not wait on a worker: its reconcile ends at once (no failed attempt,
//! no Event, no back-off) and the claim joins the module's own queue. When one of the
//! module's reconciles ends, the first waiting claim is reconciled again through the
//! controller's `reconcile_on` trigger; a waiting claim also re-checks every
//! [`RECHECK`] in case its wake-up went to a claim that no longer needed it.
//!
//! Several slow modules can still together hold every worker (each within its share);
//! raise `--threads` when many modules are slow at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::ObjectRef;
use prometheus::IntGaugeVec;

/// How long a waiting object sleeps before looking again without a wake-up.
pub const RECHECK: Duration = Duration::from_secs(5);

/// How soon a claim (volume) whose module is still loading is looked at again: a
/// reconcile that finds its module loading costs no API request, and the claims created
/// with the host (or just before it) should not wait long past their module's compile.
pub const LOADING_RECHECK: Duration = Duration::from_secs(1);

/// The workers one module may hold: its `maxConcurrentCalls`, at least one, and with
/// more than one worker never all of them.
pub fn share_limit(threads: u16, max_concurrent_calls: u32) -> usize {
    let threads = usize::from(threads.max(1));
    let others_keep_one = if threads > 1 { threads - 1 } else { 1 };
    (max_concurrent_calls.max(1) as usize).min(others_keep_one)
}

/// The shares of one controller's workers, per module.
pub struct WorkerShares<K: kube::Resource<DynamicType = ()>> {
    /// The controller's queue, for the gauge: `claims` or `volumes`.
    queue: &'static str,
    threads: u16,
    modules: Mutex<HashMap<String, Share<K>>>,
    wake: UnboundedSender<ObjectRef<K>>,
    /// Objects waiting per module and queue (`wasm_provisioner_module_waiting`).
    waiting_gauge: IntGaugeVec,
}

struct Share<K: kube::Resource<DynamicType = ()>> {
    running: usize,
    /// The waiting objects in order of arrival; an entry no longer in `queued` (the
    /// object entered since) is skipped.
    waiting: VecDeque<ObjectRef<K>>,
    /// The objects waiting: membership in O(1), so a storm of thousands of waiting
    /// claims costs no scan per attempt.
    queued: HashSet<ObjectRef<K>>,
}

impl<K: kube::Resource<DynamicType = ()>> Share<K> {
    /// The first object still waiting, taken out of the queue.
    fn next_waiting(&mut self) -> Option<ObjectRef<K>> {
        while let Some(next) = self.waiting.pop_front() {
            if self.queued.remove(&next) {
                return Some(next);
            }
        }
        None
    }
}

/// One worker of a module's share, held until the module's call returns (dropped then,
/// or when the reconcile ends).
pub struct SharePermit<K: kube::Resource<DynamicType = ()>> {
    shares: Arc<WorkerShares<K>>,
    module: String,
}

impl<K: kube::Resource<DynamicType = ()>> WorkerShares<K> {
    /// The shares, and the stream of wake-ups the controller must reconcile
    /// (`Controller::reconcile_on`).
    pub fn new(
        queue: &'static str,
        threads: u16,
        waiting_gauge: IntGaugeVec,
    ) -> (Arc<Self>, UnboundedReceiver<ObjectRef<K>>) {
        let (wake, wakeups) = unbounded();
        let shares = Arc::new(WorkerShares {
            queue,
            threads,
            modules: Mutex::default(),
            wake,
            waiting_gauge,
        });
        (shares, wakeups)
    }

    /// A worker of `module`'s share for `object`, or `None`: the module holds its whole
    /// share, and `object` now waits in the module's queue (once, however often it
    /// asks) until a worker of the share frees.
    pub fn try_enter(
        self: &Arc<Self>,
        module: &str,
        max_concurrent_calls: u32,
        object: ObjectRef<K>,
    ) -> Option<SharePermit<K>> {
        let limit = share_limit(self.threads, max_concurrent_calls);
        let mut modules = self.lock();
        let share = modules.entry(module.to_string()).or_insert_with(|| Share {
            running: 0,
            waiting: VecDeque::new(),
            queued: HashSet::new(),
        });
        let entered = if share.running < limit {
            share.running += 1;
            share.queued.remove(&object);
            true
        } else {
            if share.queued.insert(object.clone()) {
                share.waiting.push_back(object);
            }
            false
        };
        self.set_gauge(module, share);
        entered.then(|| SharePermit {
            shares: self.clone(),
            module: module.to_string(),
        })
    }

    /// Objects waiting for a worker of `module`'s share.
    pub fn waiting(&self, module: &str) -> usize {
        self.lock()
            .get(module)
            .map_or(0, |share| share.queued.len())
    }

    /// Workers `module` holds now.
    pub fn running(&self, module: &str) -> usize {
        self.lock().get(module).map_or(0, |share| share.running)
    }

    fn set_gauge(&self, module: &str, share: &Share<K>) {
        self.waiting_gauge
            .with_label_values(&[module, self.queue])
            .set(share.queued.len() as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Share<K>>> {
        self.modules.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<K: kube::Resource<DynamicType = ()>> Drop for SharePermit<K> {
    fn drop(&mut self) {
        // The module's worker is free: the first claim waiting for it is reconciled.
        let shares = &self.shares;
        let mut modules = shares.modules.lock().unwrap_or_else(|e| e.into_inner());
        let Some(share) = modules.get_mut(&self.module) else {
            return;
        };
        share.running = share.running.saturating_sub(1);
        if let Some(next) = share.next_waiting() {
            let _ = shares.wake.unbounded_send(next);
        }
        shares
            .waiting_gauge
            .with_label_values(&[self.module.as_str(), shares.queue])
            .set(share.queued.len() as i64);
        if share.running == 0 && share.queued.is_empty() {
            modules.remove(&self.module);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use prometheus::Opts;

    fn claim(name: &str) -> ObjectRef<PersistentVolumeClaim> {
        ObjectRef::new(name).within("default")
    }

    fn shares(
        threads: u16,
    ) -> (
        Arc<WorkerShares<PersistentVolumeClaim>>,
        UnboundedReceiver<ObjectRef<PersistentVolumeClaim>>,
    ) {
        let gauge = IntGaugeVec::new(Opts::new("waiting", "test"), &["module", "queue"]).unwrap();
        WorkerShares::new("claims", threads, gauge)
    }

    #[test]
    fn a_module_never_holds_every_worker() {
        assert_eq!(share_limit(4, 8), 3);
        assert_eq!(share_limit(4, 2), 2);
        assert_eq!(share_limit(2, 8), 1);
        assert_eq!(share_limit(1, 8), 1);
        assert_eq!(share_limit(16, 0), 1);
    }

    #[tokio::test]
    async fn a_full_share_queues_and_a_freed_worker_wakes_the_first_waiter() {
        let (shares, mut wakeups) = shares(4);
        let held: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                shares
                    .try_enter("slow", 8, claim(n))
                    .expect("within the share")
            })
            .collect();
        assert!(shares.try_enter("slow", 8, claim("d")).is_none());
        assert!(shares.try_enter("slow", 8, claim("e")).is_none());
        // Asking again does not queue twice; another module is not affected.
        assert!(shares.try_enter("slow", 8, claim("d")).is_none());
        assert_eq!(shares.waiting("slow"), 2);
        let fast = shares.try_enter("fast", 8, claim("f"));
        assert!(fast.is_some());

        drop(held);
        assert_eq!(wakeups.next().await, Some(claim("d")));
        assert_eq!(wakeups.next().await, Some(claim("e")));
        assert_eq!(shares.waiting("slow"), 0);
        assert_eq!(shares.running("slow"), 0);
        // The woken claim enters.
        let d = shares.try_enter("slow", 8, claim("d"));
        assert!(d.is_some());
        assert_eq!(shares.running("slow"), 1);
    }
}
