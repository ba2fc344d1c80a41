//! The provisioning controllers: one for claims (provision), one for volumes (delete),
//! one for the expansion of bound claims' volumes, over shared informer caches of
//! claims, volumes, classes and nodes.
//!
//! Each controller is a kube-runtime `Controller` with `threads` workers. `reconcile`
//! functions are free functions over `(Arc<Object>, Arc<Context>)`; failures go through
//! [`retry::Retries`], which applies the Go library's rate limiting (per-item exponential
//! back-off combined with an overall token bucket) and failure thresholds.

mod calls;
pub mod claims;
pub mod classes;
mod events;
pub mod expansion;
pub mod faults;
mod finalizers;
pub mod gone_nodes;
mod journal;
mod pool_full;
mod recent;
pub mod retry;
pub mod secrets;
pub mod shares;
mod static_volumes;
pub mod storage_capacity;
mod storm;
pub mod volumes;

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::nodes::Backends;
use crate::server::Health;
pub use events::EventSink;
pub use faults::Faults;
pub use journal::journal_name;
pub use retry::{Retries, RetryPolicy};
pub use shares::WorkerShares;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_runtime::Runtime;

/// The controllers' knobs, from the `run` flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The name StorageClasses use in `provisioner` and PVs carry in provisioned-by.
    pub provisioner_name: String,
    /// Workers per controller.
    pub threads: u16,
    /// Every object is reconciled again after this long without events.
    pub resync_period: Duration,
    /// Retry arithmetic for claims and volumes.
    pub retry: RetryPolicy,
    /// Failed provision attempts before giving up on a claim (0 = never give up).
    pub failed_provision_threshold: u32,
    /// Failed delete attempts before giving up on a volume (0 = never give up).
    pub failed_delete_threshold: u32,
    /// Tries to save a provisioned PV before deleting the backend volume.
    pub pv_save_retries: u32,
    /// Pause between tries to save a PV.
    pub pv_save_interval: Duration,
    /// Add the HonorPVReclaimPolicy finalizer to our Bound PVs with policy Delete.
    pub volume_protection_finalizer: bool,
    /// Test hooks: crash points ([`faults`]).
    pub faults: Faults,
    /// This process's identity (the Events' reporting instance, the Lease holder).
    pub identity: String,
    /// Where the provisioning journal lives ([`journal`]): the host's own namespace.
    pub journal_namespace: String,
    /// The journal ConfigMap's name (after the provisioner's Lease name).
    pub journal_name: String,
    /// Provision a claim of one of our classes before the binder announces it, unless
    /// an existing PV may be its ([`static_volumes`]).
    pub provision_before_binder: bool,
    /// The longest a Normal Event waits for a provisioning storm to pass ([`storm`]).
    pub event_max_delay: Duration,
    /// How often the leader asks each class's module for its backend's capacity
    /// ([`classes::capacity`]).
    pub capacity_poll_interval: Duration,
    /// The node this host runs on (`--node-name`), told to guests as their calls' node.
    pub node_name: Option<String>,
    /// Node-local mode: what becomes of the PVs of a deleted Node ([`gone_nodes`]).
    pub node_gone_policy: gone_nodes::Policy,
    /// Node-local mode: how long a Node is gone before policy `remove` acts.
    pub node_gone_grace: Duration,
}

