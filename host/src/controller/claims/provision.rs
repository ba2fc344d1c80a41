//! Provisioning's steps that learn something: the module's `should-provision`, the
//! intent recorded (the journal, else the claim) before the backend is touched, the
//! `provision` call, the PV made of its answer and saved, or the volume discarded
//! through the module when it cannot be published.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::attempt::Attempt;
use super::decision::{DiscardOf, JournalHold, Publishing, Recorded};
use super::error::Error;
use super::finalizer;
use super::lookup::vanished_node;
use super::tell;
use crate::controller::Context;
use crate::controller::calls::{InFlight, call, delete_outcome, fenced_provision, observe_call};
use crate::controller::faults::Step;
use crate::controller::secrets;
use crate::leader::NotLeader;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide;
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::{request, volume};
use wasm_provisioner_runtime::{Call, LoadedModule};

/// The class and module of a claim the decision let through its rules.
fn class_and_module(attempt: &Attempt<'_>) -> (Arc<StorageClass>, Arc<LoadedModule>) {
    let class = attempt.class().cloned();
    let module = attempt.loaded_module().cloned();
    class
        .zip(module)
        .expect("the decision provisions only a claim of a class of ours whose module resolved")
}

/// Asks the module's `should-provision`, with the request `provision` gets too. A
/// selected node that is gone (`node_vanished`: a provision is under way) is handed
/// over by its name only.
pub(super) async fn ask_should_provision(
    attempt: &mut Attempt<'_>,
    node_vanished: bool,
) -> Result<(), Error> {
    let (class, module) = class_and_module(attempt);
    let node = match (node_vanished, ClaimView(attempt.claim()).selected_node()) {
        (true, Some(name)) => {
            info!(claim = %attempt.claim_key(), node = name, "the selected node is gone, but provisioning is under way; asking the module before rescheduling");
            Some(Arc::new(vanished_node(name)))
        }
        _ => attempt.node.as_ref().found().cloned(),
    };
    let mut request = request::provision_request(
        attempt.claim(),
        &class,
        node.as_deref().map(|n| &n.metadata),
    )?;
    let ctx = attempt.ctx;
    attempt.expected_record = Some(ctx.journal.expect(&attempt.key));
    request.context = ctx
        .backends
        .context(ClaimView(attempt.claim()).selected_node());
    let secret = secrets::for_claim(ctx, &module, &class, attempt.claim(), &request.volume_name);
    request.secret = match secret.await {
        Ok(secret) => secret,
        Err(source) => {
            ctx.events
                .claim_warning(
                    attempt.claim(),
                    names::REASON_PROVISIONING_FAILED,
                    source.to_string(),
                )
                .await;
            return Err(Error::Secret {
                claim: attempt.claim_key(),
                source,
            });
        }
    };
    let answer = call(
        ctx,
        &module,
        Call::ShouldProvision,
        ctx.backends.should_provision(&module, &request),
    )
    .await;
    attempt.request = Some(request);
    attempt.should_provision = Some(answer);
    Ok(())
}

/// Provisioning starts: counted in flight, a storm on (Normal Events wait), and the
/// claim's journal entry held so the sweep leaves it alone.
pub(super) fn begin(attempt: &mut Attempt<'_>) {
    let ctx = attempt.ctx;
    attempt.in_flight = Some(InFlight::start(ctx, "provision"));
    attempt.storm = Some(ctx.storm.provisioning());
    attempt.journal_hold = ctx.journal.hold(&attempt.key);
    attempt.journal = if attempt.journal_hold.is_some() {
        JournalHold::Taken
    } else {
        JournalHold::Refused
    };
}

