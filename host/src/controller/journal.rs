//! The provisioning journal: where the intent to provision a claim is persisted before
//! the module is first asked, so that no backend volume is ever orphaned, without
//! writing to the claim.
//!
//! A claim edit while the claim is Pending makes kube-controller-manager's binder sync
//! it again (a search of every PV for a match), and two edits per volume (a finalizer
//! added, then removed) were what kept a storm at 55-60% of the control plane's ceiling
//! (docs/design.md, "The provisioning journal"). The journal is one ConfigMap in the host's own namespace, named after
//! the provisioner (`<lease name>-journal`), that no controller of the cluster acts on.
//! Its `data` maps a claim's UID to the claim as it was when its provisioning started
//! (metadata and spec), so the claim can be cleaned up even after it is gone from the
//! API.
//!
//! Writes are group commits: one writer task writes every change that arrived while the
//! previous write was on the wire in a single `replace` (a resourceVersion-checked
//! update: only the leader writes; a 409 means somebody else did, and the writer
//! re-reads and applies its changes again). [`Journal::record`] waits until its entry is
//! stored; [`Journal::clear`] does not (an entry left behind by a crash is harmless:
//! [`sweep`](super::claims::sweep_journal) finds the claim's PV, or nothing in the
//! backend, and drops it), so a removal is not written on its own until
//! [`REMOVAL_LINGER`] has passed without a record to ride along with. In a storm of N
//! claims on W workers that is at most N writes, about N/W when the claims arrive
//! together, instead of 2N claim edits.
//!
//! An entry lives for one provision attempt of the fast path: the module answered a
//! volume and its PV was created, or it answered that nothing was made. Every other
//! outcome (in-background, a trap or timeout, a PV that could not be saved, a cleanup
//! that failed) moves the intent onto the claim as the finalizer
//! `wasm-provisioner.dev/provisioning`, as before, so long-lived states are visible on
//! the claim and the journal stays the size of the workers.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::leader::{Leadership, NotLeader};

/// Why an intent could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(
        "cannot write the provisioning journal ConfigMap {namespace}/{name}: {message}; check the host's RBAC on configmaps in its namespace (deploy/rbac.yaml)"
    )]
    Write {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

/// The largest entry the journal takes: a claim with more (annotations up to the API's
/// 256 KiB, from a namespace tenant) has its intent put on the claim as our finalizer
/// instead, so no tenant can grow the journal past the API's 1 MiB object limit and
/// stall every other claim's provisioning. A usual claim takes 0.5-2 KiB; with every
/// worker's entry this size the journal stays well under the limit.
pub const MAX_ENTRY_BYTES: usize = 8 * 1024;

/// How long removals alone wait for a record to be written with. A removal need not be
/// stored soon (a leftover entry is harmless, see the [module docs](self)); waiting lets
/// it ride along with the next record's write, so clears cost no write of their own:
/// claims one after another take one journal write each instead of two, and a storm's
/// journal writes per volume stay at 0.35-0.37 (they were 0.36-0.82 run by run).
pub const REMOVAL_LINGER: Duration = Duration::from_secs(1);

/// How long a record waits for the records of other workers that are about to make one
/// (they are asking the module whether to provision: [`Journal::expect`]). Without it each
/// record was written as soon as it arrived, and when module calls take a network hop
/// (node-local mode: the call goes to the node's instance) workers drift apart and
/// their records stop riding together: 0.55-0.61 journal writes per volume instead of
/// 0.41 (bench/results/nodes-2026-12-07.md). The wait ends early once nobody is about to
/// record.
pub const RECORD_GATHER: Duration = Duration::from_millis(20);

/// The ConfigMap's name for a provisioner's Lease name.
pub fn journal_name(lease_name: &str) -> String {
    format!("{lease_name}-journal")
}

/// A claim as the journal keeps it: what a cleanup needs (identity, annotations,
/// labels, spec), not its status or managedFields.
pub fn stored_claim(claim: &PersistentVolumeClaim) -> String {
    let mut annotations = claim.metadata.annotations.clone().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let stored = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            namespace: claim.metadata.namespace.clone(),
            uid: claim.metadata.uid.clone(),
            creation_timestamp: claim.metadata.creation_timestamp.clone(),
            annotations: (!annotations.is_empty()).then_some(annotations),
            labels: claim.metadata.labels.clone(),
            ..Default::default()
        },
        spec: claim.spec.clone(),
        status: None,
    };
    serde_json::to_string(&stored).expect("a claim serializes")
}