/// The node recorded on a PV made in node-local mode (`wasm-provisioner.dev/node`).
pub fn recorded_node(pv: &PersistentVolume) -> Option<&str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(wasm_provisioner_rules::names::ANN_NODE))
        .map(String::as_str)
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub runtime: Arc<Runtime>,
    /// Where each guest call runs: here, or (node-local mode) on its node's instance.
    pub backends: Arc<Backends>,
    pub claims: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    /// Node metadata only (a metadata-only watch): a provision request needs the
    /// selected node's name and labels, nothing else of a node.
    pub nodes: Store<PartialObjectMeta<Node>>,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
    pub claim_retries: Retries,
    pub volume_retries: Retries,
    /// The expansion controller's retries (keyed by claim UID, as the claim controller's).
    pub expansion_retries: Retries,
    /// Each module's share of the claim workers ([`shares`]).
    pub claim_shares: Arc<WorkerShares<PersistentVolumeClaim>>,
    /// Each module's share of the volume workers.
    pub volume_shares: Arc<WorkerShares<PersistentVolume>>,
    /// True once all four stores hold their first full list ([`Context::caches_synced`]).
    pub caches_synced: tokio::sync::watch::Receiver<bool>,
    /// The fence every backend-changing step runs through ([`Leadership::fenced`]).
    pub leadership: Leadership,
    /// What this process just wrote that the caches may not show yet ([`recent`]).
    pub recent: recent::Recent,
    /// The provisioning intents that are not on their claims ([`journal`]).
    pub journal: Arc<journal::Journal>,
    /// The PVs the binder could give a claim instead of a new volume ([`static_volumes`]).
    pub static_volumes: Arc<static_volumes::StaticVolumes>,
    /// Whether a provisioning storm is on (Normal Events wait for it, [`storm`]).
    pub storm: Arc<storm::Storm>,
    /// The classes' verdicts ([`classes`]).
    pub class_checks: Arc<classes::ClassChecks>,
}

impl Context {
    pub fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    pub fn node(&self, name: &str) -> Option<Arc<PartialObjectMeta<Node>>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    pub fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(&ObjectRef::new(name))
    }

    /// Waits until the claims, volumes, classes and nodes stores all hold their first
    /// full list. Every reconcile starts with it: a claim reconciled while the node
    /// store is still empty would lose its selected node ("node does not exist"), one
    /// whose class store is empty would count a ClassMissing failure — at every start
    /// and every failover. Immediate once synced.
    pub async fn caches_synced(&self) {
        // A watch, not the stores' own `wait_until_ready`: kube-runtime's DelayedInit
        // keeps one waker, so with many reconciles waiting at once only one was woken
        // and the others hung for ever. One task waits on the stores and sets this.
        let mut synced = self.caches_synced.clone();
        let _ = synced.wait_for(|synced| *synced).await;
    }
}

/// What a controller is fed: the watch of its objects, which fills its cache
/// ([`Context::claims`], [`Context::volumes`]) as it goes, and the other triggers that
/// reconcile an object again (a worker of its module's share freed, its class changed).
pub struct Feed<K: kube::Resource<DynamicType = ()>> {
    pub objects: BoxStream<'static, Result<K, watcher::Error>>,
    pub triggers: Vec<BoxStream<'static, ObjectRef<K>>>,
}

/// Runs one controller over `feed` (its objects and the extra triggers) until
/// `shutdown`, then lets its in-flight reconciles finish; `what` names it in logs.
async fn run_controller<K, F, E>(
    what: &'static str,
    ctx: Arc<Context>,
    store: Store<K>,
    feed: Feed<K>,
    shutdown: CancellationToken,
    reconcile: impl FnMut(Arc<K>, Arc<Context>) -> F,
    error_policy: impl Fn(Arc<K>, &E, Arc<Context>) -> kube::runtime::controller::Action,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: futures::TryFuture<Ok = kube::runtime::controller::Action, Error = E> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.threads);
    let mut controller =
        kube::runtime::Controller::for_stream(feed.objects, store).with_config(config);
    for trigger in feed.triggers {
        controller = controller.reconcile_on(trigger);
    }
    controller
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            use kube::runtime::controller::Error as RunError;
            match result {
                Ok(_) => {}
                // A reconcile queued for an object deleted since: expected, nothing to do.
                Err(error @ RunError::ObjectNotFound(_)) => debug!(%error, "{what} controller"),
                // The error policy has logged it (or, a module still loading, chose not
                // to warn).
                Err(error @ RunError::ReconcilerFailed(..)) => {
                    debug!(%error, "{what} controller")
                }
                Err(error) => warn!(%error, "{what} controller"),
            }
        })
        .await;
}

