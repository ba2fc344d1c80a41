//! The capacity poll: every `--capacity-poll-interval`, while this process leads, each
//! class of ours whose module has `report-capacity` is asked `get-capacity` (no node:
//! the class as a whole), and the answer is exported as
//! `wasm_provisioner_backend_capacity_bytes{class,module,kind}` with `kind` `total`,
//! `available` and, when the module gives one, `maximum_volume`. A poll that fails (the
//! module's error, a trap, a timeout) is logged and counted
//! (`wasm_provisioner_capacity_poll_failures_total{class,module}`), and the class's
//! gauges are removed rather than left at a value that may no longer be true; so are
//! those of a class gone or whose module no longer reports capacity.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::ClassChecks;
use wasm_provisioner_rules::request::class_of;
use wasm_provisioner_rules::types::{BackendCapacity, CallContext, Capability, CapacityRequest};

/// The gauge's `kind`s.
const KINDS: [&str; 3] = ["total", "available", "maximum_volume"];

/// Polls until `stop`.
pub(in crate::controller) async fn run(
    checks: Arc<ClassChecks>,
    classes: Store<StorageClass>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut published: HashSet<(String, String)> = HashSet::new();
    while !stop.is_cancelled() {
        let polls: Vec<_> = classes
            .state()
            .into_iter()
            .filter_map(|class| {
                let module = checks.module_with(&class, Capability::ReportCapacity)?;
                let checks = checks.clone();
                Some(async move {
                    let answer = poll(&checks, &class, &module).await;
                    (class.name_any(), module.name().to_string(), answer)
                })
            })
            .collect();
        let answers = tokio::select! {
            answers = futures::future::join_all(polls) => answers,
            _ = stop.cancelled() => break,
        };
        let mut now = HashSet::new();
        for (class, module, answer) in answers {
            let labels = (class, module);
            match answer {
                Ok(capacity) => {
                    set(&checks, &labels, &capacity);
                    now.insert(labels);
                }
                Err(error) => {
                    warn!(
                        class = labels.0,
                        module = labels.1,
                        "capacity poll failed: {error}"
                    );
                    checks
                        .metrics
                        .capacity_poll_failures
                        .with_label_values(&[labels.0.as_str(), labels.1.as_str()])
                        .inc();
                }
            }
        }
        for gone in published.difference(&now) {
            remove(&checks, gone);
        }
        published = now;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One `get-capacity` call, timed and counted (`wasm_provisioner_guest_call_*`).
async fn poll(
    checks: &ClassChecks,
    class: &StorageClass,
    module: &wasm_provisioner_runtime::LoadedModule,
) -> Result<BackendCapacity, String> {
    let request = CapacityRequest {
        class: class_of(class).map_err(|e| e.to_string())?,
        node: None,
        context: CallContext::default(),
    };
    let started = std::time::Instant::now();
    let answer = module.get_capacity(&request).await;
    let outcome = match &answer {
        Ok(Ok(_)) => "ok",
        Ok(Err(_)) => "failed",
        Err(error) => error.metric_label(),
    };
    crate::controller::calls::observe(
        &checks.metrics,
        module,
        wasm_provisioner_runtime::Call::GetCapacity,
        started,
        outcome,
    );
    match answer {
        Ok(Ok(capacity)) => Ok(capacity),
        Ok(Err(message)) => Err(format!("the module answered: {message}")),
        Err(error) => Err(error.to_string()),
    }
}

fn set(checks: &ClassChecks, (class, module): &(String, String), capacity: &BackendCapacity) {
    let gauge = |kind: &str| {
        checks
            .metrics
            .backend_capacity
            .with_label_values(&[class.as_str(), module.as_str(), kind])
    };
    debug!(class, module, ?capacity, "capacity polled");
    gauge(KINDS[0]).set(clamp(capacity.total_bytes));
    gauge(KINDS[1]).set(clamp(capacity.available_bytes));
    match capacity.maximum_volume_bytes {
        Some(max) => gauge(KINDS[2]).set(clamp(max)),
        None => {
            let _ = checks.metrics.backend_capacity.remove_label_values(&[
                class.as_str(),
                module.as_str(),
                KINDS[2],
            ]);
        }
    }
}

fn remove(checks: &ClassChecks, (class, module): &(String, String)) {
    for kind in KINDS {
        let _ = checks.metrics.backend_capacity.remove_label_values(&[
            class.as_str(),
            module.as_str(),
            kind,
        ]);
    }
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
