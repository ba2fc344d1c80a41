//! Sending a claim back to the scheduler: its selected-node annotations go, so it picks
//! a node again (a WaitForFirstConsumer claim otherwise stays Pending for ever on a node
//! that is gone, or that its module cannot serve).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::error::Error;
use crate::controller::Context;
use wasm_provisioner_rules::names;

/// Removes the selected-node annotations (GA and alpha) from `claim`.
pub(super) async fn remove_selected_node(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<(), Error> {
    ctx.leadership.check("selected-node removal")?;
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": {
            "annotations": {
                names::ANN_SELECTED_NODE: null,
                names::ANN_ALPHA_SELECTED_NODE: null,
            }
        }
    });
    match api
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(Error::api(claim, error)),
    }
}