/// One failed attempt, as the error policies hand it to [`retry_failed`].
pub(crate) struct Failure<'a> {
    /// The queue, for `given_up`: claims, volumes, expansions.
    pub queue: &'static str,
    pub key: &'a str,
    /// What the decision reads of the object; the object is held for the delay under it
    /// (`hold`), so an update that changes nothing the decision reads does not bring it
    /// back early.
    pub fingerprint: u64,
    pub hold: bool,
    pub object: k8s_openapi::api::core::v1::ObjectReference,
    /// The reason of the Warning Event that tells it was given up on.
    pub reason: &'static str,
}

/// A failed attempt is retried after the back-off of `retries`; past its failure
/// threshold, once every resync period, and the first time it is told: `given_up`
/// counts it for its queue, and a Warning Event with its reason and
/// `note(failures, resync period)` goes on the object, off the worker's path.
pub(crate) fn retry_failed(
    ctx: &Arc<Context>,
    retries: &Retries,
    failure: Failure<'_>,
    note: impl FnOnce(u32, &str) -> String,
) -> kube::runtime::controller::Action {
    use kube::runtime::controller::Action;
    let (key, print) = (failure.key, failure.fingerprint);
    match retries.failed(key, print) {
        retry::Next::RetryAfter(delay) => {
            if failure.hold {
                retries.hold(key, print, delay);
            }
            Action::requeue(delay)
        }
        retry::Next::GiveUp { failures, first } => {
            let resync = ctx.settings.resync_period;
            if failure.hold {
                retries.hold(key, print, resync);
            }
            if first {
                ctx.metrics
                    .given_up
                    .with_label_values(&[failure.queue])
                    .inc();
                let note = note(failures, &humantime::format_duration(resync).to_string());
                let (ctx, object, reason) = (ctx.clone(), failure.object, failure.reason);
                tokio::spawn(async move { ctx.events.gave_up(object, reason, note).await });
            }
            Action::requeue(resync)
        }
    }
}

/// How often the journal's intents whose claims are gone are cleaned up
/// ([`claims::sweep_journal`]).
const JOURNAL_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How often the retry state of objects that are gone is dropped ([`sweep_retries`]).
const RETRY_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Drops the retry state of claims and volumes no longer in the stores: objects deleted
/// without a final reconcile would otherwise keep their entries for ever (and RSS would grow over a churn of claims).
fn sweep_retries(context: &Context) {
    let claims: std::collections::HashSet<String> = context
        .claims
        .state()
        .iter()
        .map(|c| claims::key(c))
        .collect();
    context.claim_retries.retain(|key| claims.contains(key));
    context.expansion_retries.retain(|key| claims.contains(key));
    expansion::retain_told(|key| claims.contains(key));
    expansion::retain_finished(|key| claims.contains(key));
    let volumes: std::collections::HashSet<String> = context
        .volumes
        .state()
        .iter()
        .map(|v| volumes::key(v))
        .collect();
    context.volume_retries.retain(|key| volumes.contains(key));
    volumes::retain_announced(|key| volumes.contains(key));
    let claims_with_finalizer: std::collections::HashSet<String> = context
        .claims
        .state()
        .iter()
        .filter(|c| {
            ClaimView(c).has_finalizer(wasm_provisioner_rules::names::FINALIZER_CLAIM_PROVISIONING)
        })
        .map(|c| claims::key(c))
        .collect();
    context.recent.retain(
        |name| context.volume(name).is_some(),
        |uid| claims_with_finalizer.contains(uid),
        |uid| volumes.contains(uid),
    );
}

/// The watch of a controller's objects into its cache (`writer`), as kube-runtime's
/// `Controller::new` makes it, but with each object's `managedFields` dropped before it is
/// cached: the host never reads them, and on a claim or PV they are a third of its
/// size; with thousands of claims that is most of the host's memory (docs/design.md, "Memory").
fn cached<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| kube::ResourceExt::managed_fields_mut(object).clear())
        .inspect_ok(observe)
        .reflect(writer)
        .applied_objects()
}

