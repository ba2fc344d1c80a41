//! The claim controller: turns each claim of our classes into a PV through its class's
//! plugin.
//!
//! It decides, then acts: each reconcile observes what the caches and this process know
//! of the claim ([`attempt`]), asks the pure [`decision`] for the next step, performs it
//! ([`act`]) and, for a step that learns something (a lookup, a guest call, a write
//! whose outcome matters), decides again, until a step ends the reconcile.
//!
//! No backend volume is ever orphaned. Before the plugin is first asked to provision,
//! the intent is persisted in the API, not in memory ([`intent`]): in the provisioning
//! journal (no claim write), and, once an attempt ends with something possibly left in
//! the backend that no PV owns (in-background, a trap, a PV that could not be saved), on
//! the claim as our finalizer ([`finalizer`]). The intent goes only once the claim's PV
//! exists (the PV then owns the backend volume) or once nothing is left in the backend.
//! A process killed between the plugin's answer and the PV create finds the intent
//! again on restart: if the claim still exists the plugin (idempotent by PV name)
//! answers the same volume and the PV is created; if the claim was deleted meanwhile,
//! the [`cleanup`] (from [`sweep_journal`] for a claim gone from the API) asks the plugin
//! for the volume once more and deletes it.
//!
//! When the PV cannot be saved after `pv_save_retries` tries, the backend volume is
//! deleted (the Go library's choice, docs/design.md), with ProvisioningCleanupFailed
//! when that fails too; the finalizer stays until the delete succeeds, so the claim
//! cannot leave a volume behind.
//!
//! - [`decision`]: the whole decision table, pure;
//! - [`reconcile`]: the loop of one reconcile; [`act`]: a step performed, by
//!   [`lookup`], [`provision`], [`outcome`], [`finish`] or [`cleanup`];
//! - [`error`]: why a reconcile did not finish, and how the claim is retried;
//! - [`key`], [`intent`], [`finalizer`], [`reschedule`], [`tell`]: the claim's queue
//!   key, its intent, our finalizer on it, its selected node, a failed attempt told.

mod act;
mod attempt;
mod cleanup;
pub mod decision;
mod error;
mod finalizer;
mod finish;
mod intent;
mod key;
mod lookup;
mod outcome;
mod provision;
mod reconcile;
mod reschedule;
mod tell;

pub use cleanup::sweep_journal;
pub(super) use error::NOT_LEADER_REQUEUE;
pub use error::{Error, error_policy};
pub(super) use key::key;
pub use reconcile::reconcile;

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tokio_util::sync::CancellationToken;

use super::{Context, Feed};

/// Runs the claim controller over `feed` until `shutdown`, then lets its in-flight
/// reconciles finish.
pub async fn start(
    ctx: Arc<Context>,
    feed: Feed<PersistentVolumeClaim>,
    shutdown: CancellationToken,
) {
    super::run_controller(
        "claim",
        ctx.clone(),
        ctx.claims.clone(),
        feed,
        shutdown,
        reconcile,
        error_policy,
    )
    .await;
}
