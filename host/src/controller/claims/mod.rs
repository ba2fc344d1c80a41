//! The claim controller: turns each claim of our classes into a PV through its class's
//! plugin.
//!
//! No backend volume is ever orphaned. Before the plugin is first asked to provision,
//! the intent is persisted in the API, not in memory: in the provisioning journal
//! ([`super::journal`], no claim write), and, once an attempt ends with something
//! possibly left in the backend that no PV owns (in-background, a trap, a PV that
//! could not be saved), on the claim as our finalizer
//! (`wasm-provisioner.dev/provisioning`). The intent goes only once the claim's PV
//! exists (the PV then owns the backend volume) or once nothing is left in the
//! backend. A process killed between the plugin's answer and the PV create finds the
//! intent again on restart: if the claim still exists the plugin (idempotent by PV
//! name) answers the same volume and the PV is created; if the claim was deleted
//! meanwhile, [`cleanup`] (from [`sweep_journal`] for a claim gone from the API) asks
//! the plugin for the volume once more and deletes it.
//!
//! When the PV cannot be saved after `pv_save_retries` tries, the backend volume is
//! deleted (the Go library's choice, docs/design.md), with ProvisioningCleanupFailed when that fails too; the
//! finalizer stays until the delete succeeds, so the claim cannot leave a volume behind.
//!
//! - [`reconcile`]: the decisions before the plugin is called (ours? bound? given up?
//!   the module's share of the workers, the selected node);
//! - [`provision`]: the finalizer, the guest call, publishing the PV (or discarding the
//!   backend volume when it cannot be published);
//! - [`cleanup`]: a claim deleted while its provisioning was unfinished.

mod cleanup;
mod provision;
mod reconcile;

use cleanup::cleanup;
pub use cleanup::sweep_journal;
use provision::provision;
pub use reconcile::reconcile;
use reconcile::resolve_module;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::Context;
use super::faults::Step;
use super::finalizers::{self, Edited};
use super::journal::JournalError;
use super::pool_full;
use super::retry::Next;
use super::shares;
use crate::leader::NotLeader;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide::{self, ProvisionDecision, SkipProvision};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{
    DeleteError, DeleteRequest, PluginInfo, ProvisionError, ProvisionRequest, Volume,
};
use wasm_provisioner_rules::{request, volume};
use wasm_provisioner_runtime::{Call, CallError, LoadedModule};