/// Persists the intent in the journal; returns once the journal in the API holds it.
pub(super) async fn record_in_journal(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let journaled = ctx
        .journal
        .record(attempt.claim())
        .await
        .map_err(|error| Error::journal(attempt.claim(), error))?;
    attempt.expected_record = None;
    attempt.recorded = if journaled {
        ctx.settings
            .faults
            .after(Step::JournalRecord, &attempt.claim_key());
        Recorded::InJournal
    } else {
        Recorded::TooLargeForJournal
    };
    Ok(())
}

/// Persists the intent on the claim (our finalizer). From here on the reconcile sees
/// the claim as the write left it, so later finalizer edits see our finalizer.
pub(super) async fn record_on_claim(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    match finalizer::add(ctx, attempt.claim()).await? {
        Some(added) => {
            ctx.settings
                .faults
                .after(Step::FinalizerAdd, &attempt.claim_key());
            attempt.fresh = Some(added);
            attempt.recorded = Recorded::OnClaim;
        }
        None => attempt.recorded = Recorded::ClaimGone,
    }
    Ok(())
}

/// Tells the claim it is being provisioned and asks the module; its worker goes to the
/// module's next claim once it answered.
pub(super) async fn provision(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let (_, module) = class_and_module(attempt);
    let request = attempt
        .request
        .clone()
        .expect("the module was asked should-provision with this request");
    ctx.events
        .claim_normal(
            attempt.claim(),
            names::REASON_PROVISIONING,
            format!(
                "External provisioner is provisioning volume for claim {:?}",
                attempt.claim_key()
            ),
        )
        .await;
    let (started, answer) =
        fenced_provision(ctx, &module, &request, "guest provision call").await?;
    attempt.share_permit = None;
    attempt.started = Some(started);
    attempt.answer = Some(answer);
    Ok(())
}

/// Turns the module's volume into a PV and checks its source against the module's
/// volume grants.
pub(super) async fn check_volume(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let ctx = attempt.ctx;
    ctx.settings
        .faults
        .after(Step::GuestProvision, &attempt.claim_key());
    let (class, module) = class_and_module(attempt);
    let (Some(request), Some(Ok(Ok(volume)))) = (&attempt.request, &attempt.answer) else {
        unreachable!("the decision checks only a volume the module answered");
    };
    attempt.delete_request = Some(volume::unpublished_delete_request(request, volume));
    let built = wasm_provisioner_runtime::volume_to_publish(
        request,
        attempt.claim(),
        &class,
        volume.clone(),
        &ctx.settings.provisioner_name,
        ctx.settings.volume_protection_finalizer,
        &module,
    );
    let checked = match built {
        Ok((mut pv, module_mount_options)) => {
            if ctx.backends.node_local_mode()
                && let Some(node) = &request.context.node
            {
                pv.annotations_mut()
                    .insert(names::ANN_NODE.to_string(), node.clone());
            }
            // On the volume's node: its grants, its directory.
            ctx.backends
                .check_publishable(
                    &module,
                    &request.context,
                    &request.volume_name,
                    &pv,
                    &module_mount_options,
                )
                .await
                .map(|()| pv)
        }
        Err(error) => Err(error.to_string()),
    };
    match checked {
        Ok(pv) => {
            attempt.pv = Some(pv);
            attempt.publishing = Publishing::Publishable;
        }
        Err(error) => {
            attempt.unpublished_because = Some(error);
            attempt.publishing = Publishing::Unpublishable;
        }
    }
    Ok(())
}

/// Creates the PV.
pub(super) async fn save(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let pv = attempt
        .pv
        .as_ref()
        .expect("the decision saves a checked PV");
    attempt.publishing = match save_volume(attempt.ctx, attempt.claim(), pv).await {
        Saved::Yes => Publishing::Saved,
        Saved::NotLeader(fenced) => return Err(fenced.into()),
        Saved::Conflict(message) => {
            attempt.unpublished_because = Some(message);
            Publishing::Conflict
        }
        Saved::No(message) => {
            attempt.unpublished_because = Some(message);
            Publishing::NotSaved
        }
    };
    Ok(())
}

