//! The claim controller: turns each claim of our classes into a PV through its class's
//! plugin.
//!
//! No backend volume is ever orphaned. Before the plugin is first asked to provision,
//! the claim gets our finalizer (`wasm-provisioner.dev/provisioning`): the intent is
//! persisted in the API, not in memory. The finalizer comes off only once the claim's
//! PV exists (the PV then owns the backend volume) or once nothing is left in the
//! backend. A process killed between the plugin's answer and the PV create finds the
//! claim again on restart: if the claim still exists the plugin (idempotent by PV
//! name) answers the same volume and the PV is created; if the claim was deleted
//! meanwhile, [`cleanup`] asks the plugin for the volume once more and deletes it.
//!
//! When the PV cannot be saved after `pv_save_retries` tries, the backend volume is
//! deleted (the seed's choice), with ProvisioningCleanupFailed when that fails too; the
//! finalizer stays until the delete succeeds, so the claim cannot leave a volume behind.

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
use tracing::{info, warn};

use super::Context;
use super::finalizers::{self, Edited};
use super::retry::Next;
use super::shares;
use crate::decide::{self, ProvisionDecision, SkipProvision};
use crate::names;
use crate::plugin::types::{
    DeleteError, DeleteRequest, PluginInfo, ProvisionError, ProvisionRequest, Volume,
};
use crate::plugin::{Call, CallError, LoadedModule};
use crate::{request, volume};

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
}

