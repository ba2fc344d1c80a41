//! Why a reconcile of a volume did not finish, and how the volume is retried then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::warn;

use super::key::key;
use crate::controller::Context;
use crate::controller::Failure;
use crate::leader::NotLeader;
use wasm_provisioner_rules::{names, volume};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume {volume}: Kubernetes API: {source}")]
    Api {
        volume: String,
        #[source]
        source: kube::Error,
    },
    /// The delete failed: `cause` is why, as a metric label (`failed`: the module's
    /// answer; `no_module`; else the guest call's failure).
    #[error("volume {volume}: {message}")]
    Delete {
        volume: String,
        cause: &'static str,
        message: String,
    },
    #[error(transparent)]
    Request(#[from] volume::Error),
    /// The leadership fence closed: nothing more is done; the next leader takes over.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The decision named no final step within its bound of steps: a bug, retried with
    /// back-off.
    #[error("volume {volume}: no decision after {steps} steps (a bug); the last was {last}")]
    Undecided {
        volume: String,
        steps: usize,
        last: String,
    },
}

impl Error {
    /// The metric label of this error (`wasm_provisioner_reconcile_errors_total`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Delete { cause, .. } => cause,
            Error::Request(error) => error.metric_label(),
            Error::NotLeader(_) => "not_leader",
            Error::Undecided { .. } => "undecided",
        }
    }

    pub(super) fn api(pv: &PersistentVolume, source: kube::Error) -> Self {
        Error::Api {
            volume: pv.name_any(),
            source,
        }
    }
}

/// A failed delete is retried with back-off and given up past
/// `--failed-delete-threshold` (then once per resync period, with one Warning Event).
pub fn error_policy(pv: Arc<PersistentVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&["volumes", error.metric_label()])
        .inc();
    warn!(%error, "deleting did not finish; will retry");
    if let Error::NotLeader(_) = error {
        return Action::requeue(crate::controller::claims::NOT_LEADER_REQUEUE);
    }
    crate::controller::retry_failed(
        &ctx,
        &ctx.volume_retries,
        Failure {
            queue: "volumes",
            key: &key(&pv),
            fingerprint: 0,
            hold: false,
            object: kube::Resource::object_ref(pv.as_ref(), &()),
            reason: names::REASON_VOLUME_FAILED_DELETE,
        },
        |failures, resync| {
            format!(
                "gave up after {failures} failed attempts (--failed-delete-threshold); last error: {error}. The volume is kept and its deletion retried once every {resync} (--resync-period); fix the cause, or delete the backend volume manually"
            )
        },
    )
}