/// Deletes, through the module, a backend volume that was made but cannot be
/// published, so nothing is left behind: a failed attempt.
pub(super) async fn discard(attempt: &mut Attempt<'_>, of: DiscardOf) -> Result<(), Error> {
    let ctx = attempt.ctx;
    let (class, module) = class_and_module(attempt);
    tell::failed_metric(ctx, attempt.claim(), &class);
    match of {
        DiscardOf::Answer => {
            let message = attempt.unpublished_because.as_deref().unwrap_or_default();
            warn!(claim = %attempt.claim_key(), module = module.name(), "{message}");
        }
        DiscardOf::Volume => {
            let pv = attempt
                .pv
                .as_ref()
                .expect("the decision discards a PV it checked");
            let mut delete = volume::delete_request(pv, Some(&class))?;
            delete.secret = attempt.request.as_ref().and_then(|r| r.secret.clone());
            // The volume is on the node it was made on.
            delete.context = attempt
                .request
                .as_ref()
                .map(|request| request.context.clone())
                .unwrap_or_default();
            attempt.delete_request = Some(delete);
        }
    }
    let delete = attempt
        .delete_request
        .as_ref()
        .expect("a checked volume has its delete request");
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest delete call", ctx.backends.delete(&module, delete))
        .await?;
    observe_call(ctx, &module, Call::Delete, started, delete_outcome(&answer));
    attempt.deleted = Some(answer);
    Ok(())
}

pub(super) enum Saved {
    Yes,
    /// The leadership fence closed: not saved, and nothing may be deleted by us.
    NotLeader(NotLeader),
    /// Not saved, and the backend volume must not be deleted by us.
    Conflict(String),
    /// Not saved after every try: the backend volume should be deleted.
    No(String),
}

/// Creates the PV, `pv_save_retries` tries `pv_save_interval` apart. `AlreadyExists`
/// counts as success only when the existing PV is this claim's live volume (kubernetes-csi/external-provisioner #1469).
async fn save_volume(ctx: &Context, claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Saved {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = pv.name_any();
    let tries = ctx.settings.pv_save_retries.max(1);
    let mut last_error = String::new();
    for attempt in 1..=tries {
        let created = ctx
            .leadership
            .fenced("PV create", api.create(&PostParams::default(), pv))
            .await;
        let created = match created {
            Ok(created) => created,
            Err(fenced) => return Saved::NotLeader(fenced),
        };
        match created {
            Ok(_) => {
                ctx.recent.created(&name);
                return Saved::Yes;
            }
            // Only here a read: whose is the PV of this name?
            Err(kube::Error::Api(status)) if status.code == 409 => match api.get_opt(&name).await {
                Ok(Some(existing)) if decide::existing_pv_is_this_claims(&existing, claim) => {
                    ctx.recent.created(&name);
                    return Saved::Yes;
                }
                Ok(Some(_)) => {
                    return Saved::Conflict(format!(
                        "volume {name} already exists and is not this claim's live volume (it belongs to another claim or is being deleted); will retry once it is gone"
                    ));
                }
                Ok(None) => last_error = format!("volume {name} existed but vanished; retrying"),
                Err(error) => last_error = error.to_string(),
            },
            Err(error) => last_error = error.to_string(),
        }
        warn!(volume = %name, attempt, tries, error = %last_error, "could not save the PV");
        if attempt < tries {
            tokio::time::sleep(ctx.settings.pv_save_interval).await;
        }
    }
    // A last look before the caller deletes the backend volume: a create that timed out
    // may still have been stored, and a live PV must never sit on a deleted volume.
    if let Ok(Some(existing)) = api.get_opt(&name).await
        && decide::existing_pv_is_this_claims(&existing, claim)
    {
        ctx.recent.created(&name);
        return Saved::Yes;
    }
    Saved::No(format!(
        "could not save volume {name} after {tries} tries: {last_error}"
    ))
}
