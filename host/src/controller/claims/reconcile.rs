//! One reconcile of a claim: the decisions before the plugin is asked to provision.

use super::provision::call_failed;
use super::*;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;

pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.caches_synced().await;
    let key = key(&claim);
    let view = ClaimView(&claim);
    // Only claims for this provisioner: every wasm-provisioner instance uses the same
    // claim finalizer, so another instance's claims (even being deleted) are not ours.
    // A claim of ours not announced yet is provisioned now when nothing else may be its
    // volume (`--provision-before-binder`), or when its provisioning already started
    // (its intent is in our journal).
    let names = [ctx.settings.provisioner_name.as_str()];
    let announced = view.provisioner().is_some_and(|p| names.contains(&p));
    let before_binder =
        !announced && (ctx.journal.contains(&key) || provisions_before_binder(&ctx, &claim));
    if !announced && !before_binder {
        return Ok(resync(&ctx));
    }
    if view.is_deleting() {
        if intent_recorded(&ctx, &claim) {
            return cleanup(&claim, &ctx).await;
        }
        ctx.claim_retries.forget(&key);
        return Ok(Action::await_change());
    }

    // Bound or being bound: whatever we started is published; our finalizer can go,
    // once the binder is done with the claim (its status write is the last of a bind:
    // an edit of ours before it would fail the binder's update with a conflict, and an
    // edit of a Pending claim makes the binder sync it once more). The claim's own
    // status change brings it back here.
    if let Some(volume) = view.bound_volume() {
        if volume == volume_name_for(&claim) && !view.binding_settled() {
            return Ok(Action::await_change());
        }
        release_intent(&ctx, &claim).await?;
        ctx.claim_retries.forget(&key);
        return Ok(resync(&ctx));
    }
    // A claim given up on is tried again once per resync period (the error policy holds
    // it that long), as the Go library's informer resync does; an edit forgives it at once.
    ctx.claim_retries.given_up(&key, fingerprint(&claim));

    let class = match view.class_name() {
        Some(name) => class_cached_or_live(&ctx, &claim, &name).await?,
        None => None,
    };
    if let Some(class) = &class {
        ctx.claim_retries
            .class_changed(&key, &class.resource_version().unwrap_or_default());
    }
    // Waiting out a retry delay (or an ignored answer) while the claim is unchanged.
    if let Some(wait) = ctx.claim_retries.held(&key, fingerprint(&claim)) {
        return Ok(Action::requeue(wait));
    }

    // The module's share of the workers: when it holds all of it, the claim waits in the
    // module's own queue (no failed attempt, no Event), and this worker goes on with
    // other claims. Checked before the live PV read below, so a waiting claim costs no
    // API request. Held until the module's provision call returns (the PV create and
    // the finalizer removal after it need a worker, not the module).
    let share = match enter_share(&ctx, &claim, class.as_deref()) {
        ShareEntry::Entered(permit) => Some(permit),
        ShareEntry::NoModule => None,
        ShareEntry::Wait => return Ok(Action::requeue(shares::RECHECK)),
    };

    // The PV of this claim exists, so provisioning is done: the cache says so, or this
    // process created it a moment ago (the cache may lag our own create, and the
    // binder's edits of the claim that trigger this reconcile come first). No live read:
    // a PV the cache cannot show yet (an earlier leader's, made a moment before the
    // failover) is found by the create's 409 after the module, idempotent by PV name,
    // answered the same volume.
    let pv_name = volume_name_for(&claim);
    let published = match ctx.volume(&pv_name) {
        Some(pv) => decide::existing_pv_is_this_claims(&pv, &claim),
        None => ctx.recent.was_created(&pv_name),
    };
    if published {
        // The binder binds it next; a finalizer goes once it is Bound (above). A journal
        // entry (of an attempt cut short after the PV create) goes now.
        ctx.journal.clear(&key);
        ctx.claim_retries.forget(&key);
        return Ok(resync(&ctx));
    }

    let module = match &class {
        Some(class) if class.provisioner == ctx.settings.provisioner_name => {
            Some(resolve_module(&ctx, &claim, class).await?)
        }
        _ => None,
    };
    let unknown = PluginInfo {
        name: String::new(),
        version: String::new(),
        supports_block: false,
        data_source_kinds: Vec::new(),
    };
    let info = module.as_ref().map_or(&unknown, |m| m.info());
    match decide::should_provision(&claim, class.as_deref(), &names, info, before_binder) {
        ProvisionDecision::Skip(reason) => return skip(&ctx, &claim, reason).await,
        ProvisionDecision::Provision => {}
    }
    let (Some(class), Some(module)) = (class, module) else {
        unreachable!(
            "should_provision only says Provision with a class of ours, whose module resolved"
        );
    };

    // WaitForFirstConsumer: the selected node must still exist, or the scheduler must
    // pick again (claims otherwise stay Pending forever on a vanished node). Unless a
    // provision is under way (its intent is recorded: the module's last answer was "in
    // background", the call failed half-way, or the host died during it): a volume may still be in the making on
    // that node, so the module is asked again with the node's name, and only its final
    // answer (a "reschedule", a failure) sends the claim back to the scheduler.
    let node = match view.selected_node() {
        Some(name) => match node_cached_or_live(&ctx, &claim, name).await? {
            Some(node) => Some(node),
            None if intent_recorded(&ctx, &claim) => {
                info!(claim = %view.key(), node = name, "the selected node is gone, but provisioning is under way; asking the module before rescheduling");
                Some(Arc::new(vanished_node(name)))
            }
            None => {
                let message = format!(
                    "selected node {name:?} does not exist; asking the scheduler to pick another"
                );
                ctx.events
                    .claim_warning(&claim, names::REASON_PROVISIONING_FAILED, message.clone())
                    .await;
                remove_selected_node(&ctx, &claim).await?;
                return Err(Error::Skipped {
                    claim: view.key(),
                    message,
                });
            }
        },
        None => None,
    };

    let request = request::provision_request(&claim, &class, node.as_deref().map(|n| &n.metadata))?;
    match call(
        &ctx,
        &module,
        Call::ShouldProvision,
        module.should_provision(&request),
    )
    .await
    {
        Ok(true) => {}
        Err(source) if source.is_busy() => return Ok(busy(&claim, &source)),
        Err(source) if source.is_pool_full() => {
            return Ok(pool_full::claim(&ctx.events, &claim, &source).await);
        }
        Ok(false) => {
            info!(claim = %view.key(), module = module.name(), "plugin declined the claim (should-provision said no)");
            return Ok(resync(&ctx));
        }
        Err(source) => return Err(call_failed(&ctx, &claim, &class, source).await),
    }

    provision(&ctx, &claim, &class, &module, request, share).await
}

