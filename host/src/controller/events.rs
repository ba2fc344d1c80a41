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
//! three minutes, past the chaos suite's +10% bound). This sink remembers only what a series needs (the Event's
//! name and namespace, its count, when it was last seen), for the same six minutes, and
//! at most [`MAX_SERIES`] of them: past that, the longest-quiet series are forgotten
//! first (as client-go's Event correlator bounds its cache with an LRU of 4096); a
//! forgotten series only means that its next repeat starts a new Event.
//!
//! Nor does publishing hold the operation up: an Event is queued for a writer task, so a
//! worker goes on with the claim (and the next one) while the Event is on its way. There
//! are [`WRITERS`] writers, each writing one Event at a time (as client-go's recorder
//! does), and all the Events of one object go to the same writer, in the order they
//! were published (so a series' create comes before its patches; only a Warning passes
//! the Normal Events waiting for a storm, below). A few Event requests
//! at once, not hundreds: in a storm the API server also serves the controller-manager's
//! binder, whose binds are one request after another.
//!
//! Nor does an Event compete with the work a claim waits for (docs/design.md, "Normal Events wait during a storm"): while a
//! provisioning storm is on ([`Storm`]: claims being provisioned, or our PVs not yet
//! Bound), a Normal Event waits, up to `max_delay` after it happened; Warnings are
//! written at once (behind nothing). Each Event carries the time it happened
//! (`eventTime`, a series' `lastObservedTime`), not the time it was written. A writer
//! queues at most [`QUEUE`] Events, and holds at most as many waiting ones (past that,
//! the oldest is written); past that, publishing waits (back-pressure, not an unbounded
//! queue, when the API server is slow). On shutdown, [`EventSink::flush`] writes what is
//! queued or waiting, for at most its timeout.

use std::collections::{HashMap, VecDeque};
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

use super::storm::Storm;

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

/// How often a writer with waiting Events looks whether the storm is over.
const STORM_POLL: Duration = Duration::from_millis(100);

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

/// Clones share the writers, which end once every clone is dropped.
#[derive(Clone)]
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

/// An Event to write, with its series' key and when it happened.
struct Pending {
    key: SeriesKey,
    /// When it happened: its `eventTime`, and the start of its wait in a storm.
    occurred: Timestamp,
    queued: Instant,
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
    storm: Arc<Storm>,
    /// The longest a Normal Event waits for a storm to pass.
    max_delay: Duration,
}

