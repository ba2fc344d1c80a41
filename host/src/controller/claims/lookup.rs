//! The steps that look something up for the decision: the class or the selected node
//! when the cache misses them, the class's module, a worker of the module's share, and
//! the retry state's own bookkeeping.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::attempt::{Attempt, ModuleProblem};
use super::decision::{Lookup, Share};
use super::error::Error;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;

/// The class, read from the API after a cache miss: the binder announced the claim
/// because it saw the class, and our class watch may be a moment behind it (a class
/// created just before its claims), which would otherwise be a false "not found"
/// Warning Event and a failed attempt.
pub(super) async fn class(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let name = ClaimView(attempt.claim()).class_name().unwrap_or_default();
    let class = Api::<StorageClass>::all(attempt.ctx.client.clone())
        .get_opt(&name)
        .await
        .map_err(|e| Error::api(attempt.claim(), e))?;
    attempt.live_class = class.map_or(Lookup::Missing, |class| Lookup::Found(Arc::new(class)));
    Ok(())
}

/// The claim changed since it was given up on, or its class since its infeasible
/// answer: its failures are forgotten.
pub(super) fn forgive(attempt: &Attempt<'_>) {
    attempt.ctx.claim_retries.forget(&attempt.key);
}

/// A hold that no longer applies goes.
pub(super) fn drop_hold(attempt: &Attempt<'_>) {
    attempt.ctx.claim_retries.drop_hold(&attempt.key);
}

/// The class's module, honouring `moduleSHA256`.
pub(super) fn module(attempt: &mut Attempt<'_>) {
    let Some(class) = attempt.class() else {
        attempt.module = Lookup::Missing;
        return;
    };
    let class_name = class.name_any();
    let parameters = class.parameters.as_ref();
    let resolved = match parameters.and_then(|p| p.get(names::PARAM_MODULE)) {
        None => Err(ModuleProblem::NoModuleParameter { class: class_name }),
        Some(module) => wasm_provisioner_runtime::class_pin(module, parameters)
            .and_then(|pinned| attempt.ctx.runtime.resolve(module, pinned))
            .map_err(|source| ModuleProblem::Resolve {
                class: class_name,
                source,
            }),
    };
    attempt.module = Lookup::Found(resolved);
}

/// The module's verdict on the class: known, or asked once for all its claims (the
/// lookup that asks tells the class).
pub(super) async fn verdict(attempt: &mut Attempt<'_>) {
    let (Some(class), Some(module)) = (attempt.class().cloned(), attempt.loaded_module().cloned())
    else {
        attempt.verdict = Lookup::Missing;
        return;
    };
    let verdict = attempt.ctx.class_checks.verdict(&class, &module).await;
    attempt.verdict = Lookup::Found(verdict);
}

/// One worker of the module's share, held until its provision call returns; when the
/// module holds all of its share, the claim waits in the module's own queue (no failed
/// attempt, no Event) and this worker goes on with other claims.
pub(super) fn share(attempt: &mut Attempt<'_>) {
    let Some(module) = attempt.loaded_module() else {
        attempt.share = Share::Entered;
        return;
    };
    let object = ObjectRef::from_obj(attempt.claim.as_ref());
    let permit = attempt.ctx.claim_shares.try_enter(
        module.name(),
        module.limits().max_concurrent_calls,
        object,
    );
    if permit.is_none() {
        debug!(
            claim = %ClaimView(&attempt.claim).key(),
            module = module.name(),
            "the module holds its whole share of the workers; the claim waits for one"
        );
    }
    attempt.share = if permit.is_some() {
        Share::Entered
    } else {
        Share::Full
    };
    attempt.share_permit = permit;
}

/// The selected node from the cache; a miss is confirmed with a read from the API
/// before the node counts as gone (a node created a moment ago may not be in the cache
/// yet, and rescheduling is not undone).
pub(super) async fn node(attempt: &mut Attempt<'_>) -> Result<(), Error> {
    let name = ClaimView(attempt.claim())
        .selected_node()
        .unwrap_or_default()
        .to_string();
    let node = match attempt.ctx.node(&name) {
        Some(node) => Some(node),
        None => Api::<Node>::all(attempt.ctx.client.clone())
            .get_metadata_opt(&name)
            .await
            .map(|node| node.map(Arc::new))
            .map_err(|e| Error::api(attempt.claim(), e))?,
    };
    attempt.node = node.map_or(Lookup::Missing, Lookup::Found);
    Ok(())
}

/// A node that is gone, as far as a provision request can tell: its name only.
pub(super) fn vanished_node(name: &str) -> PartialObjectMeta<Node> {
    PartialObjectMeta {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}