/// Starts a reflector over `events` (a watcher's stream) and returns its store; the
/// stream runs until `stop`. `observe` sees each event once the store holds it. As in
/// [`cached`], each object's `managedFields` are dropped before it is stored: a node's
/// (kubelet's status updates) are most of its metadata.
fn reflect<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    stop: CancellationToken,
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = events
        .default_backoff()
        .modify(|object| kube::ResourceExt::managed_fields_mut(object).clear())
        .reflect(writer)
        .inspect_ok(observe)
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                item = stream.next() => match item {
                    Some(Err(error)) => warn!(%error, "watch error; retrying with back-off"),
                    Some(Ok(_)) => {}
                    None => break,
                },
            }
        }
    });
    reader
}

/// The claims of the class a class event is about (a class created, changed, listed or
/// deleted), to be reconciled again: a fixed parameter, or a class recreated, retries
/// its claims at once, resetting infeasible back-off.
fn claims_of_class(
    claims: &Store<PersistentVolumeClaim>,
    event: &watcher::Event<StorageClass>,
) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    let class = match event {
        watcher::Event::Apply(class)
        | watcher::Event::InitApply(class)
        | watcher::Event::Delete(class) => class,
        watcher::Event::Init | watcher::Event::InitDone => return Vec::new(),
    };
    let name = class.metadata.name.as_deref().unwrap_or_default();
    claims
        .state()
        .iter()
        .filter(|claim| ClaimView(claim).class_name().as_deref() == Some(name))
        .map(|claim| ObjectRef::from_obj(claim.as_ref()))
        .collect()
}

/// The caches of claims, volumes, classes and nodes, each filled by its own watch, and
/// what feeds the two controllers.
struct Watches {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    nodes: Store<PartialObjectMeta<Node>>,
    claim_feed: Feed<PersistentVolumeClaim>,
    volume_feed: Feed<PersistentVolume>,
    expansion_feed: Feed<PersistentVolumeClaim>,
    claim_shares: Arc<WorkerShares<PersistentVolumeClaim>>,
    volume_shares: Arc<WorkerShares<PersistentVolume>>,
    static_volumes: Arc<static_volumes::StaticVolumes>,
    storm: Arc<storm::Storm>,
    /// Claims to reconcile again because their class's module changed ([`classes::run`]).
    verdict_changed: futures::channel::mpsc::UnboundedSender<ObjectRef<PersistentVolumeClaim>>,
}

