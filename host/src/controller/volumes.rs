//! The volume controller: keeps the HonorPVReclaimPolicy finalizer on our PVs and
//! deletes the backend volume of a released PV whose policy says Delete, then the PV.
//!
//! The module that deletes is the one recorded on the PV when it was made
//! (`wasm-provisioner.dev/module`), falling back to its class's `module`: a class
//! changed or deleted since never strands a volume. A module missing at delete time is a
//! VolumeFailedDelete Event and a retry, never a lost volume: the PV and its finalizer
//! stay until the backend delete succeeds.
//!
//! A plugin may delete a large volume in bounded chunks, answering `in-background`
//! after each: that is progress, not failure. The PV and its finalizer stay, the delete
//! is asked again after [`IN_BACKGROUND_REQUEUE`] without back-off, failure count or
//! Warning Event, and one Normal `VolumeDeleting` Event per volume says it is under way.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::Context;
use super::claims::{InFlight, call, delete_outcome, observe_call};
use super::faults::Step;
use super::finalizers;
use super::recent::VolumeStage;
use super::retry::Next;
use super::shares;
use crate::leader::NotLeader;
use wasm_provisioner_rules::decide::{self, DeleteDecision, FinalizerAction};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::object;
use wasm_provisioner_rules::types::DeleteError;
use wasm_provisioner_rules::volume;
use wasm_provisioner_runtime::{Call, CallError, LoadedModule};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume {volume}: Kubernetes API: {source}")]
    Api {
        volume: String,
        #[source]
        source: kube::Error,
    },
    #[error("volume {volume}: {message}")]
    Delete { volume: String, message: String },
    #[error(transparent)]
    Request(#[from] volume::Error),
    /// The leadership fence closed: nothing more is done; the next leader takes over.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

/// How soon a delete the plugin answered `in-background` is asked again: soon enough
/// that a volume deleted in one-second chunks goes at a steady pace, slow enough to
/// leave the workers to other volumes between chunks.
pub const IN_BACKGROUND_REQUEUE: Duration = Duration::from_secs(2);

/// Volumes (by UID) whose in-background delete this process already announced with a
/// Normal Event: one Event per volume, not one per chunk.
static ANNOUNCED_IN_BACKGROUND: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Whether this is the first in-background answer for the volume `key` (and remembers it).
fn first_in_background(key: &str) -> bool {
    let mut announced = ANNOUNCED_IN_BACKGROUND
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    announced
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string())
}

/// Forgets the announcement of a volume whose delete finished.
fn forget_in_background(key: &str) {
    let mut announced = ANNOUNCED_IN_BACKGROUND
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(announced) = announced.as_mut() {
        announced.remove(key);
    }
}

/// Forgets the announcements of volumes that are gone (deleted without a last
/// reconcile), so the set cannot grow for ever.
pub(super) fn retain_announced(live: impl Fn(&str) -> bool) {
    let mut announced = ANNOUNCED_IN_BACKGROUND
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(announced) = announced.as_mut() {
        announced.retain(|key| live(key));
    }
}

fn api_error(pv: &PersistentVolume, source: kube::Error) -> Error {
    Error::Api {
        volume: pv.name_any(),
        source,
    }
}

pub(super) fn key(pv: &PersistentVolume) -> String {
    pv.metadata.uid.clone().unwrap_or_else(|| pv.name_any())
}

fn class_label(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

pub async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let name = &ctx.settings.provisioner_name;
    if !decide::provisioned_by(&pv, name) {
        return Ok(Action::await_change());
    }
    match decide::pv_finalizer_action(&pv, name, ctx.settings.volume_protection_finalizer) {
        FinalizerAction::Add => {
            edit_finalizer(&ctx, &pv, true).await?;
            return Ok(Action::requeue(ctx.settings.resync_period));
        }
        FinalizerAction::Remove => {
            edit_finalizer(&ctx, &pv, false).await?;
            return Ok(Action::await_change());
        }
        FinalizerAction::None => {}
    }
    match decide::should_delete(&pv, name) {
        DeleteDecision::Skip(reason) => {
            tracing::debug!(volume = pv.name_any(), %reason, "not deleting");
            if pv.metadata.deletion_timestamp.is_none() {
                ctx.volume_retries.forget(&key(&pv));
            }
            Ok(Action::requeue(ctx.settings.resync_period))
        }
        DeleteDecision::Delete => delete(&ctx, &pv).await,
    }
}

/// Why the module of a volume cannot be had.
enum NoModule {
    /// Still loading: the volume waits, without a failed attempt.
    Loading(String),
    Missing(String),
}

