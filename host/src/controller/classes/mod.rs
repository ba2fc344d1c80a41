//! StorageClasses and their modules' optional capabilities (contract 0.2): the verdicts
//! of `validate-class` ([`verdicts`]), asked when a class of ours appears or changes and
//! when its module's version changes, told on the class (a Warning Event, the
//! `wasm_provisioner_class_valid` gauge) and read by the claim decision, which fails a
//! rejected class's claims at once; the gate a new module version must pass before it
//! replaces the one in service ([`gate`]); and the capacity poll ([`capacity`]).
//!
//! A module without the capability (every 0.1 module) is never asked: its classes are
//! as they were.

pub mod capacity;
mod gate;
pub mod verdicts;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::EventSink;
use crate::metrics::Metrics;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::request::class_of;
use wasm_provisioner_rules::types::Capability;
use wasm_provisioner_runtime::{Call, LoadedModule, Runtime, class_pin};

pub use gate::ClassGate;
pub use verdicts::{Verdict, VerdictKey, Verdicts};

/// How often the classes of ours are looked over: new or changed classes, and modules
/// whose version changed, get their verdict.
pub const CLASS_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The verdicts of the classes of this provisioner, and how they are told. Shared by
/// the claim controller, the class loop and the version gate; made once per process.
pub struct ClassChecks {
    provisioner_name: String,
    runtime: Runtime,
    metrics: Arc<Metrics>,
    client: Client,
    verdicts: Verdicts,
    /// While this process leads: its Event sink and its class cache. A standby writes
    /// no Events, and the gate lists the classes from the API.
    leading: Mutex<Option<Leading>>,
    /// The `class_valid` series set, so those of classes gone can be removed.
    published: Mutex<HashSet<(String, String)>>,
}