/// Whether a claim may use a worker for its module now.
enum ShareEntry {
    /// A worker of the module's share, held until the reconcile ends.
    Entered(shares::SharePermit<PersistentVolumeClaim>),
    /// No module of ours is loaded for the claim's class: nothing to share.
    NoModule,
    /// The module holds its whole share: the claim waits in the module's queue.
    Wait,
}

fn enter_share(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
) -> ShareEntry {
    let module = class
        .filter(|class| class.provisioner == ctx.settings.provisioner_name)
        .and_then(|class| class.parameters.as_ref()?.get(names::PARAM_MODULE))
        .and_then(|name| ctx.runtime.module(name));
    let Some(module) = module else {
        return ShareEntry::NoModule;
    };
    let object = kube::runtime::reflector::ObjectRef::from_obj(claim);
    match ctx
        .claim_shares
        .try_enter(module.name(), module.limits().max_concurrent_calls, object)
    {
        Some(permit) => ShareEntry::Entered(permit),
        None => {
            tracing::debug!(
                claim = %ClaimView(claim).key(),
                module = module.name(),
                "the module holds its whole share of the workers; the claim waits for one"
            );
            ShareEntry::Wait
        }
    }
}

async fn skip(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    reason: SkipProvision,
) -> Result<Action, Error> {
    if let Some(event_reason) = reason.event_reason() {
        ctx.events
            .claim_warning(claim, event_reason, reason.to_string())
            .await;
    }
    if reason.retry() {
        return Err(Error::Skipped {
            claim: ClaimView(claim).key(),
            message: reason.to_string(),
        });
    }
    Ok(resync(ctx))
}

