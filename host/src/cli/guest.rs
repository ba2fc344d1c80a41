//! The offline runner: one plugin call from YAML files, without a cluster.
//!
//! `guest provision` reads a StorageClass, a claim and optionally a node, builds the
//! request exactly as the controller does (`request::provision_request`), calls the
//! module through the same runtime (fresh sandbox, grants, limits, `should-provision`
//! then `provision`) and prints the PersistentVolume the controller would create
//! (`volume::persistent_volume`). `guest delete` does the same for a PV. The backend work
//! is real: a hostpath plugin granted a directory really creates or removes it.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;

use crate::cli::args::{GuestDeleteArgs, GuestProvisionArgs, PluginArgs};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{DeleteError, ProvisionError};
use wasm_provisioner_rules::{request, volume};
use wasm_provisioner_runtime::{
    CallError, GrantsError, LoadError, LoadedModule, ResolveError, Runtime, RuntimeError,
};

/// Why an offline call failed. Each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum GuestCliError {
    #[error("cannot read the {what} file {path}: {source}")]
    ReadObject {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {what} file {path} is not a valid {what}: {message}")]
    ParseObject {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error(transparent)]
    Grants(#[from] GrantsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(
        "no module given: pass --module NAME, or set the class's `{}` parameter",
        names::PARAM_MODULE
    )]
    NoModule,
    #[error(
        "--module {flag} contradicts the class's `{}` parameter {class}; drop --module or use the class's module",
        names::PARAM_MODULE
    )]
    ModuleMismatch { flag: String, class: String },
    #[error("module {module} not found: {path} does not exist (modules there: {available})")]
    ModuleNotFound {
        module: String,
        path: PathBuf,
        available: String,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Request(#[from] request::Error),
    #[error(transparent)]
    Volume(#[from] volume::Error),
    #[error("{error}; {cleanup}")]
    Unpublishable {
        error: Box<wasm_provisioner_runtime::Unpublishable>,
        cleanup: String,
    },
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("module {module} (version sha256:{version}) declined: `{call}` answered false")]
    Declined {
        module: String,
        version: String,
        call: &'static str,
    },
    #[error(
        "module {module} (version sha256:{version}) did not provision the volume: {outcome}: {message}"
    )]
    Provision {
        module: String,
        version: String,
        outcome: &'static str,
        message: String,
    },
    #[error(
        "module {module} (version sha256:{version}) did not delete the volume: {outcome}: {message}"
    )]
    Delete {
        module: String,
        version: String,
        outcome: &'static str,
        message: String,
    },
}

/// Runs `guest provision`; returns the PV as YAML.
pub async fn provision(args: &GuestProvisionArgs) -> Result<String, GuestCliError> {
    let class: StorageClass = read_object("StorageClass", &args.class)?;
    let claim: PersistentVolumeClaim = read_object("PersistentVolumeClaim", &args.claim)?;
    let node: Option<Node> = args
        .node
        .as_deref()
        .map(|path| read_object("Node", path))
        .transpose()?;
    let parameters = class.parameters.clone().unwrap_or_default();
    let module_name = choose_module(
        args.module.as_deref(),
        parameters.get(names::PARAM_MODULE).map(String::as_str),
        None,
    )?;
    let pinned = wasm_provisioner_runtime::class_pin(&module_name, Some(&parameters))?;
    let module = load(&args.plugins, &module_name, pinned).await?;

    let request = request::provision_request(&claim, &class, node.as_ref().map(|n| &n.metadata))?;
    if !module.should_provision(&request).await? {
        return Err(declined(&module, "should-provision"));
    }
    let volume = module.provision(&request).await?.map_err(|error| {
        let (outcome, message) = match error {
            ProvisionError::Ignored(m) => ("ignored", m),
            ProvisionError::Failed(m) => ("failed", m),
            ProvisionError::InBackground(m) => ("in background", m),
            ProvisionError::Reschedule(m) => ("reschedule", m),
            ProvisionError::Infeasible(m) => ("infeasible", m),
        };
        GuestCliError::Provision {
            module: module.name().to_string(),
            version: module.version().to_string(),
            outcome,
            message,
        }
    })?;
    let unpublished = volume::unpublished_delete_request(&request, &volume);
    match wasm_provisioner_runtime::publishable_volume(
        &request,
        &claim,
        &class,
        volume,
        &args.provisioner_name,
        true,
        &module,
    )
    .await
    {
        Ok(pv) => Ok(serde_yaml::to_string(&pv).expect("a PersistentVolume serializes to YAML")),
        Err(error) => {
            // As the controller does: the backend volume made for nothing is deleted.
            let cleanup = match module.delete(&unpublished).await {
                Ok(Ok(())) => "the backend volume was deleted through the module".to_string(),
                Ok(Err(error)) => format!("deleting the backend volume failed too: {error:?}"),
                Err(error) => format!("deleting the backend volume failed too: {error}"),
            };
            Err(GuestCliError::Unpublishable {
                error: Box::new(error),
                cleanup,
            })
        }
    }
}

/// What `guest delete` achieved, when the plugin did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The backend volume is gone (or archived): a one-line summary.
    Deleted(String),
    /// The plugin answered `in-background`: it made progress and will go on when asked
    /// again. A one-line summary with the plugin's message; run the same command again.
    InBackground(String),
}

