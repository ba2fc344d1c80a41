//! The offline runner: one plugin call from YAML files, without a cluster.
//!
//! `guest provision` reads a StorageClass, a claim and optionally a node, builds the
//! request exactly as the controller does (`request::provision_request`), calls the
//! module through the same runtime (fresh sandbox, grants, limits, `should-provision`
//! then `provision`) and prints the PersistentVolume the controller would create
//! (`volume::persistent_volume`). `guest delete` does the same for a PV. The optional
//! capabilities of contract 0.2 have one command each: `guest validate` (a class through
//! `validate-class`), `guest capacity` (a class's backend through `get-capacity`) and
//! `guest expand` (a PV grown to `--size` through `expand`, printed with its new
//! capacity); a module without the capability is an error naming both. The backend work
//! is real: a hostpath plugin granted a directory really creates or removes it.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;

use crate::cli::args::{
    GuestCapacityArgs, GuestDeleteArgs, GuestExpandArgs, GuestProvisionArgs, GuestValidateArgs,
    PluginArgs,
};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{
    BackendCapacity, CallContext, Capability, CapacityRequest, DeleteError, ExpandError,
    ExpandRequest, ProvisionError,
};
use wasm_provisioner_rules::{quantity, request, volume};
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
    #[error(
        "module {module} (version sha256:{version}, contract {contract}) has no capability `{capability}`: it does not export the interface `wasm-provisioner:plugin/{interface}@0.2.0` (its capabilities: {has})"
    )]
    MissingCapability {
        module: String,
        version: String,
        contract: String,
        capability: Capability,
        interface: &'static str,
        has: String,
    },
    #[error(
        "module {module} (version sha256:{version}) refused the StorageClass {class}: {message}"
    )]
    ClassRefused {
        module: String,
        version: String,
        class: String,
        message: String,
    },
    #[error("module {module} (version sha256:{version}) did not report the capacity: {message}")]
    Capacity {
        module: String,
        version: String,
        message: String,
    },
    #[error("--size {size:?} is not a size: {source}; write a quantity such as 2Gi")]
    BadSize {
        size: String,
        source: quantity::Error,
    },
    #[error(
        "--size {size} is not larger than the volume {volume}'s capacity ({capacity} bytes): the host only asks to grow a volume"
    )]
    NotLarger {
        size: String,
        volume: String,
        capacity: u64,
    },
    #[error(
        "module {module} (version sha256:{version}) did not expand the volume: {outcome}: {message}"
    )]
    Expand {
        module: String,
        version: String,
        outcome: &'static str,
        message: String,
    },
    #[error(
        "module {module} (version sha256:{version}) answered {answer} bytes for an expansion to {requested} bytes: less than asked"
    )]
    ExpandedTooLittle {
        module: String,
        version: String,
        answer: u64,
        requested: u64,
    },
}

/// Runs `guest provision`; returns the PV as YAML.
pub async fn provision(args: &GuestProvisionArgs) -> Result<String, GuestCliError> {
    let class: StorageClass = read_object("StorageClass", &args.class)?;
    let claim: PersistentVolumeClaim = read_object("PersistentVolumeClaim", &args.claim)?;
    let node: Option<Node> = read_optional("Node", args.node.as_deref())?;
    let module = class_module(&args.plugins, &class, args.module.as_deref()).await?;

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

/// The PV and class YAML files of a call on an existing volume, and the module that
/// serves it: `--module`, else the class's `module` parameter, else the PV's annotation.
fn volume_class_and_module(
    volume: &Path,
    class: Option<&Path>,
    module: Option<&str>,
) -> Result<(PersistentVolume, Option<StorageClass>, String), GuestCliError> {
    let pv: PersistentVolume = read_object("PersistentVolume", volume)?;
    let class: Option<StorageClass> = read_optional("StorageClass", class)?;
    let parameters = class
        .as_ref()
        .and_then(|c| c.parameters.as_ref())
        .and_then(|p| p.get(names::PARAM_MODULE))
        .map(String::as_str);
    let annotated = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANN_MODULE))
        .map(String::as_str);
    let module_name = choose_module(module, parameters, annotated)?;
    Ok((pv, class, module_name))
}

