//! Whether a plugin's answer may be published: a valid PV (the rules' business) whose
//! volume source the module's grants allow, and whose node directory is no symlink.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use wasm_provisioner_rules::types;
use wasm_provisioner_rules::volume::{Error, persistent_volume, record_module};

use crate::{LoadedModule, SourceRefused};

/// Why a plugin's answer is not published.
#[derive(Debug, thiserror::Error)]
pub enum Unpublishable {
    #[error("plugin {module} answered a volume that cannot be published: {source}")]
    Invalid {
        module: String,
        #[source]
        source: Error,
    },
    #[error(transparent)]
    Refused(#[from] SourceRefused),
}

impl Unpublishable {
    /// The metric label of this error: one per kind, bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Unpublishable::Invalid { .. } => "invalid_volume",
            Unpublishable::Refused(_) => "source_not_granted",
        }
    }
}

/// The PV for `module`'s answer `volume`, if it may be published: valid as a PV
/// ([`persistent_volume`]) and with a volume source the module's volume grants allow;
/// the module version is recorded on it. The controller and the offline runner both
/// publish through here, so a module author sees a refusal before deploying.
pub async fn publishable_volume(
    req: &types::ProvisionRequest,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: types::Volume,
    provisioner_name: &str,
    protection_finalizer: bool,
    module: &LoadedModule,
) -> Result<PersistentVolume, Unpublishable> {
    let (pv, module_mount_options) = volume_to_publish(
        req,
        claim,
        class,
        volume,
        provisioner_name,
        protection_finalizer,
        module,
    )?;
    check_publishable(module, &req.volume_name, &pv, &module_mount_options).await?;
    Ok(pv)
}

/// The first half of [`publishable_volume`], which needs no node: the PV made of the
/// answer (module version recorded), and the mount options the module added to the
/// class's (the grants check those).
pub fn volume_to_publish(
    req: &types::ProvisionRequest,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: types::Volume,
    provisioner_name: &str,
    protection_finalizer: bool,
    module: &LoadedModule,
) -> Result<(PersistentVolume, Vec<String>), Unpublishable> {
    // The class's mount options are the admin's; only what the module adds is checked.
    let class_options = class.mount_options.clone().unwrap_or_default();
    let module_mount_options: Vec<String> = volume
        .mount_options
        .iter()
        .filter(|option| !class_options.contains(option))
        .cloned()
        .collect();
    let mut pv = persistent_volume(
        req,
        claim,
        class,
        volume,
        provisioner_name,
        protection_finalizer,
    )
    .map_err(|source| Unpublishable::Invalid {
        module: module.name().to_string(),
        source,
    })?;
    record_module(&mut pv, module.name(), module.sha256());
    Ok((pv, module_mount_options))
}

/// The second half of [`publishable_volume`], which runs on the volume's node (in
/// node-local mode, that node's instance with its own grants): the volume source is one
/// the module's volume grants allow, and a hostPath or local directory is no symlink.
pub async fn check_publishable(
    module: &LoadedModule,
    volume_name: &str,
    pv: &PersistentVolume,
    module_mount_options: &[String],
) -> Result<(), SourceRefused> {
    let spec = pv.spec.clone().unwrap_or_default();
    let directory =
        module
            .grants()
            .volumes
            .check(module.name(), volume_name, &spec, module_mount_options)?;
    if let Some(directory) = directory {
        module
            .check_volume_directory(&directory)
            .await
            .map_err(|reason| SourceRefused {
                module: module.name().to_string(),
                volume: volume_name.to_string(),
                rule: directory.rule.clone(),
                reason,
            })?;
    }
    Ok(())
}