/// The leader's Event sink, its class cache, and whether its caches hold their first
/// list yet.
type Leading = (
    EventSink,
    Store<StorageClass>,
    tokio::sync::watch::Receiver<bool>,
);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ClassChecks {
    pub fn new(
        provisioner_name: String,
        runtime: Runtime,
        metrics: Arc<Metrics>,
        client: Client,
    ) -> Arc<Self> {
        Arc::new(ClassChecks {
            provisioner_name,
            runtime,
            metrics,
            client,
            verdicts: Verdicts::default(),
            leading: Mutex::default(),
            published: Mutex::default(),
        })
    }

    /// From now on (this process leads) verdicts are told with Events through `events`,
    /// and the gate reads the classes from `classes` once `synced`.
    pub(super) fn lead(
        &self,
        events: EventSink,
        classes: Store<StorageClass>,
        synced: tokio::sync::watch::Receiver<bool>,
    ) {
        *lock(&self.leading) = Some((events, classes, synced));
    }

    /// The controllers stopped: no more Events.
    pub(super) fn stand_down(&self) {
        *lock(&self.leading) = None;
    }

    fn events(&self) -> Option<EventSink> {
        lock(&self.leading)
            .as_ref()
            .map(|(events, _, _)| events.clone())
    }

    pub fn is_ours(&self, class: &StorageClass) -> bool {
        class.provisioner == self.provisioner_name
    }

    /// The module a class of ours names, as its parameter says.
    pub fn module_name(class: &StorageClass) -> Option<&str> {
        class
            .parameters
            .as_ref()?
            .get(names::PARAM_MODULE)
            .map(String::as_str)
    }

    /// The module version serving `class` (its pin honoured) when it has `capability`.
    pub fn module_with(
        &self,
        class: &StorageClass,
        capability: Capability,
    ) -> Option<Arc<LoadedModule>> {
        self.module_of(class)
            .filter(|module| module.has(capability))
    }

    /// The module in service for a class of ours.
    pub fn module_of(&self, class: &StorageClass) -> Option<Arc<LoadedModule>> {
        if !self.is_ours(class) {
            return None;
        }
        let name = Self::module_name(class)?;
        let pin = class_pin(name, class.parameters.as_ref()).ok()?;
        self.runtime.resolve(name, pin).ok()
    }

    pub fn key(class: &StorageClass, module: &LoadedModule) -> VerdictKey {
        VerdictKey {
            class: class.name_any(),
            class_version: class.resource_version().unwrap_or_default(),
            module: module.name().to_string(),
            module_sha256: module.sha256().to_string(),
        }
    }

    /// `module`'s verdict on `class`, asked once per class version and module version;
    /// the lookup that asks tells the class. `None`: the call could not start (the
    /// module busy, the pool full): ask again soon.
    pub async fn verdict(&self, class: &StorageClass, module: &LoadedModule) -> Option<Verdict> {
        let key = Self::key(class, module);
        let lookup = self
            .verdicts
            .get_or_ask(&key, || ask(&self.metrics, module, class))
            .await?;
        self.metrics
            .class_valid
            .with_label_values(&[key.class.as_str(), key.module.as_str()])
            .set(i64::from(lookup.verdict.is_valid()));
        lock(&self.published).insert((key.class.clone(), key.module.clone()));
        if lookup.asked_now {
            self.tell(class, module, &lookup.verdict).await;
        }
        Some(lookup.verdict)
    }

    /// A verdict just asked: logged, and a Warning Event on a class rejected.
    async fn tell(&self, class: &StorageClass, module: &LoadedModule, verdict: &Verdict) {
        let (name, module_name, version) = (class.name_any(), module.name(), module.version());
        let (reason, note) = match verdict {
            Verdict::Valid => {
                info!(
                    class = name,
                    module = module_name,
                    version,
                    "the module accepts the class"
                );
                return;
            }
            Verdict::Rejected(message) => {
                (names::REASON_CLASS_REJECTED, rejected_note(module, message))
            }
            Verdict::Failed(error) => (
                names::REASON_CLASS_VALIDATION_FAILED,
                failed_note(module, error),
            ),
        };
        warn!(class = name, module = module_name, version, "{note}");
        if let Some(events) = self.events() {
            events.class_warning(class, reason, "Validate", note).await;
        }
    }

    /// Warns on `class` that a new version of its module was held back.
    async fn tell_held_back(&self, class: &StorageClass, note: String) {
        if let Some(events) = self.events() {
            events
                .class_warning(
                    class,
                    names::REASON_MODULE_VERSION_HELD_BACK,
                    "Reload",
                    note,
                )
                .await;
        }
    }

    /// The classes of ours naming module `name`: the leader's cache once it holds its
    /// first list, else (a standby, or a leader just started) read from the API.
    async fn classes_of(&self, name: &str) -> Result<Vec<StorageClass>, kube::Error> {
        let store = lock(&self.leading)
            .as_ref()
            .map(|(_, classes, synced)| (classes.clone(), synced.clone()));
        let cached = store.and_then(|(store, synced)| (*synced.borrow()).then(|| store.state()));
        let classes: Vec<StorageClass> = match cached {
            Some(classes) => classes.iter().map(|c| c.as_ref().clone()).collect(),
            None => {
                Api::<StorageClass>::all(self.client.clone())
                    .list(&Default::default())
                    .await?
                    .items
            }
        };
        Ok(classes
            .into_iter()
            .filter(|class| self.is_ours(class) && Self::module_name(class) == Some(name))
            .collect())
    }
}

/// What a claim of a rejected class is told, and the class's Event.
pub fn rejected_note(module: &LoadedModule, message: &str) -> String {
    format!(
        "module {} (sha256:{}) rejects the class: {message}",
        module.name(),
        module.version()
    )
}

/// What a claim of a class whose validation failed is told, and the class's Event.
pub fn failed_note(module: &LoadedModule, error: &str) -> String {
    format!(
        "module {} (sha256:{}) could not validate the class, so its claims are not provisioned: {error}",
        module.name(),
        module.version()
    )
}

