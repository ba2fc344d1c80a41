//! Events on claims and volumes, with upstream's reason strings. Publishing an Event
//! never fails an operation: a refused Event is logged and the work goes on.
//!
//! Events are events.k8s.io/v1 objects written as kube-runtime's `Recorder` writes them
//! (the same names, fields and reporting controller/instance): the first occurrence is
//! created; a repeat of the same type, reason, action **and note** on the same object
//! within six minutes of the last one patches the first Event's `series` (count, last
//! observed time) instead of creating another. Unlike the `Recorder`, whose series key
//! leaves the note out (so a claim's first `ProvisioningFailed`, say "storage class not
//! found", hid every later and different cause under its note), a different note starts
//! an Event of its own, as client-go's event correlator keeps distinct messages apart.
//!
//! Why not the `Recorder` itself: it remembers every Event it sent, whole (~1.5 KB
//! each, the note, both references and the metadata), for six minutes, with no bound
//! and no way to prune it. A churn of claims is three Events per claim, so the host's
//! memory grew with the churn rate (+11 MiB over 3000 create/delete cycles in under
//! three minutes, issue 10.8). This sink remembers only what a series needs (the Event's
//! name and namespace, its count, when it was last seen), for the same six minutes, and
//! at most [`MAX_SERIES`] of them: past that, the longest-quiet series are forgotten
//! first (as client-go's Event correlator bounds its cache with an LRU of 4096); a
//! forgotten series only means that its next repeat starts a new Event.
//!
//! Nor does publishing hold the operation up: an Event is queued for a writer task, so a
//! worker goes on with the claim (and the next one) while the Event is on its way; the
//! two Events of a provisioned volume are off its critical path (issue 11.3). There are
//! [`WRITERS`] writers, each writing one Event at a time (as client-go's recorder does),
//! and a series always goes to the same writer, so its create comes before its patches.
//! A few Event requests at once, not hundreds: in a storm the API server also serves the
//! controller-manager's binder, whose binds are one request after another. A writer
//! queues at most [`QUEUE`] Events; past that, publishing waits (back-pressure, not an
//! unbounded queue, when the API server is slow). On shutdown, [`EventSink::flush`]
//! writes what is queued, for at most its timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Client, Resource};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Events API limit on a note.
const MAX_NOTE_BYTES: usize = 1024;

/// How long a series stays open after its last occurrence (kube-runtime's `CACHE_TTL`,
/// client-go's events `finishTime`).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The most series remembered at once (client-go's `maxLruCacheEntries`).
const MAX_SERIES: usize = 4096;

/// Writer tasks, each writing one Event at a time.
const WRITERS: usize = 2;

/// Events queued per writer before publishing waits (a storm of 2000 claims makes 4000).
const QUEUE: usize = 4096;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What makes two Events one series (kube-runtime's `EventKey` without the reporter,
/// which is the same for every Event of this sink, and without a related object, which
/// this sink never sets; with the note): the type, reason, action, note and the
/// regarding object's apiVersion, kind, namespace, name and UID, kept as one 64-bit hash
/// so that a remembered series costs a few dozen bytes, not a copy of all of them (a
/// collision, about 1 in 10^12 with a full cache, would only count an Event in the
/// other's series).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SeriesKey(u64);

impl SeriesKey {
    fn new(
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        regarding: &ObjectReference,
    ) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (
            type_,
            reason,
            action,
            note,
            &regarding.api_version,
            &regarding.kind,
            &regarding.namespace,
            &regarding.name,
            &regarding.uid,
        )
            .hash(&mut hasher);
        Self(hasher.finish())
    }
}

/// An open series: the Event that started it and how often it happened.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    /// The Event object's name and namespace.
    name: String,
    namespace: String,
    /// Occurrences so far (1: created, no `series` yet).
    count: i32,
    last_seen: Instant,
}

/// The open series, bounded in time ([`SERIES_TTL`]) and size (`capacity`).
struct SeriesCache {
    capacity: usize,
    series: HashMap<SeriesKey, Series>,
    last_pruned: Option<Instant>,
}