/// The module that made this PV, as recorded on it, else its class's.
fn module_for(ctx: &Context, pv: &PersistentVolume) -> Result<Arc<LoadedModule>, NoModule> {
    let recorded = pv.annotations().get(names::ANN_MODULE).cloned();
    let class = ctx.class(&class_label(pv));
    let module = recorded
        .or_else(|| {
            class
                .as_ref()
                .and_then(|c| c.parameters.as_ref()?.get(names::PARAM_MODULE).cloned())
        })
        .ok_or_else(|| {
            NoModule::Missing(format!(
                "cannot tell which module made it: no {:?} annotation and no class with a {:?} parameter",
                names::ANN_MODULE,
                names::PARAM_MODULE
            ))
        })?;
    ctx.runtime.resolve(&module, None).map_err(|error| {
        if error.is_loading() {
            NoModule::Loading(error.to_string())
        } else {
            NoModule::Missing(format!(
                "{error}; the volume is kept and its deletion retried until the module is back"
            ))
        }
    })
}

async fn delete(ctx: &Context, pv: &PersistentVolume) -> Result<Action, Error> {
    // The cache may still show a volume whose backend this process deleted a moment ago
    // (the PV's deletion not yet seen): no second delete call, only what is left of its
    // cleanup. No live read (docs/design.md, "No claim write, no read the caches can answer").
    match ctx.recent.volume_stage(&key(pv)) {
        Some(VolumeStage::Finished) => return Ok(Action::await_change()),
        Some(VolumeStage::BackendDeleted) => return remove_volume(ctx, pv).await,
        None => {}
    }
    let volume_name = pv.name_any();
    let class = class_label(pv);
    let module = match module_for(ctx, pv) {
        Ok(module) => module,
        Err(NoModule::Loading(message)) => {
            tracing::debug!(volume = %volume_name, "{message}; retrying in {:?}", shares::LOADING_RECHECK);
            return Ok(Action::requeue(shares::LOADING_RECHECK));
        }
        Err(NoModule::Missing(message)) => {
            return Err(delete_failed(ctx, pv, &class, message).await);
        }
    };
    // The module's share of the volume workers (see `shares`): a volume whose module
    // holds all of it waits in the module's own queue, before any API request, without
    // an Event or a failed attempt.
    let Some(share) = ctx.volume_shares.try_enter(
        module.name(),
        module.limits().max_concurrent_calls,
        ObjectRef::from_obj(pv),
    ) else {
        tracing::debug!(
            volume = %volume_name,
            module = module.name(),
            "the module holds its whole share of the workers; the volume waits for one"
        );
        return Ok(Action::requeue(shares::RECHECK));
    };
    let request = volume::delete_request(pv, ctx.class(&class).as_deref())?;

    match call(
        ctx,
        &module,
        Call::ShouldDelete,
        module.should_delete(&request),
    )
    .await
    {
        Ok(true) => {}
        Err(error) if error.is_busy() => return Ok(busy(pv, &error)),
        Err(error) if error.is_pool_full() => {
            return Ok(super::pool_full::volume(&ctx.events, pv, &error).await);
        }
        Ok(false) => {
            info!(volume = %volume_name, module = module.name(), "plugin declined to delete (should-delete said no)");
            return Ok(Action::await_change());
        }
        Err(error) => return Err(delete_failed(ctx, pv, &class, error.to_string()).await),
    }

    let gauge = ctx.metrics.in_flight.with_label_values(&["delete"]);
    let in_flight = InFlight::start(&gauge);
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest delete call", module.delete(&request))
        .await;
    drop(in_flight);
    // The module answered: its share of the workers goes to its next volume.
    drop(share);
    let answer = answer?;
    observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
    match answer {
        Ok(Ok(())) => {}
        Ok(Err(DeleteError::Ignored(message))) => {
            info!(volume = %volume_name, module = module.name(), %message, "plugin ignored the delete");
            return Ok(Action::await_change());
        }
        Ok(Err(DeleteError::Failed(message))) => {
            return Err(delete_failed(ctx, pv, &class, message).await);
        }
        Ok(Err(DeleteError::InBackground(message))) => {
            // Progress: earlier failures no longer count towards giving up.
            ctx.volume_retries.forget(&key(pv));
            info!(volume = %volume_name, module = module.name(), %message, "the plugin deletes the backend volume in the background; asking again soon");
            if first_in_background(&key(pv)) {
                ctx.events
                    .volume_normal(
                        pv,
                        names::REASON_VOLUME_DELETING,
                        format!(
                            "module {} is deleting the backend volume in the background ({message}); the PV stays until it is done",
                            module.name()
                        ),
                    )
                    .await;
            }
            return Ok(Action::requeue(IN_BACKGROUND_REQUEUE));
        }
        Err(error) if error.is_busy() => return Ok(busy(pv, &error)),
        Err(error) if error.is_pool_full() => {
            return Ok(super::pool_full::volume(&ctx.events, pv, &error).await);
        }
        Err(error) => return Err(delete_failed(ctx, pv, &class, error.to_string()).await),
    }
    ctx.settings.faults.after(Step::GuestDelete, &volume_name);
    forget_in_background(&key(pv));
    ctx.metrics
        .delete_total
        .with_label_values(&[class.as_str()])
        .inc();
    ctx.metrics
        .delete_duration
        .with_label_values(&[class.as_str()])
        .observe(started.elapsed().as_secs_f64());
    info!(volume = %volume_name, module = module.name(), "backend volume deleted");

    ctx.recent
        .set_volume_stage(&key(pv), VolumeStage::BackendDeleted);
    remove_volume(ctx, pv).await
}

