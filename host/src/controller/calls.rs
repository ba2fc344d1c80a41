//! Guest calls as both controllers make them: each one timed and counted
//! (`wasm_provisioner_guest_call_*`), its outcome labelled, and the operations in flight
//! gauged.

use std::time::Instant;

use wasm_provisioner_rules::types::{DeleteError, ProvisionError, ProvisionRequest, Volume};
use wasm_provisioner_runtime::{Call, CallError, LoadedModule};

use super::Context;
use super::claims::decision::CallFailure;
use crate::leader::NotLeader;

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

/// The module's `provision` of `request`, through the leadership fence (`step` names
/// it), recorded: when it started, and its answer.
pub(super) async fn fenced_provision(
    ctx: &Context,
    module: &LoadedModule,
    request: &ProvisionRequest,
    step: &'static str,
) -> Result<(Instant, Result<Result<Volume, ProvisionError>, CallError>), NotLeader> {
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced(step, ctx.backends.provision(module, request))
        .await?;
    observe_call(
        ctx,
        module,
        Call::Provision,
        started,
        provision_outcome(&answer),
    );
    Ok((started, answer))
}

/// What kind of failure a guest call's error is, for the decisions.
pub(super) fn call_failure(error: &CallError) -> CallFailure {
    if error.is_busy() {
        CallFailure::Busy
    } else if error.is_pool_full() {
        CallFailure::PoolFull
    } else {
        CallFailure::Failed
    }
}

/// Records one guest call that started at `started` and ended with `outcome`.
pub(super) fn observe_call(
    ctx: &Context,
    module: &LoadedModule,
    call: Call,
    started: Instant,
    outcome: &str,
) {
    observe(&ctx.metrics, module, call, started, outcome);
}

/// [`observe_call`] with the metrics at hand.
pub(super) fn observe(
    metrics: &crate::metrics::Metrics,
    module: &LoadedModule,
    call: Call,
    started: Instant,
    outcome: &str,
) {
    let labels = [module.name(), call.as_str(), outcome];
    metrics
        .guest_call_duration
        .with_label_values(&labels)
        .observe(started.elapsed().as_secs_f64());
    if outcome != "ok" {
        metrics.guest_call_failures.with_label_values(&labels).inc();
    }
}

/// The metric label of a plugin's provision error.
pub(super) fn provision_error_label(error: &ProvisionError) -> &'static str {
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
pub(super) fn provision_outcome(
    answer: &Result<Result<Volume, ProvisionError>, CallError>,
) -> &'static str {
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

/// One operation in flight (`wasm_provisioner_operations_in_flight`): the gauge goes
/// down when this is dropped, also when the operation is cancelled.
pub(super) struct InFlight(prometheus::IntGauge);

impl InFlight {
    /// Counts one `operation` ("provision", "delete", "expand") in flight.
    pub(super) fn start(ctx: &Context, operation: &str) -> Self {
        let gauge = ctx.metrics.in_flight.with_label_values(&[operation]);
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