impl SeriesCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            series: HashMap::new(),
            last_pruned: None,
        }
    }

    /// The open series of `key` at `now`, if any.
    fn get(&mut self, key: &SeriesKey, now: Instant) -> Option<Series> {
        self.prune(now, false);
        self.series
            .get(key)
            .filter(|series| now.saturating_duration_since(series.last_seen) < SERIES_TTL)
            .cloned()
    }

    /// Records `series` as the latest of `key`; makes room first when full.
    fn put(&mut self, key: SeriesKey, series: Series) {
        if !self.series.contains_key(&key) && self.series.len() >= self.capacity {
            self.prune(series.last_seen, true);
            if self.series.len() >= self.capacity {
                // Forget the longest-quiet eighth at once, so a churn does not scan the
                // whole cache at every new Event.
                let mut by_age: Vec<(Instant, SeriesKey)> = self
                    .series
                    .iter()
                    .map(|(key, series)| (series.last_seen, *key))
                    .collect();
                by_age.sort_unstable_by_key(|(last_seen, _)| *last_seen);
                let evict = (self.capacity / 8).max(1);
                for (_, key) in by_age.into_iter().take(evict) {
                    self.series.remove(&key);
                }
            }
        }
        self.series.insert(key, series);
    }

    /// Forgets the series that ended (quiet for [`SERIES_TTL`]); at most once a second
    /// unless `force`.
    fn prune(&mut self, now: Instant, force: bool) {
        if !force
            && self
                .last_pruned
                .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.last_pruned = Some(now);
        self.series
            .retain(|_, series| now.saturating_duration_since(series.last_seen) < SERIES_TTL);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.series.len()
    }
}

pub struct EventSink {
    /// One queue per writer task; a series' key picks its writer.
    queues: Vec<mpsc::Sender<Job>>,
}

/// What a writer task is asked to do.
enum Job {
    Write(Box<Pending>),
    /// Answer once everything queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// An Event to write, with its series' key (which also picked its writer).
struct Pending {
    key: SeriesKey,
    reference: ObjectReference,
    type_: EventType,
    reason: String,
    action: String,
    note: String,
}

/// What writes the Events, shared by their tasks.
struct Writer {
    client: Client,
    reporter: Reporter,
    cache: Mutex<SeriesCache>,
}

impl EventSink {
    /// Events reported as `reporter` (its controller is the provisioner name, its
    /// instance this process's identity). Starts the writer tasks (on the current Tokio
    /// runtime); they end with the sink.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        let writer = Arc::new(Writer {
            client,
            reporter,
            cache: Mutex::new(SeriesCache::new(MAX_SERIES)),
        });
        let queues = (0..WRITERS)
            .map(|_| {
                let (queue, jobs) = mpsc::channel(QUEUE);
                tokio::spawn(writer.clone().run(jobs));
                queue
            })
            .collect();
        Self { queues }
    }

    /// Waits (at most `timeout`) until every Event queued so far is written.
    pub async fn flush(&self, timeout: Duration) {
        let flushed = futures::future::join_all(self.queues.iter().map(|queue| async move {
            let (done, written) = oneshot::channel();
            if queue.send(Job::Flush(done)).await.is_ok() {
                let _ = written.await;
            }
        }));
        if tokio::time::timeout(timeout, flushed).await.is_err() {
            warn!("some Events were still waiting to be written at shutdown");
        }
    }

    /// A Normal Event on a claim.
    pub async fn claim_normal(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Normal,
            reason,
            "Provision",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim.
    pub async fn claim_warning(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Warning,
            reason,
            "Provision",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim for giving up on it. Its own action keeps it apart from
    /// the attempts' ProvisioningFailed series (Events aggregate by reason and action,
    /// and a series keeps its first note).
    pub async fn claim_gave_up(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Warning,
            reason,
            "GiveUp",
            note,
        )
        .await;
    }

    /// A Warning Event on a volume for giving up on its deletion.
    pub async fn volume_gave_up(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Warning,
            reason,
            "GiveUp",
            note,
        )
        .await;
    }

    /// A Normal Event on a volume (lands in namespace `default`: PVs are cluster-scoped).
    pub async fn volume_normal(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Normal,
            reason,
            "Delete",
            note,
        )
        .await;
    }

    /// A Warning Event on a volume (lands in namespace `default`: PVs are cluster-scoped).
    pub async fn volume_warning(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Warning,
            reason,
            "Delete",
            note,
        )
        .await;
    }

    /// Queues the Event for its series' writer (waiting only when that queue is full).
    async fn publish(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let note = truncate(note);
        let key = SeriesKey::new(type_, reason, action, &note, &reference);
        let queue = &self.queues[(key.0 % self.queues.len() as u64) as usize];
        let job = Job::Write(Box::new(Pending {
            key,
            reference,
            type_,
            reason: reason.to_string(),
            action: action.to_string(),
            note,
        }));
        // Fails only when the writer is gone (the runtime is ending).
        let _ = queue.send(job).await;
    }
}