impl Error {
    fn api(claim: &PersistentVolumeClaim, source: kube::Error) -> Self {
        Error::Api {
            claim: request::claim_key(claim),
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
        .unwrap_or_else(|| request::claim_key(claim))
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

fn resync(ctx: &Context) -> Action {
    Action::requeue(ctx.settings.resync_period)
}

pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let key = key(&claim);
    // Only claims for this provisioner: every wasm-provisioner instance uses the same
    // claim finalizer, so another instance's claims (even being deleted) are not ours.
    let names = [ctx.settings.provisioner_name.as_str()];
    if !decide::claim_provisioner(&claim).is_some_and(|p| names.contains(&p)) {
        return Ok(resync(&ctx));
    }
    if claim.metadata.deletion_timestamp.is_some() {
        if decide::has_finalizer(&claim.metadata, names::FINALIZER_CLAIM_PROVISIONING) {
            return cleanup(&claim, &ctx).await;
        }
        ctx.claim_retries.forget(&key);
        return Ok(Action::await_change());
    }

    // Bound or being bound: whatever we started is published; our finalizer can go.
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound {
        remove_claim_finalizer(&ctx, &claim).await?;
        ctx.claim_retries.forget(&key);
        return Ok(resync(&ctx));
    }
    if ctx.claim_retries.given_up(&key, fingerprint(&claim)) {
        return Ok(Action::await_change());
    }

    let class = request::claim_class_name(&claim).and_then(|name| ctx.class(&name));
    if let Some(class) = &class {
        ctx.claim_retries
            .class_changed(&key, &class.resource_version().unwrap_or_default());
    }
    // Waiting out a retry delay (or an ignored answer) while the claim is unchanged.
    if let Some(wait) = ctx.claim_retries.held(&key, fingerprint(&claim)) {
        return Ok(Action::requeue(wait));
    }

    // The module's share of the workers: when it holds all of it, the claim waits in the
    // module's own queue (no failed attempt, no Event), and this worker goes on with
    // other claims. Checked before the live PV read below, so a waiting claim costs no
    // API request. Held until the reconcile ends.
    let _share = match enter_share(&ctx, &claim, class.as_deref()) {
        ShareEntry::Entered(permit) => Some(permit),
        ShareEntry::NoModule => None,
        ShareEntry::Wait => return Ok(Action::requeue(shares::RECHECK)),
    };

    // The cache check: the PV of this claim exists, so provisioning is done. A cache
    // miss is confirmed live: the cache may lag our own create by a moment, and a
    // second provision would count and announce the volume twice.
    let pv_name = volume_name_for(&claim);
    let existing = match ctx.volume(&pv_name) {
        Some(pv) => Some(pv),
        None => Api::<PersistentVolume>::all(ctx.client.clone())
            .get_opt(&pv_name)
            .await
            .map_err(|e| Error::api(&claim, e))?
            .map(Arc::new),
    };
    if existing.is_some_and(|pv| decide::existing_pv_is_this_claims(&pv, &claim)) {
        remove_claim_finalizer(&ctx, &claim).await?;
        ctx.claim_retries.forget(&key);
        return Ok(resync(&ctx));
    }

    let module = match &class {
        Some(class) if class.provisioner == ctx.settings.provisioner_name => {
            Some(resolve_module(&ctx, &claim, class).await?)
        }
        _ => None,
    };
    let unknown = PluginInfo {
        name: String::new(),
        version: String::new(),
        supports_block: false,
        data_source_kinds: Vec::new(),
    };
    let info = module.as_ref().map_or(&unknown, |m| m.info());
    match decide::should_provision(&claim, class.as_deref(), &names, info) {
        ProvisionDecision::Skip(reason) => return skip(&ctx, &claim, reason).await,
        ProvisionDecision::Provision => {}
    }
    let (Some(class), Some(module)) = (class, module) else {
        unreachable!(
            "should_provision only says Provision with a class of ours, whose module resolved"
        );
    };

    // WaitForFirstConsumer: the selected node must still exist, or the scheduler must
    // pick again (claims otherwise stay Pending forever on a vanished node).
    let node = match decide::selected_node(&claim) {
        Some(name) => match ctx.node(name) {
            Some(node) => Some(node),
            None => {
                let message = format!(
                    "selected node {name:?} does not exist; asking the scheduler to pick another"
                );
                ctx.events
                    .claim_warning(&claim, names::REASON_PROVISIONING_FAILED, message.clone())
                    .await;
                remove_selected_node(&ctx, &claim).await?;
                return Err(Error::Skipped {
                    claim: request::claim_key(&claim),
                    message,
                });
            }
        },
        None => None,
    };

    let request = request::provision_request(&claim, &class, node.as_deref())?;
    match call(
        &ctx,
        &module,
        Call::ShouldProvision,
        module.should_provision(&request),
    )
    .await
    {
        Ok(true) => {}
        Err(source @ CallError::Busy { .. }) => return Ok(busy(&claim, &source)),
        Ok(false) => {
            info!(claim = %request::claim_key(&claim), module = module.name(), "plugin declined the claim (should-provision said no)");
            return Ok(resync(&ctx));
        }
        Err(source) => return Err(call_failed(&ctx, &claim, &class, source).await),
    }

    provision(&ctx, &claim, &class, &module, request).await
}

/// Whether a claim may use a worker for its module now.
enum ShareEntry {
    /// A worker of the module's share, held until the reconcile ends.
    Entered(shares::SharePermit<PersistentVolumeClaim>),
    /// No module of ours is loaded for the claim's class: nothing to share.
    NoModule,
    /// The module holds its whole share: the claim waits in the module's queue.
    Wait,
}

fn enter_share(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
) -> ShareEntry {
    let module = class
        .filter(|class| class.provisioner == ctx.settings.provisioner_name)
        .and_then(|class| class.parameters.as_ref()?.get(names::PARAM_MODULE))
        .and_then(|name| ctx.runtime.module(name));
    let Some(module) = module else {
        return ShareEntry::NoModule;
    };
    let object = kube::runtime::reflector::ObjectRef::from_obj(claim);
    match ctx
        .claim_shares
        .try_enter(module.name(), module.limits().max_concurrent_calls, object)
    {
        Some(permit) => ShareEntry::Entered(permit),
        None => {
            tracing::debug!(
                claim = %request::claim_key(claim),
                module = module.name(),
                "the module holds its whole share of the workers; the claim waits for one"
            );
            ShareEntry::Wait
        }
    }
}

/// A call refused because the module already runs its `maxConcurrentCalls` (claims and
/// volumes together can exceed the claim share): not a failed attempt, no Event; the
/// claim is retried shortly, like a claim waiting for its share.
fn busy(claim: &PersistentVolumeClaim, source: &CallError) -> Action {
    info!(claim = %request::claim_key(claim), "{source}; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

/// The PV name of a claim: `pvc-<uid>`.
fn volume_name_for(claim: &PersistentVolumeClaim) -> String {
    request::volume_name(claim).unwrap_or_default()
}

async fn skip(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    reason: SkipProvision,
) -> Result<Action, Error> {
    if let Some(event_reason) = reason.event_reason() {
        ctx.events
            .claim_warning(claim, event_reason, reason.to_string())
            .await;
    }
    if reason.retry() {
        return Err(Error::Skipped {
            claim: request::claim_key(claim),
            message: reason.to_string(),
        });
    }
    Ok(resync(ctx))
}

/// The class's module, honouring `moduleSHA256`. A missing or refused module is a
/// Warning Event and a retry: the admin may be adding it right now.
async fn resolve_module(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Arc<LoadedModule>, Error> {
    let class_name = class.name_any();
    let parameters = class.parameters.as_ref();
    let message = match parameters.and_then(|p| p.get(names::PARAM_MODULE)) {
        None => format!(
            "storage class {class_name:?} has no {:?} parameter; set it to the name of a module in the modules directory",
            names::PARAM_MODULE
        ),
        Some(module) => {
            let pinned = parameters.and_then(|p| p.get(names::PARAM_MODULE_SHA256));
            match ctx.runtime.resolve(module, pinned.map(String::as_str)) {
                Ok(loaded) => return Ok(loaded),
                Err(error) => format!("storage class {class_name:?}: {error}"),
            }
        }
    };
    ctx.events
        .claim_warning(claim, names::REASON_PROVISIONING_FAILED, message.clone())
        .await;
    Err(Error::Module {
        claim: request::claim_key(claim),
        message,
    })
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

/// A host-side failure of a guest call (trap, timeout, ...): the backend may hold a
/// half-made volume, so the finalizer stays, like in-background.
async fn call_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    source: CallError,
) -> Error {
    let note = format!(
        "failed to provision volume with StorageClass {:?}: {source}",
        class.name_any()
    );
    attempt_failed(ctx, claim, class, note).await;
    Error::Call {
        claim: request::claim_key(claim),
        source,
    }
}

fn metric_labels(claim: &PersistentVolumeClaim, class: &StorageClass) -> [String; 2] {
    [
        class.name_any(),
        request::data_source_kind(claim)
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

async fn provision(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    request: ProvisionRequest,
) -> Result<Action, Error> {
    let claim_key = request::claim_key(claim);
    let gauge = ctx.metrics.in_flight.with_label_values(&["provision"]);
    let _in_flight = InFlight::start(&gauge);

    // Persist the intent before the backend is touched. From here on `claim` is the
    // fresh object, so later finalizer edits see our finalizer.
    let claim = &add_claim_finalizer(ctx, claim).await?;
    ctx.events
        .claim_normal(
            claim,
            names::REASON_PROVISIONING,
            format!("External provisioner is provisioning volume for claim {claim_key:?}"),
        )
        .await;

    let started = Instant::now();
    let answer = module.provision(&request).await;
    observe_call(
        ctx,
        module,
        Call::Provision,
        started,
        provision_outcome(&answer),
    );

    let volume = match answer {
        // The finalizer stays (harmless: the module did nothing); retried shortly.
        Err(source @ CallError::Busy { .. }) => return Ok(busy(claim, &source)),
        Err(source) => return Err(call_failed(ctx, claim, class, source).await),
        Ok(Err(error)) => return provision_refused(ctx, claim, class, module, error).await,
        Ok(Ok(volume)) => volume,
    };

    if ctx.settings.fault_exit_after_provision {
        warn!(claim = %claim_key, "fault injection: exiting between the plugin's provision and the PV create");
        std::process::exit(137);
    }

    publish(ctx, claim, class, module, &request, volume, started).await
}

/// The plugin answered an error variant: each outcome as the successor library does.
async fn provision_refused(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    error: ProvisionError,
) -> Result<Action, Error> {
    let claim_key = request::claim_key(claim);
    let outcome = provision_error_label(&error);
    let (ProvisionError::Ignored(message)
    | ProvisionError::Failed(message)
    | ProvisionError::InBackground(message)
    | ProvisionError::Reschedule(message)
    | ProvisionError::Infeasible(message)) = &error;
    let message = message.clone();

    if let ProvisionError::Ignored(_) = error {
        // "Not mine": no Warning, no retry; nothing was made.
        info!(claim = %claim_key, module = module.name(), %message, "plugin ignored the claim");
        ctx.claim_retries
            .hold(&key(claim), fingerprint(claim), ctx.settings.resync_period);
        remove_claim_finalizer(ctx, claim).await?;
        return Ok(resync(ctx));
    }

    let note = format!(
        "failed to provision volume with StorageClass {:?}: {message}",
        class.name_any()
    );
    attempt_failed(ctx, claim, class, note).await;
    match error {
        // The backend may still be working: keep the finalizer, retry.
        ProvisionError::InBackground(_) => {}
        ProvisionError::Reschedule(_) => {
            remove_claim_finalizer(ctx, claim).await?;
            remove_selected_node(ctx, claim).await?;
        }
        ProvisionError::Infeasible(_) => {
            remove_claim_finalizer(ctx, claim).await?;
            return Err(Error::Infeasible {
                claim: claim_key,
                module: module.name().to_string(),
                message,
                class_version: class.resource_version().unwrap_or_default(),
            });
        }
        _ => remove_claim_finalizer(ctx, claim).await?,
    }
    Err(Error::Outcome {
        claim: claim_key,
        module: module.name().to_string(),
        outcome,
        message,
    })
}

/// Turns the plugin's volume into a PV, checks its source against the module's volume
/// grants and saves it. An answer that cannot be published (invalid, or a source the
/// module may not publish) or a PV that cannot be saved is discarded: the backend volume
/// is deleted through the module and nothing is published.
async fn publish(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    request: &ProvisionRequest,
    volume: Volume,
    started: Instant,
) -> Result<Action, Error> {
    let claim_key = request::claim_key(claim);
    let unpublished = volume::unpublished_delete_request(request, &volume);
    let published = volume::publishable_volume(
        request,
        claim,
        class,
        volume,
        &ctx.settings.provisioner_name,
        ctx.settings.volume_protection_finalizer,
        module,
    );
    let pv = match published {
        Ok(pv) => pv,
        Err(error) => {
            let message = error.to_string();
            warn!(claim = %claim_key, module = module.name(), "{message}");
            provision_failed_metric(ctx, claim, class);
            return discard(ctx, claim, module, &unpublished, message).await;
        }
    };

    match save_volume(ctx, claim, &pv).await {
        Saved::Yes => {
            let labels = metric_labels(claim, class);
            let labels = [labels[0].as_str(), labels[1].as_str()];
            ctx.metrics.provision_total.with_label_values(&labels).inc();
            ctx.metrics
                .provision_duration
                .with_label_values(&labels)
                .observe(started.elapsed().as_secs_f64());
            if let Some(created) = &claim.metadata.creation_timestamp {
                let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
                ctx.metrics
                    .claim_to_volume
                    .with_label_values(&[labels[0]])
                    .observe(waited.as_secs_f64().max(0.0));
            }
            info!(claim = %claim_key, volume = pv.name_any(), module = module.name(), "provisioned");
            ctx.events
                .claim_normal(
                    claim,
                    names::REASON_PROVISIONING_SUCCEEDED,
                    format!("Successfully provisioned volume {}", pv.name_any()),
                )
                .await;
            remove_claim_finalizer(ctx, claim).await?;
            ctx.claim_retries.forget(&key(claim));
            Ok(resync(ctx))
        }
        Saved::Conflict(message) => {
            // A PV of this name exists but is not this claim's live volume (one on its
            // way out): that PV's deletion owns the backend volume of the same name.
            attempt_failed(ctx, claim, class, message.clone()).await;
            Err(Error::Save {
                claim: claim_key,
                message,
            })
        }
        Saved::No(message) => {
            provision_failed_metric(ctx, claim, class);
            let delete = volume::delete_request(&pv, Some(class))?;
            discard(ctx, claim, module, &delete, message).await
        }
    }
}

/// Deletes, through the module, a backend volume that was made but not published, so
/// nothing is left behind; then provisioning is retried with back-off. If the delete
/// fails, the claim keeps its finalizer (the volume exists) and the cleanup is retried.
async fn discard(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    module: &LoadedModule,
    delete: &DeleteRequest,
    message: String,
) -> Result<Action, Error> {
    let claim_key = request::claim_key(claim);
    let started = Instant::now();
    let answer = module.delete(delete).await;
    observe_call(ctx, module, Call::Delete, started, delete_outcome(&answer));
    let cause = match answer {
        Ok(Ok(())) => {
            ctx.events
                .claim_warning(
                    claim,
                    names::REASON_PROVISIONING_FAILED,
                    format!(
                        "{message}; the backend volume was deleted and provisioning will be retried"
                    ),
                )
                .await;
            remove_claim_finalizer(ctx, claim).await?;
            return Err(Error::Save {
                claim: claim_key,
                message,
            });
        }
        Ok(Err(error)) => format!("{error:?}"),
        Err(error) => error.to_string(),
    };
    ctx.events
        .claim_warning(
            claim,
            names::REASON_PROVISIONING_CLEANUP_FAILED,
            format!(
                "{message}; deleting the backend volume {} failed too: {cause}. It will be retried while the claim exists; if you delete the claim, please delete the volume manually",
                delete.volume.name
            ),
        )
        .await;
    Err(Error::Save {
        claim: claim_key,
        message: format!("{message}; cleanup failed: {cause}"),
    })
}

enum Saved {
    Yes,
    /// Not saved, and the backend volume must not be deleted by us.
    Conflict(String),
    /// Not saved after every try: the backend volume should be deleted.
    No(String),
}

/// Creates the PV, `pv_save_retries` tries `pv_save_interval` apart. `AlreadyExists`
/// counts as success only when the existing PV is this claim's live volume (#1469).
async fn save_volume(ctx: &Context, claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Saved {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = pv.name_any();
    let tries = ctx.settings.pv_save_retries.max(1);
    let mut last_error = String::new();
    for attempt in 1..=tries {
        match api.create(&PostParams::default(), pv).await {
            Ok(_) => return Saved::Yes,
            Err(kube::Error::Api(status)) if status.code == 409 => match api.get_opt(&name).await {
                Ok(Some(existing)) if decide::existing_pv_is_this_claims(&existing, claim) => {
                    return Saved::Yes;
                }
                Ok(Some(_)) => {
                    return Saved::Conflict(format!(
                        "volume {name} already exists and is not this claim's live volume (it belongs to another claim or is being deleted); will retry once it is gone"
                    ));
                }
                Ok(None) => last_error = format!("volume {name} existed but vanished; retrying"),
                Err(error) => last_error = error.to_string(),
            },
            Err(error) => last_error = error.to_string(),
        }
        warn!(volume = %name, attempt, tries, error = %last_error, "could not save the PV");
        if attempt < tries {
            tokio::time::sleep(ctx.settings.pv_save_interval).await;
        }
    }
    // A last look before the caller deletes the backend volume: a create that timed out
    // may still have been stored, and a live PV must never sit on a deleted volume.
    if let Ok(Some(existing)) = api.get_opt(&name).await
        && decide::existing_pv_is_this_claims(&existing, claim)
    {
        return Saved::Yes;
    }
    Saved::No(format!(
        "could not save volume {name} after {tries} tries: {last_error}"
    ))
}

/// The claim is being deleted with our finalizer on: provisioning may have left a
/// backend volume. Ask the plugin for it again (idempotent by PV name) and delete it;
/// retried until the plugin answers definitively. Never given up on.
async fn cleanup(claim: &PersistentVolumeClaim, ctx: &Context) -> Result<Action, Error> {
    let claim_key = request::claim_key(claim);
    let cleanup_error = |message: String| Error::Cleanup {
        claim: claim_key.clone(),
        message,
    };
    let pv_name = volume_name_for(claim);
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let existing = api
        .get_opt(&pv_name)
        .await
        .map_err(|e| Error::api(claim, e))?;
    if existing
        .as_ref()
        .is_some_and(|pv| decide::pv_claim_uid_is(pv, claim))
    {
        // Published: the PV owns the backend volume now (and deletes it, if it is on
        // its way out).
        remove_claim_finalizer(ctx, claim).await?;
        return Ok(Action::await_change());
    }
    // No PV, or a PV of this name that is another claim's (made by hand, or copied):
    // the backend volume the module made for this claim is nobody's; delete it.
    let Some(class) = request::claim_class_name(claim).and_then(|name| ctx.class(&name)) else {
        return Err(cleanup_error(
            "its storage class is gone; recreate the class so the plugin can delete the backend volume".into(),
        ));
    };
    let module = resolve_module(ctx, claim, &class)
        .await
        .map_err(|error| cleanup_error(error.to_string()))?;
    let node = decide::selected_node(claim).and_then(|name| ctx.node(name));
    let request = request::provision_request(claim, &class, node.as_deref())?;

    let gauge = ctx.metrics.in_flight.with_label_values(&["provision"]);
    let _in_flight = InFlight::start(&gauge);
    let started = Instant::now();
    let answer = module.provision(&request).await;
    observe_call(
        ctx,
        &module,
        Call::Provision,
        started,
        provision_outcome(&answer),
    );
    match answer {
        Ok(Ok(volume)) => {
            // Built from the answer unchecked: a volume that could never be published
            // must still be deletable, or the claim would stay Terminating for ever.
            let delete = volume::unpublished_delete_request(&request, &volume);
            let started = Instant::now();
            let answer = module.delete(&delete).await;
            observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
            match answer {
                Ok(Ok(())) => {
                    info!(claim = %claim_key, volume = %pv_name, "claim deleted mid-flight; its backend volume was deleted");
                    remove_claim_finalizer(ctx, claim).await?;
                    Ok(Action::await_change())
                }
                Ok(Err(error)) => Err(cleanup_error(format!("plugin delete failed: {error:?}"))),
                Err(error) => Err(cleanup_error(error.to_string())),
            }
        }
        // Finished with nothing left in the backend.
        Ok(Err(
            ProvisionError::Ignored(_)
            | ProvisionError::Failed(_)
            | ProvisionError::Reschedule(_)
            | ProvisionError::Infeasible(_),
        )) => {
            remove_claim_finalizer(ctx, claim).await?;
            Ok(Action::await_change())
        }
        Ok(Err(ProvisionError::InBackground(message))) => Err(cleanup_error(format!(
            "the plugin is still working in the background: {message}"
        ))),
        Err(error) => Err(cleanup_error(error.to_string())),
    }
}

pub fn error_policy(claim: Arc<PersistentVolumeClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = key(&claim);
    warn!(%error, "provisioning did not finish; will retry");
    let print = fingerprint(&claim);
    match error {
        Error::Infeasible { class_version, .. } => {
            let delay = ctx.claim_retries.infeasible(&key, class_version);
            ctx.claim_retries.hold(&key, print, delay);
            Action::requeue(delay)
        }
        Error::Cleanup { .. } => Action::requeue(ctx.claim_retries.failed_forever(&key)),
        _ => match ctx.claim_retries.failed(&key, print) {
            Next::RetryAfter(delay) => {
                ctx.claim_retries.hold(&key, print, delay);
                Action::requeue(delay)
            }
            Next::GiveUp { failures } => {
                ctx.metrics.given_up.with_label_values(&["claims"]).inc();
                let message = format!(
                    "gave up after {failures} failed attempts (--failed-provision-threshold); last error: {error}. Edit or recreate the claim to try again"
                );
                tokio::spawn(async move {
                    ctx.events
                        .claim_gave_up(&claim, names::REASON_PROVISIONING_FAILED, message)
                        .await;
                });
                Action::await_change()
            }
        },
    }
}

/// Adds or removes our finalizer; returns the claim as it now is.
async fn set_claim_finalizer(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    add: bool,
) -> Result<PersistentVolumeClaim, Error> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    match finalizers::set(&api, claim, names::FINALIZER_CLAIM_PROVISIONING, add)
        .await
        .map_err(|e| Error::api(claim, e))?
    {
        Edited::Done(claim) => Ok(claim),
        Edited::Gone => Ok(claim.clone()),
        Edited::Busy => Err(Error::Save {
            claim: request::claim_key(claim),
            message: "the claim kept changing while its finalizers were updated; will retry".into(),
        }),
    }
}

/// Adds our finalizer; returns the claim as it now is.
async fn add_claim_finalizer(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<PersistentVolumeClaim, Error> {
    set_claim_finalizer(ctx, claim, true).await
}

/// Removes our finalizer. `claim` must be as fresh as the last write of ours to it (a
/// stale copy without the finalizer would make this a no-op).
async fn remove_claim_finalizer(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    set_claim_finalizer(ctx, claim, false).await.map(drop)
}

/// Reschedule: drop the selected-node annotations so the scheduler picks again.
async fn remove_selected_node(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), Error> {
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