/// Why a write did not store an add.
#[derive(Clone, Debug)]
enum WriteFailure {
    NotLeader,
    Message(String),
}

type Waiter = (String, oneshot::Sender<Result<(), WriteFailure>>);

#[derive(Default)]
struct State {
    /// The entries as the last successful write (or read) left them: UID → claim JSON.
    stored: BTreeMap<String, String>,
    /// The ConfigMap's resourceVersion; `None` when it is not known to exist.
    resource_version: Option<String>,
    /// Entries to add (or replace) with the next write.
    adds: BTreeMap<String, String>,
    /// Entries to remove with the next write.
    removes: BTreeSet<String>,
    /// Who waits for which add to be stored.
    waiters: Vec<Waiter>,
    /// UIDs a worker is working on right now (the sweep leaves them alone).
    held: HashSet<String>,
    /// The adds of the write on the wire.
    writing: BTreeSet<String>,
    /// UIDs whose worker asks the module whether to provision: a record may follow.
    expected: HashSet<String>,
}

impl State {
    fn contains(&self, uid: &str) -> bool {
        self.adds.contains_key(uid)
            || ((self.stored.contains_key(uid) || self.writing.contains(uid))
                && !self.removes.contains(uid))
    }

    fn pending(&self) -> bool {
        !self.adds.is_empty() || !self.removes.is_empty()
    }

    /// Whether a worker waits for the next write (removals alone can wait).
    fn urgent(&self) -> bool {
        !self.adds.is_empty() || !self.waiters.is_empty()
    }

    /// Whether a worker is about to record an entry not recorded yet (see
    /// [`RECORD_GATHER`]).
    fn record_expected(&self) -> bool {
        self.expected.iter().any(|uid| {
            !self.adds.contains_key(uid)
                && !self.stored.contains_key(uid)
                && !self.writing.contains(uid)
        })
    }
}

/// The journal of one provisioner ([module docs](self)).
pub struct Journal {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    leadership: Leadership,
    state: Mutex<State>,
    wake: Notify,
}

/// A worker's hold on an entry: while it lives, the sweep does not touch the entry.
pub struct Hold {
    journal: Arc<Journal>,
    uid: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.journal.state().held.remove(&self.uid);
    }
}

/// A worker's word that it may record an entry soon ([`Journal::expect`]); withdrawn
/// when dropped.
pub struct Expected {
    journal: Arc<Journal>,
    uid: String,
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.journal.state().expected.remove(&self.uid);
    }
}

