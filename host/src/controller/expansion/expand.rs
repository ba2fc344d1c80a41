//! The steps that learn something on the way to a volume's expansion: its module, the
//! claim marked in progress, the module's `expand`, the PV's new capacity.

use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use tracing::info;

use super::attempt::{Attempt, NoModule};
use super::error::Error;
use super::status;
use crate::controller::calls::{InFlight, observe_call};
use crate::controller::claims::decision::Lookup;
use crate::controller::faults::Step as Fault;
use crate::controller::secrets;
use wasm_provisioner_rules::types::ExpandError;
use wasm_provisioner_rules::{expand, names, quantity};
use wasm_provisioner_runtime::{Call, CallError};

/// The module that made the claim's PV, as recorded on it, else its class's (as the
/// volume controller finds the module that deletes).
pub(super) fn module(attempt: &mut Attempt<'_>) {
    let ctx = attempt.ctx;
    let recorded = attempt.pv().annotations().get(names::ANN_MODULE).cloned();
    let name = recorded.or_else(|| {
        attempt
            .class
            .as_ref()
            .and_then(|c| c.parameters.as_ref()?.get(names::PARAM_MODULE).cloned())
    });
    let resolved = match name {
        None => Err(NoModule {
            loading: false,
            message: format!(
                "cannot tell which module made volume {}: no {:?} annotation and no class with a {:?} parameter",
                attempt.pv().name_any(),
                names::ANN_MODULE,
                names::PARAM_MODULE
            ),
        }),
        Some(name) => ctx.runtime.resolve(&name, None).map_err(|error| NoModule {
            loading: error.is_loading(),
            message: error.to_string(),
        }),
    };
    attempt.module = Lookup::Found(resolved);
}

/// The claim's expansion starts: marked in progress (the `Resizing` condition, the size
/// allocated, `ControllerResizeInProgress`), told with a Normal `Resizing` Event.
pub(super) async fn mark_in_progress(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let requested = attempt.requested();
    let patch = expand::mark_in_progress(&attempt.claim, &requested, &status::now());
    let claim = status::patch_claim(ctx, &attempt.claim, patch, "claim expansion mark").await?;
    attempt.claim = Arc::new(claim);
    attempt.marked = true;
    ctx.settings
        .faults
        .after(Fault::ExpansionMark, &attempt.claim_key());
    let note = format!(
        "module {} is expanding volume {} from {} to {}",
        attempt.module_name(),
        attempt.pv().name_any(),
        attempt.volume_capacity().0,
        requested.0
    );
    ctx.events
        .expansion_normal(&attempt.claim, names::REASON_RESIZING, note)
        .await;
    Ok(())
}

/// Asks the module to expand the volume to the claim's request, through the fence.
pub(super) async fn expand(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let module = attempt
        .loaded_module()
        .cloned()
        .expect("the decision expands only with a resolved module");
    let requested =
        quantity::quantity_bytes(&attempt.requested()).map_err(|source| Error::Size {
            claim: attempt.claim_key(),
            source,
        })?;
    let mut request = expand::expand_request(attempt.pv(), attempt.class.as_deref(), requested)?;
    request.context = ctx
        .backends
        .context(crate::controller::recorded_node(attempt.pv()));
    request.secret = match secrets::for_volume(ctx, &module, attempt.pv()).await {
        Ok(secret) => secret,
        Err(source) => {
            let message = format!("cannot hand module {} its Secret: {source}", module.name());
            ctx.events
                .expansion_warning(
                    &attempt.claim,
                    names::REASON_VOLUME_RESIZE_FAILED,
                    message.clone(),
                )
                .await;
            return Err(Error::Expand {
                claim: attempt.claim_key(),
                cause: source.metric_label(),
                message,
            });
        }
    };
    let in_flight = InFlight::start(ctx, "expand");
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest expand call", ctx.backends.expand(&module, &request))
        .await;
    drop(in_flight);
    let answer = answer?;
    observe_call(ctx, &module, Call::Expand, started, expand_outcome(&answer));
    if let Ok(Ok(_)) = answer {
        ctx.settings
            .faults
            .after(Fault::GuestExpand, &attempt.claim_key());
    }
    attempt.started = Some(started);
    attempt.answer = Some(answer);
    Ok(())
}

/// The metric outcome of an `expand` call.
pub(super) fn expand_outcome(answer: &Result<Result<u64, ExpandError>, CallError>) -> &'static str {
    match answer {
        Ok(Ok(_)) => "ok",
        Ok(Err(ExpandError::Failed(_))) => "failed",
        Ok(Err(ExpandError::InBackground(_))) => "in_background",
        Ok(Err(ExpandError::Infeasible(_))) => "infeasible",
        Err(error) => error.metric_label(),
    }
}

/// The module's answer becomes the PV's capacity.
pub(super) async fn save_capacity(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let Some(Ok(Ok(bytes))) = attempt.answer else {
        unreachable!("the decision saves a capacity only after the module answered one");
    };
    let capacity = quantity::format_bytes(bytes);
    status::save_capacity(attempt.ctx, &attempt.claim, attempt.pv(), &capacity).await?;
    attempt
        .ctx
        .settings
        .faults
        .after(Fault::PvCapacity, &attempt.pv().name_any());
    info!(
        claim = %attempt.claim_key(),
        volume = %attempt.pv().name_any(),
        module = attempt.module_name(),
        capacity = %capacity.0,
        "volume expanded"
    );
    attempt.volume_saved = true;
    Ok(())
}
