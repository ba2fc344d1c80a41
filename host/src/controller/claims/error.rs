//! Why a reconcile of a claim did not finish, and how the claim is retried then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use tracing::{debug, warn};

use super::decision::fingerprint;
use super::key::key;
use crate::controller::Failure;
use crate::controller::journal::JournalError;
use crate::controller::secrets::SecretError;
use crate::controller::{Context, shares};
use crate::leader::NotLeader;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide::SkipProvision;
use wasm_provisioner_rules::{names, request, volume};
use wasm_provisioner_runtime::CallError;

use super::attempt::ModuleProblem;

/// Why one reconcile of a claim did not finish; the error policy turns it into a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("claim {claim}: Kubernetes API: {source}")]
    Api {
        claim: String,
        #[source]
        source: kube::Error,
    },
    /// The rules said not to provision now (and to retry).
    #[error("claim {claim}: {reason}")]
    Skipped {
        claim: String,
        reason: SkipProvision,
    },
    /// The selected node is gone; the scheduler was asked to pick another.
    #[error("claim {claim}: {message}")]
    NodeGone { claim: String, message: String },
    #[error("claim {claim}: {problem}")]
    Module {
        claim: String,
        problem: ModuleProblem,
    },
    /// The class's module is still loading (compiling): not a failed attempt, no Event;
    /// the claim waits for it.
    #[error("claim {claim}: {problem}")]
    ModuleLoading {
        claim: String,
        problem: ModuleProblem,
    },
    #[error(transparent)]
    Request(#[from] request::Error),
    /// The class names a Secret the module cannot have (not granted, missing, unreadable).
    #[error("claim {claim}: {source}")]
    Secret {
        claim: String,
        #[source]
        source: SecretError,
    },
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
    /// The class's module rejects the class (or could not validate it), under these
    /// versions of the class and the module.
    #[error("claim {claim}: {message}")]
    ClassRejected {
        claim: String,
        message: String,
        class_version: String,
        module_sha256: String,
    },
    /// The module's volume could not be published; it was deleted (`cleaned_up`), or
    /// deleting it failed too and the claim keeps the intent.
    #[error("claim {claim}: {message}")]
    Unpublished {
        claim: String,
        message: String,
        cleaned_up: bool,
    },
    /// A PV of the volume's name exists but is not this claim's live volume.
    #[error("claim {claim}: {message}")]
    PvConflict { claim: String, message: String },
    /// The claim is being deleted with provisioning in flight; retried until the
    /// backend is clean, never given up on.
    #[error("claim {claim} is being deleted; cleaning up its backend volume: {message}")]
    Cleanup { claim: String, message: String },
    /// The provisioning journal could not store the intent: nothing was provisioned.
    #[error("claim {claim}: {source}")]
    Journal {
        claim: String,
        #[source]
        source: JournalError,
    },
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
            source @ JournalError::Write { .. } => Error::Journal {
                claim: ClaimView(claim).key(),
                source,
            },
        }
    }

    /// The metric label of this error (`wasm_provisioner_reconcile_errors_total`): one
    /// per kind, the cause's own where it has one.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Skipped { .. } => "skipped",
            Error::NodeGone { .. } => "selected_node_gone",
            Error::Module { problem, .. } | Error::ModuleLoading { problem, .. } => {
                problem.metric_label()
            }
            Error::Request(error) => error.metric_label(),
            Error::Secret { source, .. } => source.metric_label(),
            Error::Volume(error) => error.metric_label(),
            Error::Call { source, .. } => source.metric_label(),
            Error::Outcome { outcome, .. } => outcome,
            Error::Infeasible { .. } => "infeasible",
            Error::ClassRejected { .. } => "class_rejected",
            Error::Unpublished {
                cleaned_up: true, ..
            } => "unpublishable",
            Error::Unpublished { .. } => "unpublishable_cleanup_failed",
            Error::PvConflict { .. } => "pv_conflict",
            Error::Cleanup { .. } => "cleanup",
            Error::Journal { .. } => "journal",
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
    ctx.metrics
        .reconcile_errors
        .with_label_values(&["claims", error.metric_label()])
        .inc();
    warn!(%error, "provisioning did not finish; will retry");
    let print = fingerprint(&claim);
    match error {
        Error::Infeasible { class_version, .. } => {
            let delay = ctx.claim_retries.infeasible(&key, class_version);
            ctx.claim_retries.hold(&key, print, delay);
            Action::requeue(delay)
        }
        Error::ClassRejected {
            class_version,
            module_sha256,
            ..
        } => {
            let delay = ctx
                .claim_retries
                .rejected(&key, class_version, module_sha256);
            ctx.claim_retries.hold(&key, print, delay);
            Action::requeue(delay)
        }
        Error::Cleanup { .. } => Action::requeue(ctx.claim_retries.failed_forever(&key)),
        // Not a failure of the claim: this process is stopping.
        Error::NotLeader(_) => Action::requeue(NOT_LEADER_REQUEUE),
        _ => crate::controller::retry_failed(
            &ctx,
            &ctx.claim_retries,
            Failure {
                queue: "claims",
                key: &key,
                fingerprint: print,
                hold: true,
                object: kube::Resource::object_ref(claim.as_ref(), &()),
                reason: names::REASON_PROVISIONING_FAILED,
            },
            |failures, resync| {
                format!(
                    "gave up after {failures} failed attempts (--failed-provision-threshold); last error: {error}. Retried once every {resync} (--resync-period), or at once when the claim is edited"
                )
            },
        ),
    }
}