/// Exit status of `guest delete` when the plugin answered `in-background`, so scripts
/// can loop until it exits 0.
pub const EXIT_DELETE_IN_BACKGROUND: u8 = 3;

/// Runs `guest delete`.
pub async fn delete(args: &GuestDeleteArgs) -> Result<DeleteOutcome, GuestCliError> {
    let pv: PersistentVolume = read_object("PersistentVolume", &args.volume)?;
    let class: Option<StorageClass> = args
        .class
        .as_deref()
        .map(|path| read_object("StorageClass", path))
        .transpose()?;
    let parameters = class
        .as_ref()
        .and_then(|c| c.parameters.clone())
        .unwrap_or_default();
    let annotated = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANN_MODULE))
        .map(String::as_str);
    let module_name = choose_module(
        args.module.as_deref(),
        parameters.get(names::PARAM_MODULE).map(String::as_str),
        annotated,
    )?;
    // Deletes use the version in service whatever the class pins: a pin guards new
    // volumes, and refusing a delete would leak the backend volume.
    let module = load(&args.plugins, &module_name, None).await?;

    let request = volume::delete_request(&pv, class.as_ref())?;
    if !module.should_delete(&request).await? {
        return Err(declined(&module, "should-delete"));
    }
    let answer = match module.delete(&request).await? {
        Ok(()) => Ok(()),
        Err(DeleteError::InBackground(message)) => {
            return Ok(DeleteOutcome::InBackground(format!(
                "the delete of the backend volume of {} continues in the background (module {}, version sha256:{}): {message}; run the same command again until it exits 0",
                request.volume.name,
                module.name(),
                module.version()
            )));
        }
        Err(error) => Err(error),
    };
    answer.map_err(|error| {
        let (outcome, message) = match error {
            DeleteError::Ignored(m) => ("ignored", m),
            DeleteError::Failed(m) => ("failed", m),
            DeleteError::InBackground(m) => ("in-background", m),
        };
        GuestCliError::Delete {
            module: module.name().to_string(),
            version: module.version().to_string(),
            outcome,
            message,
        }
    })?;
    Ok(DeleteOutcome::Deleted(format!(
        "deleted the backend volume of {} with module {} (version sha256:{})",
        request.volume.name,
        module.name(),
        module.version()
    )))
}

/// The module to call: the flag, else the class's parameter, else the PV's annotation.
fn choose_module(
    flag: Option<&str>,
    class: Option<&str>,
    annotated: Option<&str>,
) -> Result<String, GuestCliError> {
    match (flag, class) {
        (Some(flag), Some(class)) if flag != class => Err(GuestCliError::ModuleMismatch {
            flag: flag.to_string(),
            class: class.to_string(),
        }),
        (Some(name), _) | (None, Some(name)) => Ok(name.to_string()),
        (None, None) => annotated.map(str::to_string).ok_or(GuestCliError::NoModule),
    }
}

/// Loads one module from the modules directory, as the controller would.
async fn load(
    plugins: &PluginArgs,
    name: &str,
    pinned: Option<&str>,
) -> Result<std::sync::Arc<LoadedModule>, GuestCliError> {
    let runtime = Runtime::new(plugins.runtime_config()?)?;
    let path = plugins.modules.join(format!("{name}.wasm"));
    if !path.is_file() {
        let available = wasm_provisioner_runtime::reload::module_files(&plugins.modules)
            .map(|(modules, _)| modules.into_keys().collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        return Err(GuestCliError::ModuleNotFound {
            module: name.to_string(),
            path,
            available: if available.is_empty() {
                "none".into()
            } else {
                available
            },
        });
    }
    runtime.load_file(name, &path).await?;
    Ok(runtime.resolve(name, pinned)?)
}

fn declined(module: &LoadedModule, call: &'static str) -> GuestCliError {
    GuestCliError::Declined {
        module: module.name().to_string(),
        version: module.version().to_string(),
        call,
    }
}

fn read_object<T: DeserializeOwned>(what: &'static str, path: &Path) -> Result<T, GuestCliError> {
    let text = std::fs::read_to_string(path).map_err(|source| GuestCliError::ReadObject {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|error| GuestCliError::ParseObject {
        what,
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_choice() {
        assert_eq!(choose_module(Some("a"), None, None).unwrap(), "a");
        assert_eq!(choose_module(None, Some("b"), Some("c")).unwrap(), "b");
        assert_eq!(choose_module(Some("b"), Some("b"), None).unwrap(), "b");
        assert_eq!(choose_module(None, None, Some("c")).unwrap(), "c");
        assert!(matches!(
            choose_module(Some("a"), Some("b"), None),
            Err(GuestCliError::ModuleMismatch { .. })
        ));
        assert!(matches!(
            choose_module(None, None, None),
            Err(GuestCliError::NoModule)
        ));
    }

    #[test]
    fn unreadable_and_malformed_objects_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let error = read_object::<StorageClass>("StorageClass", &missing)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("cannot read the StorageClass file"),
            "{error}"
        );
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "metadata: [not, a, map]").unwrap();
        let error = read_object::<StorageClass>("StorageClass", &bad)
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a valid StorageClass"), "{error}");
    }
}