/// Why one reconcile of a claim did not finish; the error policy turns it into a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("claim {claim}: Kubernetes API: {source}")]
    Api {
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("claim {claim}: {message}")]
    Skipped { claim: String, message: String },
    #[error("claim {claim}: {message}")]
    Module { claim: String, message: String },
    /// The class's module is still loading (compiling): not a failed attempt, no Event;
    /// the claim waits for it.
    #[error("claim {claim}: {message}")]
    ModuleLoading { claim: String, message: String },
    #[error(transparent)]
    Request(#[from] request::Error),
    #[error(transparent)]
    Volume(#[from] volume::Error),
    #[error("claim {claim}: {source}")]
    Call {
        claim: String,
        #[source]
        source: CallError,
    },
    #[error("claim {claim}: plugin {module} answered {outcome}: {message}")]
    Outcome {
        claim: String,
        module: String,
        outcome: &'static str,
        message: String,
    },
    #[error("claim {claim}: plugin {module} answered infeasible: {message}")]
    Infeasible {
        claim: String,
        module: String,
        message: String,
        class_version: String,
    },
    #[error("claim {claim}: {message}")]
    Save { claim: String, message: String },
    /// The claim is being deleted with provisioning in flight; retried until the
    /// backend is clean, never given up on.
    #[error("claim {claim} is being deleted; cleaning up its backend volume: {message}")]
    Cleanup { claim: String, message: String },
    /// The provisioning journal could not store the intent: nothing was provisioned.
    #[error("claim {claim}: {message}")]
    Journal { claim: String, message: String },
    /// The leadership fence closed: nothing more is done; the next leader takes over.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

impl Error {
    fn journal(claim: &PersistentVolumeClaim, error: JournalError) -> Self {
        match error {
            JournalError::NotLeader(fenced) => Error::NotLeader(fenced),
            error @ JournalError::Write { .. } => Error::Journal {
                claim: ClaimView(claim).key(),
                message: error.to_string(),
            },
        }
    }

    fn api(claim: &PersistentVolumeClaim, source: kube::Error) -> Self {
        Error::Api {
            claim: ClaimView(claim).key(),
            source,
        }
    }
}

/// The queue key: the claim's UID, so a claim recreated under the same name starts over.
pub(super) fn key(claim: &PersistentVolumeClaim) -> String {
    claim
        .metadata
        .uid
        .clone()
        .unwrap_or_else(|| ClaimView(claim).key())
}

/// What the user can change about a claim: a given-up claim is retried once it changes.
fn fingerprint(claim: &PersistentVolumeClaim) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(&claim.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    claim.metadata.labels.hash(&mut hasher);
    claim.metadata.annotations.hash(&mut hasher);
    hasher.finish()
}

/// When a reconcile stopped by the leadership fence is tried again (by then the process
/// has usually exited).
pub(super) const NOT_LEADER_REQUEUE: std::time::Duration = std::time::Duration::from_secs(2);

fn resync(ctx: &Context) -> Action {
    Action::requeue(ctx.settings.resync_period)
}

/// A call refused because the module already runs its `maxConcurrentCalls` (claims and
/// volumes together can exceed the claim share): not a failed attempt, no Event; the
/// claim is retried shortly, like a claim waiting for its share.
fn busy(claim: &PersistentVolumeClaim, source: &CallError) -> Action {
    info!(claim = %ClaimView(claim).key(), "{source}; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

/// The PV name of a claim: `pvc-<uid>`.
fn volume_name_for(claim: &PersistentVolumeClaim) -> String {
    ClaimView(claim).volume_name().unwrap_or_default()
}

/// Runs one guest call, recording its duration and outcome.
pub(super) async fn call<T>(
    ctx: &Context,
    module: &LoadedModule,
    call: Call,
    future: impl std::future::Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    let started = Instant::now();
    let result = future.await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(error) => error.metric_label(),
    };
    observe_call(ctx, module, call, started, outcome);
    result
}

pub(super) fn observe_call(
    ctx: &Context,
    module: &LoadedModule,
    call: Call,
    started: Instant,
    outcome: &str,
) {
    let labels = [module.name(), call.as_str(), outcome];
    ctx.metrics
        .guest_call_duration
        .with_label_values(&labels)
        .observe(started.elapsed().as_secs_f64());
    if outcome != "ok" {
        ctx.metrics
            .guest_call_failures
            .with_label_values(&labels)
            .inc();
    }
}

fn provision_error_label(error: &ProvisionError) -> &'static str {
    match error {
        ProvisionError::Ignored(_) => "ignored",
        ProvisionError::Failed(_) => "failed",
        ProvisionError::InBackground(_) => "in_background",
        ProvisionError::Reschedule(_) => "reschedule",
        ProvisionError::Infeasible(_) => "infeasible",
    }
}

/// The metric outcome of a `provision` call: "ok", the plugin's error variant, or the
/// sandbox failure.
fn provision_outcome(answer: &Result<Result<Volume, ProvisionError>, CallError>) -> &'static str {
    match answer {
        Ok(Ok(_)) => "ok",
        Ok(Err(error)) => provision_error_label(error),
        Err(error) => error.metric_label(),
    }
}

/// The metric outcome of a `delete` call.
pub(super) fn delete_outcome(answer: &Result<Result<(), DeleteError>, CallError>) -> &'static str {
    match answer {
        Ok(Ok(())) => "ok",
        Ok(Err(DeleteError::Ignored(_))) => "ignored",
        Ok(Err(DeleteError::Failed(_))) => "failed",
        Ok(Err(DeleteError::InBackground(_))) => "in_background",
        Err(error) => error.metric_label(),
    }
}

fn metric_labels(claim: &PersistentVolumeClaim, class: &StorageClass) -> [String; 2] {
    [
        class.name_any(),
        ClaimView(claim)
            .data_source_kind()
            .unwrap_or_default()
            .to_string(),
    ]
}

fn provision_failed_metric(ctx: &Context, claim: &PersistentVolumeClaim, class: &StorageClass) {
    let labels = metric_labels(claim, class);
    ctx.metrics
        .provision_failed_total
        .with_label_values(&[labels[0].as_str(), labels[1].as_str()])
        .inc();
}

/// One failed provision attempt: counted, and told on the claim as ProvisioningFailed.
async fn attempt_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    note: String,
) {
    provision_failed_metric(ctx, claim, class);
    ctx.events
        .claim_warning(claim, names::REASON_PROVISIONING_FAILED, note)
        .await;
}

/// Decrements the in-flight gauge when dropped (also when the operation is cancelled).
pub(super) struct InFlight<'a>(&'a prometheus::IntGauge);

