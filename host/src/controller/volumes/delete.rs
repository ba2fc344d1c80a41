//! The steps that learn something on the way to a volume's deletion: its module, a
//! worker of the module's share, the module's `should-delete` and `delete`, then the PV
//! let go and deleted.

use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::DeleteParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info};

use super::attempt::{Attempt, NoModule};
use super::error::Error;
use super::key::class_label;
use super::{finalizer, outcome, told};
use crate::controller::calls::{InFlight, call, delete_outcome, observe_call};
use crate::controller::claims::decision::{Lookup, Share};
use crate::controller::faults::Step as Fault;
use crate::controller::recent::VolumeStage;
use crate::controller::recorded_node;
use crate::controller::secrets;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::volume;
use wasm_provisioner_runtime::Call;

/// The module that made this PV, as recorded on it, else its class's.
pub(super) fn module(attempt: &mut Attempt<'_>) {
    let ctx = attempt.ctx;
    let pv = &attempt.pv;
    let recorded = pv.annotations().get(names::ANN_MODULE).cloned();
    let class = ctx.class(&class_label(pv));
    let name = recorded.or_else(|| {
        class
            .as_ref()
            .and_then(|c| c.parameters.as_ref()?.get(names::PARAM_MODULE).cloned())
    });
    let resolved = match name {
        None => Err(NoModule {
            loading: false,
            message: format!(
                "cannot tell which module made it: no {:?} annotation and no class with a {:?} parameter",
                names::ANN_MODULE,
                names::PARAM_MODULE
            ),
        }),
        Some(name) => ctx.runtime.resolve(&name, None).map_err(|error| NoModule {
            loading: error.is_loading(),
            message: if error.is_loading() {
                error.to_string()
            } else {
                format!(
                    "{error}; the volume is kept and its deletion retried until the module is back"
                )
            },
        }),
    };
    attempt.module = Lookup::Found(resolved);
}

/// One worker of the module's share of the volume workers; when the module holds all
/// of it, the volume waits in the module's own queue, before any API request, without
/// an Event or a failed attempt.
pub(super) fn share(attempt: &mut Attempt<'_>) {
    let Some(module) = attempt.loaded_module() else {
        attempt.share = Share::Entered;
        return;
    };
    let permit = attempt.ctx.volume_shares.try_enter(
        module.name(),
        module.limits().max_concurrent_calls,
        ObjectRef::from_obj(attempt.pv.as_ref()),
    );
    if permit.is_none() {
        debug!(
            volume = %attempt.pv.name_any(),
            module = module.name(),
            "the module holds its whole share of the workers; the volume waits for one"
        );
    }
    attempt.share = if permit.is_some() {
        Share::Entered
    } else {
        Share::Full
    };
    attempt.share_permit = permit;
}

/// Asks the module's `should-delete`, with the request `delete` gets too.
pub(super) async fn ask_should_delete(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let module = attempt
        .loaded_module()
        .cloned()
        .expect("the decision asks only a resolved module");
    let mut request =
        volume::delete_request(&attempt.pv, ctx.class(&class_label(&attempt.pv)).as_deref())?;
    request.context = ctx.backends.context(recorded_node(&attempt.pv));
    request.secret = match secrets::for_volume(ctx, &module, &attempt.pv).await {
        Ok(secret) => secret,
        Err(source) => {
            let message = format!("cannot hand the module its Secret: {source}");
            return Err(outcome::failed(attempt, source.metric_label(), message).await);
        }
    };
    let answer = call(
        ctx,
        &module,
        Call::ShouldDelete,
        ctx.backends.should_delete(&module, &request),
    )
    .await;
    attempt.request = Some(request);
    attempt.should_delete = Some(answer);
    Ok(())
}

/// Asks the module to delete the backend volume; its worker goes to the module's next
/// volume once it answered.
pub(super) async fn delete(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let module = attempt
        .loaded_module()
        .cloned()
        .expect("the decision deletes only with a resolved module");
    let request = attempt
        .request
        .as_ref()
        .expect("the module was asked should-delete with this request");
    let in_flight = InFlight::start(ctx, "delete");
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest delete call", ctx.backends.delete(&module, request))
        .await;
    drop(in_flight);
    attempt.share_permit = None;
    let answer = answer?;
    observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
    attempt.started = Some(started);
    attempt.deleted = Some(answer);
    Ok(())
}

/// The backend volume is gone: counted, and remembered, so a reconcile the cache still
/// shows the PV to does not delete it twice.
pub(super) fn backend_deleted(attempt: &Attempt<'_>) {
    let ctx = attempt.ctx;
    let volume_name = attempt.pv.name_any();
    ctx.settings.faults.after(Fault::GuestDelete, &volume_name);
    told::forget(&attempt.key);
    let class = class_label(&attempt.pv);
    ctx.metrics
        .delete_total
        .with_label_values(&[class.as_str()])
        .inc();
    if let Some(started) = attempt.started {
        ctx.metrics
            .delete_duration
            .with_label_values(&[class.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }
    let module = attempt
        .loaded_module()
        .map(|m| m.name())
        .unwrap_or_default();
    info!(volume = %volume_name, module, "backend volume deleted");
    ctx.recent
        .set_volume_stage(&attempt.key, VolumeStage::BackendDeleted);
}

/// Our finalizer comes off the PV (its backend is gone).
pub(super) async fn let_go(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    finalizer::edit(attempt.ctx, &attempt.pv, false).await?;
    attempt.finalizer_removed = true;
    Ok(())
}

/// Deletes the PV object (gone already counts).
pub(super) async fn delete_pv(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let volume_name = attempt.pv.name_any();
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
        Err(error) => return Err(Error::api(&attempt.pv, error)),
    }
    ctx.settings.faults.after(Fault::PvDelete, &volume_name);
    attempt.pv_deleted = true;
    Ok(())
}