/// Runs `guest delete`.
pub async fn delete(args: &GuestDeleteArgs) -> Result<DeleteOutcome, GuestCliError> {
    let (pv, class, module_name) =
        volume_class_and_module(&args.volume, args.class.as_deref(), args.module.as_deref())?;
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

/// Runs `guest validate`; returns a one-line summary when the module accepts the class.
pub async fn validate(args: &GuestValidateArgs) -> Result<String, GuestCliError> {
    let class: StorageClass = read_object("StorageClass", &args.class)?;
    let module = class_module(&args.plugins, &class, args.module.as_deref()).await?;
    require(&module, Capability::ValidateClass)?;
    let plugin_class = request::plugin_class(&class)?;
    match module.validate_class(&plugin_class).await? {
        Ok(()) => Ok(format!(
            "module {} (version sha256:{}) accepts the StorageClass {}",
            module.name(),
            module.version(),
            plugin_class.name
        )),
        Err(message) => Err(GuestCliError::ClassRefused {
            module: module.name().to_string(),
            version: module.version().to_string(),
            class: plugin_class.name,
            message,
        }),
    }
}

/// Runs `guest capacity`; returns the backend's capacity as YAML.
pub async fn capacity(args: &GuestCapacityArgs) -> Result<String, GuestCliError> {
    let class: StorageClass = read_object("StorageClass", &args.class)?;
    let node: Option<Node> = read_optional("Node", args.node.as_deref())?;
    let module = class_module(&args.plugins, &class, args.module.as_deref()).await?;
    require(&module, Capability::ReportCapacity)?;
    let node = node.map(|n| wasm_provisioner_rules::types::Node {
        name: n.metadata.name.clone().unwrap_or_default(),
        labels: request::string_map(n.metadata.labels.as_ref()),
    });
    let capacity_request = CapacityRequest {
        class: request::plugin_class(&class)?,
        // As in node-local mode: the node asked about is the node the call runs for.
        context: CallContext {
            node: node.as_ref().map(|n| n.name.clone()),
        },
        node,
    };
    let answer = module
        .get_capacity(&capacity_request)
        .await?
        .map_err(|message| GuestCliError::Capacity {
            module: module.name().to_string(),
            version: module.version().to_string(),
            message,
        })?;
    Ok(capacity_yaml(&answer))
}

/// The capacity as `guest capacity` prints it: bytes, and the same as a quantity.
fn capacity_yaml(answer: &BackendCapacity) -> String {
    let line =
        |key: &str, bytes: u64| format!("{key}: {bytes} # {}\n", quantity::format_bytes(bytes).0);
    let mut text =
        line("totalBytes", answer.total_bytes) + &line("availableBytes", answer.available_bytes);
    if let Some(max) = answer.maximum_volume_bytes {
        text += &line("maximumVolumeBytes", max);
    }
    text
}

/// Runs `guest expand`; returns the PV as YAML with its new capacity.
pub async fn expand(args: &GuestExpandArgs) -> Result<String, GuestCliError> {
    let (mut pv, class, module_name) =
        volume_class_and_module(&args.volume, args.class.as_deref(), args.module.as_deref())?;
    let requested_bytes =
        quantity::parse_bytes(&args.size).map_err(|source| GuestCliError::BadSize {
            size: args.size.clone(),
            source,
        })?;
    // The volume exists: as for deletes, the version in service grows it.
    let module = load(&args.plugins, &module_name, None).await?;
    require(&module, Capability::Expand)?;
    let current = volume::delete_request(&pv, class.as_ref())?;
    if requested_bytes <= current.volume.capacity_bytes {
        return Err(GuestCliError::NotLarger {
            size: args.size.clone(),
            volume: current.volume.name,
            capacity: current.volume.capacity_bytes,
        });
    }
    let expand_request = ExpandRequest {
        volume: current.volume,
        class_name: current.class_name,
        class_parameters: current.class_parameters,
        requested_bytes,
        secret: None,
        context: CallContext::default(),
    };
    let answer = module.expand(&expand_request).await?.map_err(|error| {
        let (outcome, message) = match error {
            ExpandError::Failed(m) => ("failed", m),
            ExpandError::InBackground(m) => ("in background (run it again)", m),
            ExpandError::Infeasible(m) => ("infeasible", m),
        };
        GuestCliError::Expand {
            module: module.name().to_string(),
            version: module.version().to_string(),
            outcome,
            message,
        }
    })?;
    if answer < requested_bytes {
        return Err(GuestCliError::ExpandedTooLittle {
            module: module.name().to_string(),
            version: module.version().to_string(),
            answer,
            requested: requested_bytes,
        });
    }
    if let Some(spec) = pv.spec.as_mut() {
        spec.capacity.get_or_insert_with(Default::default).insert(
            names::RESOURCE_STORAGE.to_string(),
            quantity::format_bytes(answer),
        );
    }
    Ok(serde_yaml::to_string(&pv).expect("a PersistentVolume serializes to YAML"))
}

/// Refuses a module without `capability`, naming both.
fn require(module: &LoadedModule, capability: Capability) -> Result<(), GuestCliError> {
    if module.has(capability) {
        return Ok(());
    }
    let has: Vec<&str> = module
        .info()
        .capabilities
        .iter()
        .map(|c| c.as_str())
        .collect();
    Err(GuestCliError::MissingCapability {
        module: module.name().to_string(),
        version: module.version().to_string(),
        contract: module.contract().to_string(),
        capability,
        interface: capability.interface(),
        has: if has.is_empty() {
            "none".to_string()
        } else {
            has.join(", ")
        },
    })
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
/// The module a class's call goes to (`--module`, else the class's `module`), loaded
/// as the class pins it.
async fn class_module(
    plugins: &PluginArgs,
    class: &StorageClass,
    module: Option<&str>,
) -> Result<std::sync::Arc<LoadedModule>, GuestCliError> {
    let parameters = class.parameters.clone().unwrap_or_default();
    let module_name = choose_module(
        module,
        parameters.get(names::PARAM_MODULE).map(String::as_str),
        None,
    )?;
    let pinned = wasm_provisioner_runtime::class_pin(&module_name, Some(&parameters))?;
    load(plugins, &module_name, pinned).await
}

/// An optional YAML file of one `kind`.
fn read_optional<T: DeserializeOwned>(
    kind: &'static str,
    path: Option<&Path>,
) -> Result<Option<T>, GuestCliError> {
    path.map(|path| read_object(kind, path)).transpose()
}

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
