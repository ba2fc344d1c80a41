//! Provisioning: the intent first (the journal), the guest call, then publishing the
//! PV, or discarding the backend volume when it cannot be published.

use super::*;

/// A host-side failure of a guest call (trap, timeout, ...): the backend may hold a
/// half-made volume, so the intent stays (on the claim), like in-background.
pub(super) async fn call_failed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    source: CallError,
) -> Error {
    let note = format!(
        "failed to provision volume with StorageClass {:?}: {source}",
        class.name_any()
    );
    attempt_failed(ctx, claim, class, note).await;
    Error::Call {
        claim: ClaimView(claim).key(),
        source,
    }
}

pub(super) async fn provision(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    request: ProvisionRequest,
    share: Option<shares::SharePermit<PersistentVolumeClaim>>,
) -> Result<Action, Error> {
    let claim_key = ClaimView(claim).key();
    let gauge = ctx.metrics.in_flight.with_label_values(&["provision"]);
    let _in_flight = InFlight::start(&gauge);
    let _storm = ctx.storm.provisioning();

    // Persist the intent before the backend is touched: in the journal, unless it is on
    // the claim already (our finalizer, from an earlier attempt).
    let Some(_hold) = ctx.journal.hold(&key(claim)) else {
        // The journal's sweep is cleaning up an earlier attempt's entry of this claim.
        return Ok(Action::requeue(shares::RECHECK));
    };
    let mut fresh = None;
    if !ClaimView(claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        let journaled = ctx
            .journal
            .record(claim)
            .await
            .map_err(|error| Error::journal(claim, error))?;
        if journaled {
            ctx.settings.faults.after(Step::JournalRecord, &claim_key);
        } else {
            // Too large for the journal: the intent goes on the claim (the slow path).
            // From here on `claim` is the fresh object, so later finalizer edits see
            // our finalizer.
            let Some(added) = add_claim_finalizer(ctx, claim).await? else {
                info!(claim = %claim_key, "the claim is gone or being deleted; not provisioning");
                return Ok(Action::await_change());
            };
            ctx.settings.faults.after(Step::FinalizerAdd, &claim_key);
            fresh = Some(added);
        }
    }
    let claim = fresh.as_ref().unwrap_or(claim);
    ctx.events
        .claim_normal(
            claim,
            names::REASON_PROVISIONING,
            format!("External provisioner is provisioning volume for claim {claim_key:?}"),
        )
        .await;

    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest provision call", module.provision(&request))
        .await?;
    // The module answered: its share of the workers goes to its next claim.
    drop(share);
    observe_call(
        ctx,
        module,
        Call::Provision,
        started,
        provision_outcome(&answer),
    );

    let volume = match answer {
        // The module did nothing; retried shortly.
        Err(source) if source.is_busy() => {
            ctx.journal.clear(&key(claim));
            return Ok(busy(claim, &source));
        }
        Err(source) if source.is_pool_full() => {
            ctx.journal.clear(&key(claim));
            return Ok(pool_full::claim(&ctx.events, claim, &source).await);
        }
        Err(source) => {
            keep_intent(ctx, claim).await?;
            return Err(call_failed(ctx, claim, class, source).await);
        }
        Ok(Err(error)) => return provision_refused(ctx, claim, class, module, error).await,
        Ok(Ok(volume)) => volume,
    };

    ctx.settings.faults.after(Step::GuestProvision, &claim_key);

    publish(ctx, claim, class, module, &request, volume, started).await
}

/// The plugin answered an error variant: each outcome as the successor library does.
async fn provision_refused(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    error: ProvisionError,
) -> Result<Action, Error> {
    let claim_key = ClaimView(claim).key();
    let outcome = provision_error_label(&error);
    let (ProvisionError::Ignored(message)
    | ProvisionError::Failed(message)
    | ProvisionError::InBackground(message)
    | ProvisionError::Reschedule(message)
    | ProvisionError::Infeasible(message)) = &error;
    let message = message.clone();

    if let ProvisionError::Ignored(_) = error {
        // "Not mine": no Warning, no retry; nothing was made.
        info!(claim = %claim_key, module = module.name(), %message, "plugin ignored the claim");
        ctx.claim_retries
            .hold(&key(claim), fingerprint(claim), ctx.settings.resync_period);
        release_intent(ctx, claim).await?;
        return Ok(resync(ctx));
    }

    let note = format!(
        "failed to provision volume with StorageClass {:?}: {message}",
        class.name_any()
    );
    attempt_failed(ctx, claim, class, note).await;
    match error {
        // The backend may still be working: the intent stays (on the claim), retry.
        ProvisionError::InBackground(_) => keep_intent(ctx, claim).await?,
        ProvisionError::Reschedule(_) => {
            release_intent(ctx, claim).await?;
            remove_selected_node(ctx, claim).await?;
        }
        ProvisionError::Infeasible(_) => {
            release_intent(ctx, claim).await?;
            return Err(Error::Infeasible {
                claim: claim_key,
                module: module.name().to_string(),
                message,
                class_version: class.resource_version().unwrap_or_default(),
            });
        }
        _ => release_intent(ctx, claim).await?,
    }
    Err(Error::Outcome {
        claim: claim_key,
        module: module.name().to_string(),
        outcome,
        message,
    })
}

