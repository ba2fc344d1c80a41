//! The Secret a module receives with a call: named by the class (or recorded on the PV),
//! allowed by the module's grant, read from the API at the moment of the call, and
//! handed to the guest only. Its value is never logged, put in an Event, an annotation
//! or a metric: errors name the Secret, never its data (docs/security.md, "Secrets").

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;

use crate::controller::Context;
use wasm_provisioner_rules::secret::{self, SecretRef, Vars};
use wasm_provisioner_rules::types;
use wasm_provisioner_runtime::LoadedModule;

/// Why a call could not get its Secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(transparent)]
    Reference(#[from] secret::Error),
    #[error(
        "Secret {secret} is not granted to module {module}: the admin's grants file must list \
         it (or a pattern matching it) under modules.{module}.secrets"
    )]
    NotGranted { module: String, secret: SecretRef },
    #[error("Secret {secret} does not exist: create it, or name another in the class")]
    Missing { secret: SecretRef },
    #[error("reading Secret {secret}: {source}")]
    Api {
        secret: SecretRef,
        #[source]
        source: kube::Error,
    },
}

impl SecretError {
    /// The label of this error in the host's error metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SecretError::Reference(error) => error.metric_label(),
            SecretError::NotGranted { .. } => "secret_not_granted",
            SecretError::Missing { .. } => "secret_missing",
            SecretError::Api { .. } => "secret_api",
        }
    }
}

/// The Secret `class` names for `claim`'s volume `volume_name`, if it names one.
pub async fn for_claim(
    ctx: &Context,
    module: &LoadedModule,
    class: &StorageClass,
    claim: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<Option<types::Secret>, SecretError> {
    let vars = Vars {
        pvc_namespace: claim.metadata.namespace.as_deref().unwrap_or_default(),
        pvc_name: claim.metadata.name.as_deref().unwrap_or_default(),
        pv_name: volume_name,
    };
    match secret::class_secret(class, &vars)? {
        None => Ok(None),
        Some(reference) => read(ctx, module, reference, &vars).await.map(Some),
    }
}

/// The Secret recorded on `pv` when it was provisioned, if any; still bounded by the
/// module's grant as it is now.
pub async fn for_volume(
    ctx: &Context,
    module: &LoadedModule,
    pv: &PersistentVolume,
) -> Result<Option<types::Secret>, SecretError> {
    let Some(reference) = secret::recorded_secret(pv)? else {
        return Ok(None);
    };
    let (pvc_namespace, pvc_name, pv_name) = secret::volume_vars(pv);
    let vars = Vars {
        pvc_namespace: &pvc_namespace,
        pvc_name: &pvc_name,
        pv_name: &pv_name,
    };
    read(ctx, module, reference, &vars).await.map(Some)
}

async fn read(
    ctx: &Context,
    module: &LoadedModule,
    reference: SecretRef,
    vars: &Vars<'_>,
) -> Result<types::Secret, SecretError> {
    if !secret::granted(&module.grants().secrets, &reference, vars) {
        return Err(SecretError::NotGranted {
            module: module.name().to_string(),
            secret: reference,
        });
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &reference.namespace);
    let found = match secrets.get_opt(&reference.name).await {
        Ok(Some(found)) => found,
        Ok(None) => return Err(SecretError::Missing { secret: reference }),
        Err(source) => {
            return Err(SecretError::Api {
                secret: reference,
                source,
            });
        }
    };
    let mut data: Vec<(String, Vec<u8>)> = found
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, value.0))
        .collect();
    data.sort();
    Ok(types::Secret {
        namespace: reference.namespace,
        name: reference.name,
        data,
    })
}