/// The backend is gone: lets the PV go (our finalizer off), then deletes it (unless it
/// is being deleted already). In this order our edit lands before the PV has a
/// deletion timestamp, so it never races the pv-protection controller, which edits a
/// PV (with a resourceVersion precondition) only once it is being deleted: removing our
/// finalizer after the delete made a third of its edits fail with 409 and read the PV
/// again. A PV left Released without our finalizer (a crash in between) is
/// deleted again from the top: the module's delete of a deleted volume succeeds.
async fn remove_volume(ctx: &Context, pv: &PersistentVolume) -> Result<Action, Error> {
    let volume_name = pv.name_any();
    let ours = object::has_finalizer(&pv.metadata, names::FINALIZER_PV_PROTECTION);
    if ours {
        edit_finalizer(ctx, pv, false).await?;
    }
    if pv.metadata.deletion_timestamp.is_none() {
        let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
        let deleted = ctx
            .leadership
            .fenced(
                "PV delete",
                api.delete(&volume_name, &DeleteParams::default()),
            )
            .await?;
        match deleted {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(api_error(pv, error)),
        }
        ctx.settings.faults.after(Step::PvDelete, &volume_name);
    }
    ctx.recent.set_volume_stage(&key(pv), VolumeStage::Finished);
    ctx.volume_retries.forget(&key(pv));
    Ok(Action::await_change())
}

/// A call refused because the module already runs its `maxConcurrentCalls` (claims and
/// volumes together): not a failed attempt, no Event; retried shortly.
fn busy(pv: &PersistentVolume, error: &CallError) -> Action {
    info!(volume = %pv.name_any(), "{error}; retrying in {:?}", shares::RECHECK);
    Action::requeue(shares::RECHECK)
}

async fn delete_failed(
    ctx: &Context,
    pv: &PersistentVolume,
    class: &str,
    message: String,
) -> Error {
    ctx.metrics
        .delete_failed_total
        .with_label_values(&[class])
        .inc();
    ctx.events
        .volume_warning(pv, names::REASON_VOLUME_FAILED_DELETE, message.clone())
        .await;
    Error::Delete {
        volume: pv.name_any(),
        message,
    }
}

/// Adds or removes the protection finalizer without overwriting others' finalizers.
async fn edit_finalizer(ctx: &Context, pv: &PersistentVolume, add: bool) -> Result<(), Error> {
    ctx.leadership.check("PV finalizer edit")?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    finalizers::set(&api, pv, names::FINALIZER_PV_PROTECTION, add, None)
        .await
        .map_err(|e| api_error(pv, e))?;
    Ok(())
}

pub fn error_policy(pv: Arc<PersistentVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(%error, "deleting did not finish; will retry");
    if let Error::NotLeader(_) = error {
        return Action::requeue(super::claims::NOT_LEADER_REQUEUE);
    }
    match ctx.volume_retries.failed(&key(&pv), 0) {
        Next::RetryAfter(delay) => Action::requeue(delay),
        Next::GiveUp { failures, first } => {
            let note = format!(
                "gave up after {failures} failed attempts (--failed-delete-threshold); last error: {error}. The volume is kept and its deletion retried once every {} (--resync-period); fix the cause, or delete the backend volume manually",
                humantime::format_duration(ctx.settings.resync_period)
            );
            super::give_up(
                ctx,
                "volumes",
                kube::Resource::object_ref(pv.as_ref(), &()),
                first,
                names::REASON_VOLUME_FAILED_DELETE,
                note,
            )
        }
    }
}