/// Starts the class and node watches (they run until `stop`) and makes the claim and
/// volume watches, which the controllers run.
fn watch(
    client: &Client,
    settings: &Settings,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Watches {
    let (claims, claims_writer) = reflector::store();
    let (volumes, volumes_writer) = reflector::store();
    // One watch of the classes, for the cache and for retrying a class's claims when it
    // changes: the claims are sent only once the cache holds the change, so their
    // reconcile never sees the class as it was (a second watch could lag the first).
    let (class_changed, class_wakeups) = futures::channel::mpsc::unbounded();
    let classes = {
        let claims = claims.clone();
        reflect(
            watcher(
                Api::<StorageClass>::all(client.clone()),
                watcher::Config::default(),
            ),
            stop.clone(),
            move |event| {
                for claim in claims_of_class(&claims, event) {
                    let _ = class_changed.unbounded_send(claim);
                }
            },
        )
    };
    // Metadata-only requests: the host needs a node's name and labels, not its status.
    let nodes = reflect(
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default(),
        ),
        stop.clone(),
        |_| {},
    );
    // A claim (volume) waiting for its module's share of the workers is reconciled again
    // when a worker of that share frees.
    let (claim_shares, claim_wakeups) =
        WorkerShares::new("claims", settings.threads, metrics.module_waiting.clone());
    let (volume_shares, volume_wakeups) =
        WorkerShares::new("volumes", settings.threads, metrics.module_waiting.clone());
    // The expansion controller is fed from the claim and volume watches, after their
    // caches hold each change: a Bound claim changed, or a PV of ours (its claim).
    let (claim_expands, claim_expansions) = futures::channel::mpsc::unbounded();
    let (volume_expands, volume_expansions) = futures::channel::mpsc::unbounded();
    let (verdict_changed, verdict_wakeups) = futures::channel::mpsc::unbounded();
    let claim_feed = Feed {
        objects: cached(Api::all(client.clone()), claims_writer, |_| {})
            .inspect_ok(move |claim| {
                if let Some(claim) = expansion::claim_trigger(claim) {
                    let _ = claim_expands.unbounded_send(claim);
                }
            })
            .boxed(),
        triggers: vec![
            claim_wakeups.boxed(),
            class_wakeups.boxed(),
            verdict_wakeups.boxed(),
        ],
    };
    let static_volumes = Arc::new(static_volumes::StaticVolumes::default());
    let storm = Arc::new(storm::Storm::new(&settings.provisioner_name));
    let (observed, storm_observed) = (static_volumes.clone(), storm.clone());
    let provisioner_name = settings.provisioner_name.clone();
    let volume_objects = cached(Api::all(client.clone()), volumes_writer, move |event| {
        observed.observe(event);
        storm_observed.observe(event);
    })
    .inspect_ok(move |pv| {
        if let Some(claim) = expansion::volume_trigger(pv, &provisioner_name) {
            let _ = volume_expands.unbounded_send(claim);
        }
    });
    Watches {
        claims,
        volumes,
        classes,
        nodes,
        claim_feed,
        volume_feed: Feed {
            objects: volume_objects.boxed(),
            triggers: vec![volume_wakeups.boxed()],
        },
        // No watch of its own: the claim cache, and the triggers above.
        expansion_feed: Feed {
            objects: futures::stream::pending().boxed(),
            triggers: vec![claim_expansions.boxed(), volume_expansions.boxed()],
        },
        claim_shares,
        volume_shares,
        static_volumes,
        storm,
        verdict_changed,
    }
}