impl Writer {
    /// Writes the queued Events one at a time until the sink is dropped.
    async fn run(self: Arc<Self>, mut jobs: mpsc::Receiver<Job>) {
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Write(event) => {
                    if let Err(error) = self.write(&event).await {
                        warn!(
                            %error,
                            reason = event.reason,
                            object = event.reference.name.as_deref().unwrap_or_default(),
                            "could not record an Event; check the host's RBAC on events.k8s.io events"
                        );
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Creates the Event, or patches the series it repeats.
    async fn write(&self, pending: &Pending) -> Result<(), kube::Error> {
        let key = pending.key;
        let now = Instant::now();
        let open = self.lock().get(&key, now);
        if let Some(mut series) = open {
            series.count += 1;
            let patch = serde_json::json!({
                "series": {
                    "count": series.count,
                    "lastObservedTime": MicroTime(Timestamp::now()),
                }
            });
            let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &series.namespace);
            match events
                .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    series.last_seen = now;
                    self.lock().put(key, series);
                    return Ok(());
                }
                // The Event expired on the server (its TTL is an hour by default):
                // start a new one, as client-go does.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        let event = self.event(pending);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let created = events.create(&PostParams::default(), &event).await?;
        let series = Series {
            name: created.metadata.name.unwrap_or_default(),
            namespace,
            count: 1,
            last_seen: now,
        };
        self.lock().put(key, series);
        Ok(())
    }

    /// A new Event, as kube-runtime's `Recorder` makes it (name `<object>.<nanos hex>`,
    /// cluster-scoped objects' Events in `default`).
    fn event(&self, pending: &Pending) -> K8sEvent {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        let reference = &pending.reference;
        K8sEvent {
            action: Some(pending.action.clone()),
            reason: Some(pending.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            note: Some(pending.note.clone()),
            metadata: ObjectMeta {
                namespace: Some(
                    reference
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".to_string()),
                ),
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_ref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(pending.type_.as_str().to_string()),
            ..K8sEvent::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SeriesCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn key(name: &str, reason: &str) -> SeriesKey {
        SeriesKey::new(
            EventType::Warning,
            reason,
            "Provision",
            "note",
            &claim(name),
        )
    }

    #[test]
    fn a_different_note_is_a_series_of_its_own() {
        let first = SeriesKey::new(
            EventType::Warning,
            "ProvisioningFailed",
            "Provision",
            "storage class \"c\" not found",
            &claim("a"),
        );
        let later = SeriesKey::new(
            EventType::Warning,
            "ProvisioningFailed",
            "Provision",
            "hostPath /: not granted (rule modules.m.volumes.hostPath)",
            &claim("a"),
        );
        assert_ne!(first, later);
        assert_eq!(first.clone(), first);
    }

    fn series(name: &str, count: i32, last_seen: Instant) -> Series {
        Series {
            name: format!("{name}.1"),
            namespace: "default".into(),
            count,
            last_seen,
        }
    }

    #[test]
    fn a_repeat_within_six_minutes_continues_the_series() {
        let t0 = Instant::now();
        let mut cache = SeriesCache::new(16);
        cache.put(key("a", "ProvisioningFailed"), series("a", 1, t0));
        let open = cache.get(
            &key("a", "ProvisioningFailed"),
            t0 + Duration::from_secs(300),
        );
        assert_eq!(open, Some(series("a", 1, t0)));
        assert_eq!(
            cache.get(&key("a", "ProvisioningSucceeded"), t0),
            None,
            "another reason is another series"
        );
        assert_eq!(cache.get(&key("b", "ProvisioningFailed"), t0), None);
        // Six minutes after the last occurrence the series has ended, and is forgotten.
        let later = t0 + SERIES_TTL;
        assert_eq!(cache.get(&key("a", "ProvisioningFailed"), later), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_later_occurrence_keeps_the_series_open() {
        let t0 = Instant::now();
        let mut cache = SeriesCache::new(16);
        cache.put(key("a", "ProvisioningFailed"), series("a", 1, t0));
        let t1 = t0 + Duration::from_secs(300);
        cache.put(key("a", "ProvisioningFailed"), series("a", 2, t1));
        let open = cache.get(&key("a", "ProvisioningFailed"), t0 + SERIES_TTL);
        assert_eq!(open.map(|s| s.count), Some(2));
    }

    #[test]
    fn the_cache_never_grows_past_its_capacity() {
        let t0 = Instant::now();
        let mut cache = SeriesCache::new(64);
        for i in 0..10_000u64 {
            let name = format!("claim-{i}");
            cache.put(
                key(&name, "ProvisioningSucceeded"),
                series(&name, 1, t0 + Duration::from_millis(i)),
            );
            assert!(cache.len() <= 64);
        }
        // The newest series are the ones kept.
        let newest = "claim-9999";
        assert!(
            cache
                .get(
                    &key(newest, "ProvisioningSucceeded"),
                    t0 + Duration::from_secs(10)
                )
                .is_some()
        );
        assert!(
            cache
                .get(
                    &key("claim-0", "ProvisioningSucceeded"),
                    t0 + Duration::from_secs(10)
                )
                .is_none()
        );
    }

    #[test]
    fn notes_fit_the_events_api() {
        assert_eq!(truncate("short".into()), "short");
        let long = "é".repeat(2000);
        let cut = truncate(long);
        assert!(cut.len() <= 1024 && cut.ends_with("..."));
    }
}