/// Turns the plugin's volume into a PV, checks its source against the module's volume
/// grants and saves it. An answer that cannot be published (invalid, or a source the
/// module may not publish) or a PV that cannot be saved is discarded: the backend volume
/// is deleted through the module and nothing is published.
async fn publish(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    module: &LoadedModule,
    request: &ProvisionRequest,
    volume: Volume,
    started: Instant,
) -> Result<Action, Error> {
    let claim_key = ClaimView(claim).key();
    let unpublished = volume::unpublished_delete_request(request, &volume);
    let published = wasm_provisioner_runtime::publishable_volume(
        request,
        claim,
        class,
        volume,
        &ctx.settings.provisioner_name,
        ctx.settings.volume_protection_finalizer,
        module,
    )
    .await;
    let pv = match published {
        Ok(pv) => pv,
        Err(error) => {
            let message = error.to_string();
            warn!(claim = %claim_key, module = module.name(), "{message}");
            provision_failed_metric(ctx, claim, class);
            return discard(ctx, claim, module, &unpublished, message).await;
        }
    };

    match save_volume(ctx, claim, &pv).await {
        Saved::Yes => {
            ctx.settings.faults.after(Step::PvCreate, &claim_key);
            let labels = metric_labels(claim, class);
            let labels = [labels[0].as_str(), labels[1].as_str()];
            ctx.metrics.provision_total.with_label_values(&labels).inc();
            ctx.metrics
                .provision_duration
                .with_label_values(&labels)
                .observe(started.elapsed().as_secs_f64());
            if let Some(created) = &claim.metadata.creation_timestamp {
                let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
                ctx.metrics
                    .claim_to_volume
                    .with_label_values(&[labels[0]])
                    .observe(waited.as_secs_f64().max(0.0));
            }
            info!(claim = %claim_key, volume = pv.name_any(), module = module.name(), "provisioned");
            ctx.events
                .claim_normal(
                    claim,
                    names::REASON_PROVISIONING_SUCCEEDED,
                    format!("Successfully provisioned volume {}", pv.name_any()),
                )
                .await;
            // The PV holds the backend volume from here on: the journal entry goes
            // (with the journal's next write, not waited for). A finalizer of an
            // earlier attempt stays until the binder has bound the claim to this PV
            // (the claim's next reconcile): removed now, it would race the binder's
            // update of the claim and make it sync the Pending claim once more; a
            // claim deleted meanwhile only loses the finalizer (`cleanup`).
            ctx.journal.clear(&key(claim));
            ctx.claim_retries.forget(&key(claim));
            Ok(resync(ctx))
        }
        Saved::NotLeader(fenced) => Err(fenced.into()),
        Saved::Conflict(message) => {
            // A PV of this name exists but is not this claim's live volume (one on its
            // way out): that PV's deletion owns the backend volume of the same name.
            keep_intent(ctx, claim).await?;
            attempt_failed(ctx, claim, class, message.clone()).await;
            Err(Error::Save {
                claim: claim_key,
                message,
            })
        }
        Saved::No(message) => {
            provision_failed_metric(ctx, claim, class);
            let delete = volume::delete_request(&pv, Some(class))?;
            discard(ctx, claim, module, &delete, message).await
        }
    }
}

/// Deletes, through the module, a backend volume that was made but not published, so
/// nothing is left behind; then provisioning is retried with back-off. If the delete
/// fails, the intent moves onto the claim as its finalizer (the volume exists) and the
/// cleanup is retried.
async fn discard(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    module: &LoadedModule,
    delete: &DeleteRequest,
    message: String,
) -> Result<Action, Error> {
    let claim_key = ClaimView(claim).key();
    let started = Instant::now();
    let answer = ctx
        .leadership
        .fenced("guest delete call", module.delete(delete))
        .await?;
    observe_call(ctx, module, Call::Delete, started, delete_outcome(&answer));
    let cause = match answer {
        Ok(Ok(())) => {
            ctx.settings.faults.after(Step::GuestDelete, &claim_key);
            ctx.events
                .claim_warning(
                    claim,
                    names::REASON_PROVISIONING_FAILED,
                    format!(
                        "{message}; the backend volume was deleted and provisioning will be retried"
                    ),
                )
                .await;
            release_intent(ctx, claim).await?;
            return Err(Error::Save {
                claim: claim_key,
                message,
            });
        }
        Ok(Err(error)) => format!("{error:?}"),
        Err(error) => error.to_string(),
    };
    keep_intent(ctx, claim).await?;
    ctx.events
        .claim_warning(
            claim,
            names::REASON_PROVISIONING_CLEANUP_FAILED,
            format!(
                "{message}; deleting the backend volume {} failed too: {cause}. It will be retried while the claim exists; if you delete the claim, please delete the volume manually",
                delete.volume.name
            ),
        )
        .await;
    Err(Error::Save {
        claim: claim_key,
        message: format!("{message}; cleanup failed: {cause}"),
    })
}

enum Saved {
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