/// The class's module, honouring `moduleSHA256`. A missing or refused module is a
/// Warning Event and a retry: the admin may be adding it right now. A module still
/// loading (its first version compiling) is neither: the claim waits for it.
pub(super) async fn resolve_module(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Arc<LoadedModule>, Error> {
    let class_name = class.name_any();
    let parameters = class.parameters.as_ref();
    let message = match parameters.and_then(|p| p.get(names::PARAM_MODULE)) {
        None => format!(
            "storage class {class_name:?} has no {:?} parameter; set it to the name of a module in the modules directory",
            names::PARAM_MODULE
        ),
        Some(module) => {
            let resolved = wasm_provisioner_runtime::class_pin(module, parameters)
                .and_then(|pinned| ctx.runtime.resolve(module, pinned));
            match resolved {
                Ok(loaded) => return Ok(loaded),
                Err(error) if error.is_loading() => {
                    return Err(Error::ModuleLoading {
                        claim: ClaimView(claim).key(),
                        message: format!("storage class {class_name:?}: {error}"),
                    });
                }
                Err(error) => format!("storage class {class_name:?}: {error}"),
            }
        }
    };
    ctx.events
        .claim_warning(claim, names::REASON_PROVISIONING_FAILED, message.clone())
        .await;
    Err(Error::Module {
        claim: ClaimView(claim).key(),
        message,
    })
}

/// The claim's class from the cache; a miss is confirmed with a live read before the
/// class counts as missing: the binder announced the claim to us because it saw the
/// class, and our class watch may be a moment behind it (a class created just before
/// its claims), which would otherwise be a false "not found" Warning Event and a
/// failed attempt.
async fn class_cached_or_live(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    name: &str,
) -> Result<Option<Arc<StorageClass>>, Error> {
    if let Some(class) = ctx.class(name) {
        return Ok(Some(class));
    }
    Api::<StorageClass>::all(ctx.client.clone())
        .get_opt(name)
        .await
        .map(|class| class.map(Arc::new))
        .map_err(|e| Error::api(claim, e))
}

/// The selected node from the cache; a miss is confirmed with a live read before the
/// node counts as gone (a node created a moment ago may not be in the cache yet, and
/// rescheduling is not undone).
async fn node_cached_or_live(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    name: &str,
) -> Result<Option<Arc<PartialObjectMeta<Node>>>, Error> {
    if let Some(node) = ctx.node(name) {
        return Ok(Some(node));
    }
    Api::<Node>::all(ctx.client.clone())
        .get_metadata_opt(name)
        .await
        .map(|node| node.map(Arc::new))
        .map_err(|e| Error::api(claim, e))
}

/// A node that is gone, as far as a provision request can tell: its name only.
fn vanished_node(name: &str) -> PartialObjectMeta<Node> {
    PartialObjectMeta {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Whether `claim`, which the binder has not announced to any provisioner yet, is
/// provisioned now: `--provision-before-binder` is on, the claim names no volume and no
/// selector, its class (as cached) is ours, and no existing PV may be its (an unclaimed
/// PV of its class, or one whose claimRef names it: those are the binder's to bind, so
/// the claim waits for the binder's announcement, as every claim does with the Go
/// library). The binder, finding the claim's PV when it first looks, then binds at once
/// instead of announcing the claim first (its claim update and Event).
fn provisions_before_binder(ctx: &Context, claim: &PersistentVolumeClaim) -> bool {
    let view = ClaimView(claim);
    if !ctx.settings.provision_before_binder || view.provisioner().is_some() {
        return false;
    }
    let spec = claim.spec.as_ref();
    if spec.is_some_and(|s| {
        s.selector.is_some() || s.volume_name.as_deref().is_some_and(|v| !v.is_empty())
    }) {
        return false;
    }
    let Some(class) = view.class_name() else {
        return false;
    };
    ctx.class(&class)
        .is_some_and(|c| c.provisioner == ctx.settings.provisioner_name)
        && !ctx.static_volumes.may_bind(claim, &class)
}