/// Runs the claim, volume and expansion controllers, the class checks and the capacity
/// poll until `stop` is cancelled, then lets in-flight reconciles finish (graceful
/// shutdown) and returns.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    settings: Settings,
    runtime: Arc<Runtime>,
    backends: Arc<Backends>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    leadership: Leadership,
    class_checks: Arc<classes::ClassChecks>,
    stop: CancellationToken,
) {
    let watcher_stop = CancellationToken::new();
    let watches = watch(&client, &settings, &metrics, &watcher_stop);
    let reporter = Reporter {
        controller: settings.provisioner_name.clone(),
        instance: Some(settings.identity.clone()),
    };
    let events = EventSink::new(
        client.clone(),
        reporter,
        watches.storm.clone(),
        settings.event_max_delay,
    );
    // The intents a crashed (or deposed) leader left are read before anything is
    // provisioned; the writer outlives the controllers, so their last clears are written.
    let journal = journal::Journal::new(
        client.clone(),
        &settings.journal_namespace,
        &settings.journal_name,
        leadership.clone(),
    );
    journal.load(&stop).await;
    let journal_stop = CancellationToken::new();
    let journal_writer = tokio::spawn(journal.clone().run_writer(journal_stop.clone()));

    let (caches_synced_tx, caches_synced) = tokio::sync::watch::channel(false);
    class_checks.lead(
        events.clone(),
        watches.classes.clone(),
        caches_synced.clone(),
    );
    let retries = |failure_threshold| {
        Retries::new(RetryPolicy {
            failure_threshold,
            ..settings.retry.clone()
        })
    };
    let context = Arc::new(Context {
        journal,
        caches_synced,
        leadership,
        client,
        claim_retries: retries(settings.failed_provision_threshold),
        volume_retries: retries(settings.failed_delete_threshold),
        expansion_retries: retries(settings.failed_provision_threshold),
        claim_shares: watches.claim_shares,
        volume_shares: watches.volume_shares,
        settings,
        runtime,
        backends,
        claims: watches.claims,
        volumes: watches.volumes,
        classes: watches.classes,
        nodes: watches.nodes,
        events,
        metrics,
        recent: recent::Recent::default(),
        static_volumes: watches.static_volumes,
        storm: watches.storm,
        class_checks,
    });

    let class_loops = async {
        tokio::select! {
            _ = context.caches_synced() => {}
            _ = stop.cancelled() => return,
        }
        futures::future::join(
            classes::run(
                context.class_checks.clone(),
                context.classes.clone(),
                context.claims.clone(),
                watches.verdict_changed,
                stop.clone(),
            ),
            classes::capacity::run(
                context.class_checks.clone(),
                context.classes.clone(),
                context.settings.capacity_poll_interval,
                stop.clone(),
            ),
        )
        .await;
    };
    tokio::join!(
        claims::start(context.clone(), watches.claim_feed, stop.clone()),
        volumes::start(context.clone(), watches.volume_feed, stop.clone()),
        expansion::start(context.clone(), watches.expansion_feed, stop.clone()),
        ready_once_synced(&context, &health, caches_synced_tx, &stop),
        gauge_queues(&context, &stop),
        sweep_journal_every(&context, &stop),
        gone_nodes::run(&context, &stop),
        storage_capacity::run(&context, &stop),
        class_loops,
    );
    context.class_checks.stand_down();
    journal_stop.cancel();
    if let Err(error) = journal_writer.await {
        warn!(%error, "provisioning journal writer failed");
    }
    context.events.flush(Duration::from_secs(5)).await;
    watcher_stop.cancel();
    health
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    info!("controllers stopped");
}

/// Once the claims, volumes, classes and nodes stores all hold their first full list,
/// the reconciles waiting for it go on and the host is ready (`/readyz`).
async fn ready_once_synced(
    context: &Context,
    health: &Health,
    caches_synced: tokio::sync::watch::Sender<bool>,
    stop: &CancellationToken,
) {
    let synced = futures::future::join4(
        context.claims.wait_until_ready(),
        context.volumes.wait_until_ready(),
        context.classes.wait_until_ready(),
        context.nodes.wait_until_ready(),
    );
    let synced = tokio::select! {
        synced = synced => synced,
        _ = stop.cancelled() => return,
    };
    if matches!(synced, (Ok(()), Ok(()), Ok(()), Ok(()))) {
        info!("caches synced; controllers ready");
        let _ = caches_synced.send(true);
        health
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Every second: the queue depth gauges; every [`RETRY_SWEEP_INTERVAL`], the retry
/// state of objects that are gone.
async fn gauge_queues(context: &Context, stop: &CancellationToken) {
    let mut last_sweep = std::time::Instant::now();
    while !stop.is_cancelled() {
        if last_sweep.elapsed() >= RETRY_SWEEP_INTERVAL {
            last_sweep = std::time::Instant::now();
            sweep_retries(context);
        }
        context
            .metrics
            .queue_depth
            .with_label_values(&["claims"])
            .set(context.claim_retries.depth() as i64);
        context
            .metrics
            .queue_depth
            .with_label_values(&["volumes"])
            .set(context.volume_retries.depth() as i64);
        context
            .metrics
            .queue_depth
            .with_label_values(&["expansions"])
            .set(context.expansion_retries.depth() as i64);
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Every [`JOURNAL_SWEEP_INTERVAL`], once the caches synced: the journal's intents whose
/// claims are gone are cleaned up.
async fn sweep_journal_every(context: &Context, stop: &CancellationToken) {
    context.caches_synced().await;
    while !stop.is_cancelled() {
        claims::sweep_journal(context).await;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(JOURNAL_SWEEP_INTERVAL) => {}
        }
    }
}
