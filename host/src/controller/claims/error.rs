//! Why a reconcile of a claim did not finish, and how the claim is retried then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use tracing::{debug, warn};

use super::decision::fingerprint;
use super::key::key;
use crate::controller::journal::JournalError;
use crate::controller::retry::Next;
use crate::controller::{Context, shares};
use crate::leader::NotLeader;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::{names, request, volume};
use wasm_provisioner_runtime::CallError;

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
    /// The decision named no final step within its bound of steps: a bug, retried with
    /// back-off.
    #[error("claim {claim}: no decision after {steps} steps (a bug); the last was {last}")]
    Undecided {
        claim: String,
        steps: usize,
        last: String,
    },
}

impl Error {
    pub(super) fn journal(claim: &PersistentVolumeClaim, error: JournalError) -> Self {
        match error {
            JournalError::NotLeader(fenced) => Error::NotLeader(fenced),
            error @ JournalError::Write { .. } => Error::Journal {
                claim: ClaimView(claim).key(),
                message: error.to_string(),
            },
        }
    }

    pub(super) fn api(claim: &PersistentVolumeClaim, source: kube::Error) -> Self {
        Error::Api {
            claim: ClaimView(claim).key(),
            source,
        }
    }
}

/// When a reconcile stopped by the leadership fence is tried again (by then the process
/// has usually exited).
pub(in crate::controller) const NOT_LEADER_REQUEUE: std::time::Duration =
    std::time::Duration::from_secs(2);

/// How a claim whose reconcile failed is retried: a module still loading is looked at
/// again soon; an infeasible answer waits the slow interval (`--retry-interval-max`);
/// a cleanup is retried with back-off for ever; every other failure counts towards
/// giving up. The claim is held for the delay, so an update that changes nothing the
/// decision reads does not bring it back early.
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
                crate::controller::give_up(
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
