//! Why a reconcile of a claim's expansion did not finish, and how it is retried then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use tracing::warn;

use super::decision::fingerprint;
use crate::controller::Context;
use crate::controller::Failure;
use crate::leader::NotLeader;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::{names, quantity, volume};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("claim {claim}: Kubernetes API: {source}")]
    Api {
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("claim {claim}: its requested size: {source}")]
    Size {
        claim: String,
        #[source]
        source: quantity::Error,
    },
    /// The expansion failed: `cause` is why, as a metric label (`failed`: the module's
    /// answer; `too_small`: it answered less than asked; `no_module`, `no_class`; else
    /// the guest call's failure).
    #[error("claim {claim}: {message}")]
    Expand {
        claim: String,
        cause: &'static str,
        message: String,
    },
    /// The module answered that the expansion cannot succeed as asked.
    #[error("claim {claim}: {message}")]
    Infeasible { claim: String, message: String },
    #[error(transparent)]
    Request(#[from] volume::Error),
    /// The leadership fence closed: nothing more is done; the next leader takes over.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The decision named no final step within its bound of steps: a bug, retried with
    /// back-off.
    #[error(
        "claim {claim}: no expansion decision after {steps} steps (a bug); the last was {last}"
    )]
    Undecided {
        claim: String,
        steps: usize,
        last: String,
    },
}

impl Error {
    /// The metric label of this error (`wasm_provisioner_reconcile_errors_total`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Size { .. } => "invalid_size",
            Error::Expand { cause, .. } => cause,
            Error::Infeasible { .. } => "infeasible",
            Error::Request(error) => error.metric_label(),
            Error::NotLeader(_) => "not_leader",
            Error::Undecided { .. } => "undecided",
        }
    }

    pub(super) fn api(claim: &PersistentVolumeClaim, source: kube::Error) -> Self {
        Error::Api {
            claim: ClaimView(claim).key(),
            source,
        }
    }
}

/// What a held expansion waits on: the size the claim asks for (0 if unreadable).
fn print(claim: &PersistentVolumeClaim) -> u64 {
    let requested = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(names::RESOURCE_STORAGE))
        .and_then(|q| quantity::quantity_bytes(q).ok())
        .unwrap_or(0);
    fingerprint(requested)
}

/// An infeasible expansion waits the slow interval (`--retry-interval-max`), or until
/// the claim asks for another size; every other failure is retried with the claim
/// controller's back-off and given up past `--failed-provision-threshold` (then once per
/// resync period, with one Warning Event). The claim is held for the delay, so the echo
/// of this host's own status write does not bring it back early.
pub fn error_policy(claim: Arc<PersistentVolumeClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&["expansions", error.metric_label()])
        .inc();
    warn!(%error, "expansion did not finish; will retry");
    let key = crate::controller::claims::key(&claim);
    let print = print(&claim);
    let retries = &ctx.expansion_retries;
    match error {
        Error::Infeasible { .. } => {
            let delay = retries.infeasible(&key, &print.to_string());
            retries.hold(&key, print, delay);
            Action::requeue(delay)
        }
        // Not a failure of the expansion: this process is stopping.
        Error::NotLeader(_) => Action::requeue(crate::controller::claims::NOT_LEADER_REQUEUE),
        _ => crate::controller::retry_failed(
            &ctx,
            retries,
            Failure {
                queue: "expansions",
                key: &key,
                fingerprint: print,
                hold: true,
                object: kube::Resource::object_ref(claim.as_ref(), &()),
                reason: names::REASON_VOLUME_RESIZE_FAILED,
            },
            |failures, resync| {
                format!(
                    "gave up expanding after {failures} failed attempts (--failed-provision-threshold); last error: {error}. Retried once every {resync} (--resync-period), or at once when the claim asks for another size"
                )
            },
        ),
    }
}