impl Journal {
    pub fn new(client: Client, namespace: &str, name: &str, leadership: Leadership) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            leadership,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the journal as an earlier process left it; retried until it answers (the
    /// controllers must not start without the intents of a crashed leader) or `stop`.
    pub async fn load(&self, stop: &CancellationToken) {
        let mut delay = Duration::from_millis(500);
        loop {
            match self.api.get_opt(&self.name).await {
                Ok(found) => {
                    let mut state = self.state();
                    state.resource_version = found.as_ref().and_then(|c| c.resource_version());
                    state.stored = found.and_then(|c| c.data).unwrap_or_default();
                    if !state.stored.is_empty() {
                        info!(journal = %self.name, entries = state.stored.len(), "provisioning journal holds unfinished provisions of an earlier process; they are finished or cleaned up");
                    }
                    return;
                }
                Err(error) => {
                    warn!(%error, namespace = %self.namespace, journal = %self.name, "cannot read the provisioning journal ConfigMap; check the host's RBAC on configmaps in its namespace; retrying")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    /// Whether the journal holds (or is about to hold) an intent for the claim `uid`.
    pub fn contains(&self, uid: &str) -> bool {
        self.state().contains(uid)
    }

    /// Holds the entry of `uid` for a worker, unless somebody else holds it.
    pub fn hold(self: &Arc<Self>, uid: &str) -> Option<Hold> {
        self.state().held.insert(uid.to_string()).then(|| Hold {
            journal: self.clone(),
            uid: uid.to_string(),
        })
    }

    /// Says that the claim `uid` may be recorded soon (its worker asks the module whether
    /// to provision it), so a record arriving meanwhile waits up to [`RECORD_GATHER`] to
    /// be written together with it.
    pub fn expect(self: &Arc<Self>, uid: &str) -> Expected {
        self.state().expected.insert(uid.to_string());
        Expected {
            journal: self.clone(),
            uid: uid.to_string(),
        }
    }

    /// Persists the intent to provision `claim`; returns once the journal in the API
    /// holds it (at once when it already does), or `Ok(false)` without a write when the
    /// claim is too large for it ([`MAX_ENTRY_BYTES`]).
    pub async fn record(&self, claim: &PersistentVolumeClaim) -> Result<bool, JournalError> {
        let uid = claim.uid().unwrap_or_default();
        let done = {
            let mut state = self.state();
            if state.stored.contains_key(&uid) && !state.removes.contains(&uid) {
                return Ok(true);
            }
            if !state.adds.contains_key(&uid) {
                let entry = stored_claim(claim);
                if entry.len() > MAX_ENTRY_BYTES {
                    return Ok(false);
                }
                state.adds.insert(uid.clone(), entry);
            }
            state.removes.remove(&uid);
            let (sender, receiver) = oneshot::channel();
            state.waiters.push((uid, sender));
            receiver
        };
        self.wake.notify_one();
        match done.await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(WriteFailure::NotLeader)) => Err(NotLeader {
                step: "provisioning journal write",
            }
            .into()),
            Ok(Err(WriteFailure::Message(message))) => Err(self.write_error(message)),
            Err(_) => Err(self.write_error("the journal writer stopped".into())),
        }
    }

    /// Drops the intent for the claim `uid` with the next write (not waited for).
    pub fn clear(&self, uid: &str) {
        {
            let mut state = self.state();
            if !state.contains(uid) {
                return;
            }
            state.adds.remove(uid);
            if state.stored.contains_key(uid) || state.writing.contains(uid) {
                state.removes.insert(uid.to_string());
            }
        }
        self.wake.notify_one();
    }

    /// The stored intents no worker holds: (UID, the claim as it was).
    pub fn unheld_entries(&self) -> Vec<(String, PersistentVolumeClaim)> {
        let state = self.state();
        state
            .stored
            .iter()
            .filter(|(uid, _)| !state.removes.contains(*uid) && !state.held.contains(*uid))
            .filter_map(|(uid, json)| match serde_json::from_str(json) {
                Ok(claim) => Some((uid.clone(), claim)),
                Err(error) => {
                    warn!(%error, uid = %uid, "provisioning journal entry is not a claim; ignoring it");
                    None
                }
            })
            .collect()
    }

    fn write_error(&self, message: String) -> JournalError {
        JournalError::Write {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            message,
        }
    }

    /// Writes the pending changes, group-committed, until `stop`; then one last write of
    /// what is pending. Records are written at once, or after up to [`RECORD_GATHER`]
    /// while other workers are about to record; removals alone wait up to
    /// [`REMOVAL_LINGER`] for a record to ride along with.
    pub async fn run_writer(self: Arc<Self>, stop: CancellationToken) {
        let mut removals_due: Option<Instant> = None;
        let mut records_due: Option<Instant> = None;
        loop {
            let notified = self.wake.notified();
            let (pending, urgent, record_expected) = {
                let state = self.state();
                (state.pending(), state.urgent(), state.record_expected())
            };
            if !pending {
                removals_due = None;
                records_due = None;
                tokio::select! {
                    _ = notified => continue,
                    _ = stop.cancelled() => return,
                }
            }
            if !urgent && !stop.is_cancelled() {
                let due = *removals_due.get_or_insert_with(|| Instant::now() + REMOVAL_LINGER);
                tokio::select! {
                    _ = notified => continue,
                    _ = tokio::time::sleep_until(due) => {}
                    _ = stop.cancelled() => {}
                }
            } else if urgent && record_expected && !stop.is_cancelled() {
                let due = *records_due.get_or_insert_with(|| Instant::now() + RECORD_GATHER);
                if Instant::now() < due {
                    tokio::select! {
                        _ = notified => continue,
                        _ = tokio::time::sleep_until(due) => {}
                        _ = stop.cancelled() => {}
                    }
                }
            }
            if stop.is_cancelled() {
                let _ = self.write_once().await;
                return;
            }
            removals_due = None;
            records_due = None;
            if let Err(delay) = self.write_once().await {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }

    /// One write of everything pending; `Err(delay)` when it should be tried again
    /// after `delay`.
    async fn write_once(&self) -> Result<(), Duration> {
        let (adds, removes, waiters, data, resource_version) = {
            let mut state = self.state();
            let adds = std::mem::take(&mut state.adds);
            let removes = std::mem::take(&mut state.removes);
            let waiters = std::mem::take(&mut state.waiters);
            let mut data = state.stored.clone();
            for uid in &removes {
                data.remove(uid);
            }
            data.extend(adds.iter().map(|(k, v)| (k.clone(), v.clone())));
            state.writing = adds.keys().cloned().collect();
            (adds, removes, waiters, data, state.resource_version.clone())
        };
        tracing::debug!(journal = %self.name, adds = adds.len(), removes = removes.len(), "provisioning journal write");
        let answer = self.write(data.clone(), resource_version).await;
        let mut state = self.state();
        state.writing.clear();
        match answer {
            Ok(resource_version) => {
                state.stored = data;
                state.resource_version = resource_version;
                drop(state);
                for (_, waiter) in waiters {
                    let _ = waiter.send(Ok(()));
                }
                Ok(())
            }
            Err(Failure::Stale(fresh)) => {
                // Somebody else wrote it (or it was deleted): apply the changes again to
                // what is there now, later changes of the same entry first.
                state.resource_version = fresh.as_ref().and_then(|c| c.resource_version());
                state.stored = fresh.and_then(|c| c.data).unwrap_or_default();
                requeue(&mut state, adds, removes, waiters);
                Err(Duration::ZERO)
            }
            Err(Failure::NotLeader) => {
                fail(state, removes, waiters, WriteFailure::NotLeader);
                Err(Duration::from_secs(1))
            }
            Err(Failure::Other(message)) => {
                warn!(journal = %self.name, namespace = %self.namespace, error = %message, "cannot write the provisioning journal; the claims waiting for it are retried");
                fail(state, removes, waiters, WriteFailure::Message(message));
                Err(Duration::from_secs(1))
            }
        }
    }

    /// Creates or replaces the ConfigMap with `data`; its new resourceVersion.
    async fn write(
        &self,
        data: BTreeMap<String, String>,
        resource_version: Option<String>,
    ) -> Result<Option<String>, Failure> {
        self.leadership
            .check("provisioning journal write")
            .map_err(|_| Failure::NotLeader)?;
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: resource_version.clone(),
                annotations: Some(BTreeMap::from([(
                    "wasm-provisioner.dev/journal".to_string(),
                    "claim UID -> the claim as its provisioning started; written by the leading host only, do not edit".to_string(),
                )])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        let post = PostParams::default();
        let written = match resource_version {
            None => self.api.create(&post, &object).await,
            Some(_) => self.api.replace(&self.name, &post, &object).await,
        };
        match written {
            Ok(written) => Ok(written.resource_version()),
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                match self.api.get_opt(&self.name).await {
                    Ok(fresh) => Err(Failure::Stale(fresh.map(Box::new))),
                    Err(error) => Err(Failure::Other(error.to_string())),
                }
            }
            Err(error) => Err(Failure::Other(error.to_string())),
        }
    }
}

enum Failure {
    /// Not written: the ConfigMap is not as we last saw it (here it is now).
    Stale(Option<Box<ConfigMap>>),
    /// Not written: this process no longer leads.
    NotLeader,
    Other(String),
}

/// A write that failed: its adds' claims are retried with back-off by their reconciles
/// (their waiters are told), its removes are written with the next write.
fn fail(
    mut state: std::sync::MutexGuard<'_, State>,
    removes: BTreeSet<String>,
    waiters: Vec<Waiter>,
    failure: WriteFailure,
) {
    for uid in removes {
        if !state.adds.contains_key(&uid) {
            state.removes.insert(uid);
        }
    }
    drop(state);
    for (_, waiter) in waiters {
        let _ = waiter.send(Err(failure.clone()));
    }
}

/// Puts taken changes back in front of the ones made since they were taken.
fn requeue(
    state: &mut State,
    adds: BTreeMap<String, String>,
    removes: BTreeSet<String>,
    waiters: Vec<Waiter>,
) {
    for (uid, json) in adds {
        if !state.removes.contains(&uid) {
            state.adds.entry(uid).or_insert(json);
        }
    }
    for uid in removes {
        if !state.adds.contains_key(&uid) {
            state.removes.insert(uid);
        }
    }
    let mut waiters = waiters;
    waiters.append(&mut state.waiters);
    state.waiters = waiters;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_claim_keeps_what_a_cleanup_needs_and_nothing_else() {
        let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "data", "namespace": "ns", "uid": "u-1",
                "resourceVersion": "7",
                "annotations": {
                    "volume.kubernetes.io/selected-node": "n1",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"
                },
                "managedFields": [{"manager": "kubectl"}],
                "finalizers": ["kubernetes.io/pvc-protection"]
            },
            "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let stored: PersistentVolumeClaim = serde_json::from_str(&stored_claim(&claim)).unwrap();
        assert_eq!(stored.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(stored.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(
            stored.annotations().keys().collect::<Vec<_>>(),
            ["volume.kubernetes.io/selected-node"]
        );
        assert!(stored.metadata.managed_fields.is_none());
        assert!(stored.metadata.finalizers.is_none());
        assert!(stored.status.is_none());
        assert_eq!(stored.spec, claim.spec);
    }

    #[test]
    fn requeued_changes_yield_to_later_ones() {
        let mut state = State::default();
        // Since the failed write took them: "a" was cleared again, "b" recorded anew.
        state.removes.insert("a".into());
        state.adds.insert("b".into(), "new".into());
        requeue(
            &mut state,
            BTreeMap::from([("a".into(), "old".into()), ("b".into(), "old".into())]),
            BTreeSet::from(["b".into(), "c".into()]),
            Vec::new(),
        );
        assert!(!state.adds.contains_key("a"));
        assert_eq!(state.adds["b"], "new");
        assert!(!state.removes.contains("b"));
        assert!(state.removes.contains("c"));
    }

    #[test]
    fn an_entry_is_contained_until_its_removal_is_written() {
        let mut state = State::default();
        state.stored.insert("a".into(), "{}".into());
        assert!(state.contains("a"));
        state.removes.insert("a".into());
        assert!(!state.contains("a"));
        state.adds.insert("b".into(), "{}".into());
        assert!(state.contains("b"));
    }
}