impl<'a> InFlight<'a> {
    pub(super) fn start(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub fn error_policy(claim: Arc<PersistentVolumeClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = key(&claim);
    if let Error::ModuleLoading { .. } = error {
        debug!(%error, "retrying in {:?}", shares::LOADING_RECHECK);
        return Action::requeue(shares::LOADING_RECHECK);
    }
    warn!(%error, "provisioning did not finish; will retry");
    let print = fingerprint(&claim);
    match error {
        Error::Infeasible { class_version, .. } => {
            let delay = ctx.claim_retries.infeasible(&key, class_version);
            ctx.claim_retries.hold(&key, print, delay);
            Action::requeue(delay)
        }
        Error::Cleanup { .. } => Action::requeue(ctx.claim_retries.failed_forever(&key)),
        // Not a failure of the claim: this process is stopping.
        Error::NotLeader(_) => Action::requeue(NOT_LEADER_REQUEUE),
        _ => match ctx.claim_retries.failed(&key, print) {
            Next::RetryAfter(delay) => {
                ctx.claim_retries.hold(&key, print, delay);
                Action::requeue(delay)
            }
            Next::GiveUp { failures, first } => {
                let resync = ctx.settings.resync_period;
                ctx.claim_retries.hold(&key, print, resync);
                let note = format!(
                    "gave up after {failures} failed attempts (--failed-provision-threshold); last error: {error}. Retried once every {} (--resync-period), or at once when the claim is edited",
                    humantime::format_duration(resync)
                );
                super::give_up(
                    ctx,
                    "claims",
                    kube::Resource::object_ref(claim.as_ref(), &()),
                    first,
                    names::REASON_PROVISIONING_FAILED,
                    note,
                )
            }
        },
    }
}

/// Adds or removes our finalizer; returns the claim as it now is, `None` when it is
/// gone (or replaced under its name, or, when adding, being deleted).
async fn set_claim_finalizer(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    add: bool,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    // Removing it lets the claim go with whatever the backend holds: only a leader may.
    if !add {
        ctx.leadership.check("claim finalizer removal")?;
        // Removed already, by this process: the cache has not caught up.
        if ctx.recent.was_released(&key(claim)) {
            return Ok(Some(claim.clone()));
        }
    }
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    // A claim provisioned before the binder announced it (`--provision-before-binder`)
    // gets the announcement with the finalizer: the claim then says whose it is, so
    // deleting it finds its way back here whatever becomes of its class.
    let announce = ClaimView(claim).provisioner().is_none().then_some((
        names::ANN_STORAGE_PROVISIONER,
        ctx.settings.provisioner_name.as_str(),
    ));
    match finalizers::set(
        &api,
        claim,
        names::FINALIZER_CLAIM_PROVISIONING,
        add,
        announce,
    )
    .await
    .map_err(|e| Error::api(claim, e))?
    {
        Edited::Done(claim) => {
            ctx.recent.set_released(&key(&claim), !add);
            if !add {
                let key = ClaimView(&claim).key();
                ctx.settings.faults.after(Step::FinalizerRemove, &key);
            }
            Ok(Some(claim))
        }
        Edited::Gone => Ok(None),
    }
}

/// Adds our finalizer; returns the claim as it now is, or `None` when it is gone or
/// being deleted (then nothing may be provisioned for it).
async fn add_claim_finalizer(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    set_claim_finalizer(ctx, claim, true).await
}

/// Removes our finalizer. `claim` must be as fresh as the last write of ours to it (a
/// stale copy without the finalizer would make this a no-op).
async fn remove_claim_finalizer(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    set_claim_finalizer(ctx, claim, false).await.map(drop)
}

/// Whether provisioning of `claim` is under way: its intent is in the journal or on the
/// claim (our finalizer).
fn intent_recorded(ctx: &Context, claim: &PersistentVolumeClaim) -> bool {
    ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING)
        || ctx.journal.contains(&key(claim))
}

/// Provisioning of `claim` is over with nothing in the backend that no PV owns: its
/// intent goes, from the journal and from the claim. `claim` must be as fresh as the
/// last write of ours to it.
async fn release_intent(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    ctx.leadership.check("provisioning intent release")?;
    ctx.journal.clear(&key(claim));
    if ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        remove_claim_finalizer(ctx, claim).await?;
    }
    Ok(())
}

/// The attempt ended with something possibly left in the backend that no PV owns (the
/// module works in the background, a call trapped, the PV could not be saved): the
/// intent moves onto the claim as our finalizer, visible and kept while the claim is
/// retried. A claim gone meanwhile keeps its journal entry, which the sweep cleans up.
async fn keep_intent(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    if ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        return Ok(());
    }
    if add_claim_finalizer(ctx, claim).await?.is_some() {
        ctx.settings
            .faults
            .after(Step::FinalizerAdd, &ClaimView(claim).key());
        ctx.journal.clear(&key(claim));
    }
    Ok(())
}

/// Reschedule: drop the selected-node annotations so the scheduler picks again.
async fn remove_selected_node(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    ctx.leadership.check("selected-node removal")?;
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": {
            "annotations": {
                names::ANN_SELECTED_NODE: null,
                names::ANN_ALPHA_SELECTED_NODE: null,
            }
        }
    });
    match api
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(Error::api(claim, error)),
    }
}