impl EventSink {
    /// Events reported as `reporter` (its controller is the provisioner name, its
    /// instance this process's identity); Normal ones wait while `storm` is on, at most
    /// `max_delay`. Starts the writer tasks (on the current Tokio runtime); they end with
    /// the sink.
    pub fn new(client: Client, reporter: Reporter, storm: Arc<Storm>, max_delay: Duration) -> Self {
        let writer = Arc::new(Writer {
            client,
            reporter,
            cache: Mutex::new(SeriesCache::new(MAX_SERIES)),
            storm,
            max_delay,
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

    /// A Normal Event on a claim about its volume's expansion.
    pub async fn expansion_normal(
        &self,
        claim: &PersistentVolumeClaim,
        reason: &str,
        note: String,
    ) {
        self.publish(
            claim.object_ref(&()),
            EventType::Normal,
            reason,
            "Expand",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim about its volume's expansion.
    pub async fn expansion_warning(
        &self,
        claim: &PersistentVolumeClaim,
        reason: &str,
        note: String,
    ) {
        self.publish(
            claim.object_ref(&()),
            EventType::Warning,
            reason,
            "Expand",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim or volume for giving up on it. Its own action keeps it
    /// apart from the attempts' series (Events aggregate by reason and action, and a
    /// series keeps its first note).
    pub async fn gave_up(&self, object: ObjectReference, reason: &str, note: String) {
        self.publish(object, EventType::Warning, reason, "GiveUp", note)
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

    /// A Warning Event on a StorageClass (lands in namespace `default`: classes are
    /// cluster-scoped); `action` is what was being done (`Validate`, `Reload`).
    pub async fn class_warning(
        &self,
        class: &k8s_openapi::api::storage::v1::StorageClass,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish(
            class.object_ref(&()),
            EventType::Warning,
            reason,
            action,
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
        let queue = &self.queues[writer_of(&reference, self.queues.len())];
        let job = Job::Write(Box::new(Pending {
            key,
            occurred: Timestamp::now(),
            queued: Instant::now(),
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

/// The writer of every Event about `reference` (by its UID, else its name), so that an
/// object's Events are written in the order they were published.
fn writer_of(reference: &ObjectReference, writers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&reference.uid, &reference.namespace, &reference.name).hash(&mut hasher);
    (hasher.finish() % writers as u64) as usize
}

impl Writer {
    /// Writes the queued Events one at a time until the sink is dropped; Normal ones
    /// wait in `waiting` while a storm is on ([`Self::due`]).
    async fn run(self: Arc<Self>, mut jobs: mpsc::Receiver<Job>) {
        let mut waiting: VecDeque<Box<Pending>> = VecDeque::new();
        loop {
            while let Some(event) = waiting.front() {
                if !self.due(event, waiting.len()) {
                    break;
                }
                let event = waiting.pop_front().expect("front exists");
                self.write_logged(&event).await;
            }
            let job = if waiting.is_empty() {
                jobs.recv().await
            } else {
                match tokio::time::timeout(STORM_POLL, jobs.recv()).await {
                    Ok(job) => job,
                    Err(_) => continue,
                }
            };
            let Some(job) = job else { return };
            match job {
                // A Normal Event waits behind the waiting ones, and while a storm is on.
                Job::Write(event)
                    if event.type_ == EventType::Normal
                        && (!waiting.is_empty() || self.storm.is_on()) =>
                {
                    waiting.push_back(event)
                }
                Job::Write(event) => self.write_logged(&event).await,
                Job::Flush(done) => {
                    for event in waiting.drain(..) {
                        self.write_logged(&event).await;
                    }
                    let _ = done.send(());
                }
            }
        }
    }

    /// Whether the first of `waiting` waiting Events is to be written now: the storm is
    /// over, it waited `max_delay`, or too many wait.
    fn due(&self, first: &Pending, waiting: usize) -> bool {
        waiting > QUEUE || first.queued.elapsed() >= self.max_delay || !self.storm.is_on()
    }

    /// Writes the Event; a failure is logged, never returned (an Event never fails an
    /// operation).
    async fn write_logged(&self, event: &Pending) {
        if let Err(error) = self.write(event).await {
            warn!(
                %error,
                reason = event.reason,
                object = event.reference.name.as_deref().unwrap_or_default(),
                "could not record an Event; check the host's RBAC on events.k8s.io events"
            );
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
                    "lastObservedTime": MicroTime(pending.occurred),
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
    /// cluster-scoped objects' Events in `default`), at the time it happened.
    fn event(&self, pending: &Pending) -> K8sEvent {
        let now = pending.occurred;
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
pub(crate) mod tests {
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

    /// A client whose API server answers every request with its own body (201) and
    /// sends each Event it was asked to store to the returned channel.
    pub(crate) fn recording_client() -> (Client, mpsc::UnboundedReceiver<K8sEvent>) {
        use http_body_util::BodyExt as _;
        let (sent, received) = mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let sent = sent.clone();
            async move {
                let body = request.into_body().collect().await?.to_bytes();
                if let Ok(event) = serde_json::from_slice::<K8sEvent>(&body) {
                    let _ = sent.send(event);
                }
                http::Response::builder()
                    .status(201)
                    .body(kube::client::Body::from(body.to_vec()))
                    .map_err(tower::BoxError::from)
            }
        });
        (Client::new(service, "default"), received)
    }

    fn sink(
        storm: Arc<Storm>,
        max_delay: Duration,
    ) -> (EventSink, mpsc::UnboundedReceiver<K8sEvent>) {
        let (client, written) = recording_client();
        let reporter = Reporter {
            controller: "us".into(),
            instance: Some("us-1".into()),
        };
        (EventSink::new(client, reporter, storm, max_delay), written)
    }

    fn pvc(name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        }
    }

    async fn next(
        written: &mut mpsc::UnboundedReceiver<K8sEvent>,
        within: Duration,
    ) -> Option<K8sEvent> {
        tokio::time::timeout(within, written.recv())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn in_a_storm_normal_events_wait_for_its_end_and_warnings_do_not() {
        let storm = Arc::new(Storm::new("us"));
        let (sink, mut written) = sink(storm.clone(), Duration::from_secs(60));
        let provisioning = storm.provisioning();
        let published = Timestamp::now();
        sink.claim_normal(&pvc("a"), "Provisioning", "a's note".into())
            .await;
        sink.claim_warning(&pvc("b"), "ProvisioningFailed", "b's note".into())
            .await;
        let first = next(&mut written, Duration::from_secs(5))
            .await
            .expect("the Warning is written");
        assert_eq!(first.reason.as_deref(), Some("ProvisioningFailed"));
        assert!(
            next(&mut written, Duration::from_millis(500))
                .await
                .is_none(),
            "a Normal Event was written while a claim was being provisioned"
        );
        let storm_ended = Timestamp::now();
        drop(provisioning);
        let second = next(&mut written, Duration::from_secs(5))
            .await
            .expect("the Normal Event is written once the storm is over");
        assert_eq!(second.reason.as_deref(), Some("Provisioning"));
        let happened = second.event_time.expect("eventTime").0;
        assert!(
            published <= happened && happened < storm_ended,
            "its eventTime is when it was published ({published}), not when it was written after {storm_ended}: {happened}"
        );
    }

    #[tokio::test]
    async fn a_normal_event_waits_at_most_its_max_delay_and_a_flush_writes_it() {
        let storm = Arc::new(Storm::new("us"));
        let (sink, mut written) = sink(storm.clone(), Duration::from_millis(400));
        let _endless = storm.provisioning();
        let started = Instant::now();
        sink.claim_normal(&pvc("a"), "Provisioning", "note".into())
            .await;
        next(&mut written, Duration::from_secs(5))
            .await
            .expect("written after its max delay");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(400),
            "written after {waited:?}, before its max delay"
        );

        let (sink, mut written) = self::sink(storm.clone(), Duration::from_secs(60));
        sink.claim_normal(&pvc("c"), "ProvisioningSucceeded", "note".into())
            .await;
        sink.flush(Duration::from_secs(5)).await;
        let flushed = written
            .try_recv()
            .expect("a flush writes the waiting Events");
        assert_eq!(flushed.reason.as_deref(), Some("ProvisioningSucceeded"));
    }

    #[tokio::test]
    async fn without_a_storm_a_normal_event_is_written_at_once() {
        let storm = Arc::new(Storm::new("us"));
        let (sink, mut written) = sink(storm, Duration::from_secs(60));
        sink.claim_normal(&pvc("a"), "ProvisioningSucceeded", "note".into())
            .await;
        next(&mut written, Duration::from_secs(2))
            .await
            .expect("written at once");
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