/// Asks `module`'s `validate-class` about `class`; the call is timed and counted
/// (`wasm_provisioner_guest_call_*{call="validate-class"}`, outcome `rejected` for a
/// rejection).
async fn ask(metrics: &Metrics, module: &LoadedModule, class: &StorageClass) -> Option<Verdict> {
    let class = match class_of(class) {
        Ok(class) => class,
        // Not one the host can put to a plugin at all (an unknown reclaim policy).
        Err(error) => return Some(Verdict::Rejected(error.to_string())),
    };
    let started = std::time::Instant::now();
    let answer = module.validate_class(&class).await;
    let outcome = match &answer {
        Ok(Ok(())) => "ok",
        Ok(Err(_)) => "rejected",
        Err(error) => error.metric_label(),
    };
    super::calls::observe(metrics, module, Call::ValidateClass, started, outcome);
    match answer {
        Ok(Ok(())) => Some(Verdict::Valid),
        Ok(Err(message)) => Some(Verdict::Rejected(message)),
        Err(error) if error.is_busy() || error.is_pool_full() => None,
        Err(error) => Some(Verdict::Failed(error.to_string())),
    }
}

/// What the class loop saw of a class last time.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    version: String,
    module: Option<String>,
    /// The sha256 of the version of its module in service.
    serving: Option<String>,
}

/// Every [`CLASS_CHECK_INTERVAL`] while this process leads: each class of ours whose
/// module validates gets its verdict (asked only for a new class version or module
/// version); the claims of a class whose module version changed are reconciled again
/// (`wake`), since a rejection under the old version may not stand; a class changed or
/// gone lets a module version held back for it be tried again; the verdicts and gauges
/// of classes gone go.
pub(super) async fn run(
    checks: Arc<ClassChecks>,
    classes: Store<StorageClass>,
    claims: Store<PersistentVolumeClaim>,
    wake: UnboundedSender<ObjectRef<PersistentVolumeClaim>>,
    stop: CancellationToken,
) {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    while !stop.is_cancelled() {
        let ours: Vec<Arc<StorageClass>> = classes
            .state()
            .into_iter()
            .filter(|class| checks.is_ours(class))
            .collect();
        let mut now: HashMap<String, Seen> = HashMap::new();
        let mut checks_due = Vec::new();
        for class in &ours {
            let module = checks.module_with(class, Capability::ValidateClass);
            let serving = ClassChecks::module_name(class)
                .and_then(|name| checks.runtime.module(name))
                .map(|m| m.sha256().to_string());
            now.insert(
                class.name_any(),
                Seen {
                    version: class.resource_version().unwrap_or_default(),
                    module: ClassChecks::module_name(class).map(str::to_string),
                    serving,
                },
            );
            if let Some(module) = module {
                let checks = checks.clone();
                let class = class.clone();
                checks_due.push(async move {
                    let key = ClassChecks::key(&class, &module);
                    checks.verdict(&class, &module).await;
                    key
                });
            }
        }
        let live: HashSet<VerdictKey> = tokio::select! {
            keys = futures::future::join_all(checks_due) => keys.into_iter().collect(),
            _ = stop.cancelled() => break,
        };
        for (name, before) in &seen {
            let after = now.get(name);
            if after.is_some_and(|after| after.serving != before.serving) {
                // Its module changed: its claims are looked at again at once.
                for claim in claims
                    .state()
                    .iter()
                    .filter(|claim| ClaimView(claim).class_name().as_deref() == Some(name.as_str()))
                {
                    let _ = wake.unbounded_send(ObjectRef::from_obj(claim.as_ref()));
                }
            }
            if after.is_none_or(|after| after.version != before.version)
                && let Some(module) = &before.module
            {
                checks.runtime.retry_refused(module);
            }
        }
        seen = now;
        checks.verdicts.retain(|key| {
            live.contains(key)
                || seen.get(&key.class).is_some_and(|s| {
                    s.version == key.class_version
                        && s.serving.as_deref() == Some(&key.module_sha256)
                })
        });
        let current: HashSet<(String, String)> = live
            .iter()
            .map(|key| (key.class.clone(), key.module.clone()))
            .collect();
        lock(&checks.published).retain(|labels| {
            let keep = current.contains(labels);
            if !keep {
                let _ = checks
                    .metrics
                    .class_valid
                    .remove_label_values(&[labels.0.as_str(), labels.1.as_str()]);
            }
            keep
        });
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(CLASS_CHECK_INTERVAL) => {}
        }
    }
}
