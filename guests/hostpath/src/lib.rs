//! hostpath: one directory per volume under an admin-granted host directory.
//!
//! The admin grants this module a host directory, seen by the guest at `guestRoot`
//! (default `/volumes`) and by the nodes at `nodePath`. A volume `pvc-<uid>` is the
//! directory `guestRoot/pvc-<uid>`, published as `nodePath/pvc-<uid>` (a `hostPath` or
//! `local` PV). Parameters and behaviour: see guests/README.md.

use std::fs;
use std::io::ErrorKind;
use wasm_provisioner_sdk::{self as sdk, log, path, prelude::*};

/// PV annotation recording the guest path of the granted directory the volume was made
/// under (used by delete when the class is gone).
pub const ANN_GUEST_ROOT: &str = "hostpath/guest-root";
/// PV annotation recording `onDelete` at provisioning time (used when the class is gone).
pub const ANN_ON_DELETE: &str = "hostpath/on-delete";

const KNOWN: &[&str] = &[
    "guestRoot",
    "nodePath",
    "node",
    "pvType",
    "onDelete",
    "deleteChunkEntries",
    "maxSize",
];
const DEFAULT_GUEST_ROOT: &str = "/volumes";
const ON_DELETE: &[&str] = &["delete", "archive", "retain"];
const NODE_PATH_HINT: &str =
    "set it to the granted directory as the nodes see it, such as /var/lib/volumes";

pub struct HostPath;

/// What a provision will do, decided from the request alone (no I/O).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The granted directory, as the guest sees it.
    pub guest_root: String,
    /// The directory to create, as the guest sees it.
    pub guest_dir: String,
    pub volume: Volume,
}

/// A class's parameters, checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Settings<'a> {
    pub guest_root: String,
    pub node_path: String,
    pub pv_type: &'a str,
    pub on_delete: &'a str,
    /// The class's `node`: every volume on this node.
    pub pinned_node: Option<&'a str>,
    /// The class's `maxSize`: no volume (nor expansion) beyond it.
    pub max_size: Option<u64>,
}

/// Checks a class's parameters: what `validate-class` answers, and where `provision`,
/// `expand` and `get-capacity` start.
pub fn settings<'a>(params: &Params<'a>) -> Result<Settings<'a>, ParamError> {
    params.reject_unknown(KNOWN)?;
    let settings = Settings {
        guest_root: params.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?,
        node_path: params.absolute_path("nodePath", None, NODE_PATH_HINT)?,
        pv_type: params.one_of("pvType", &["hostPath", "local"], "hostPath")?,
        on_delete: params.one_of("onDelete", ON_DELETE, "delete")?,
        pinned_node: params.get("node"),
        max_size: params.bytes("maxSize")?,
    };
    sdk::fs::Budget::from_params(params)?;
    if let Some(pinned) = settings.pinned_node.filter(|n| !is_node_name(n)) {
        return Err(ParamError(format!(
            "StorageClass parameter `node` is {pinned:?}: set it to a node name"
        )));
    }
    Ok(settings)
}

/// Validates the request and works out the directory and the volume.
pub fn plan(req: &ProvisionRequest) -> Result<Plan, ProvisionError> {
    let params = Params::new(&req.class.parameters);
    let Settings {
        guest_root,
        node_path,
        pv_type,
        on_delete,
        pinned_node,
        max_size,
    } = settings(&params)?;
    let name = path::check_pv_name(&req.volume_name)?;

    let claim = &req.claim;
    if let Some(max) = max_size.filter(|max| claim.requested_bytes > *max) {
        return Err(ProvisionError::Infeasible(format!(
            "the claim asks for {} bytes, more than the class's maxSize ({max} bytes)",
            claim.requested_bytes
        )));
    }
    if claim.volume_mode == VolumeMode::Block {
        return Err(ProvisionError::Infeasible(
            "hostpath makes filesystem volumes only: volumeMode Block is not supported".into(),
        ));
    }
    if claim.data_source.is_some() {
        return Err(ProvisionError::Infeasible(
            "hostpath cannot populate a volume from a data source".into(),
        ));
    }
    if claim.selector.is_some() {
        return Err(ProvisionError::Infeasible(
            "hostpath makes new volumes only: a claim selector is not supported".into(),
        ));
    }

    let selected = req.selected_node.as_ref().map(|n| n.name.as_str());
    let node = match (pinned_node, selected) {
        (Some(pinned), Some(sel)) if pinned != sel => {
            return Err(ProvisionError::Reschedule(format!(
                "node {sel} cannot host this volume: the class pins its volumes to node \
                 {pinned} (parameter `node`)"
            )));
        }
        (pinned, sel) => pinned.or(sel),
    };
    if pv_type == "local" && node.is_none() {
        return Err(ProvisionError::Infeasible(
            "pvType local needs a node: set StorageClass parameter `node`, or use \
             volumeBindingMode: WaitForFirstConsumer"
                .into(),
        ));
    }
    // The directory is made where this call runs: never publish it for another node.
    if let (Some(here), Some(node)) = (req.context.node.as_deref(), node)
        && here != node
    {
        return Err(ProvisionError::Infeasible(format!(
            "the volume is for node {node}, but hostpath runs on node {here} and would make \
             its directory there: run the host on every node (node-local mode), or pin the \
             class to node {here} (parameter `node`)"
        )));
    }

    let node_dir = path::join(&node_path, name);
    let source = if pv_type == "local" {
        VolumeSource::Local(LocalSource {
            path: node_dir,
            fs_type: None,
        })
    } else {
        VolumeSource::host_path(node_dir, Some("Directory"))
    };
    let mut volume = Volume::new(claim.requested_bytes, source)
        .annotate(ANN_GUEST_ROOT, guest_root.as_str())
        .annotate(ANN_ON_DELETE, on_delete);
    if let Some(node) = node {
        volume = volume.on_node(node);
    }
    Ok(Plan {
        guest_dir: path::join(&guest_root, name),
        guest_root,
        volume,
    })
}

/// A Kubernetes node name: a DNS subdomain (lowercase letters, digits, `-`, `.`).
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Fails unless `root` is an accessible directory: the module's grant is missing or
/// `guestRoot` is wrong.
fn check_root(root: &str) -> Result<(), String> {
    match fs::metadata(root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("guestRoot {root} is not a directory")),
        Err(e) => Err(format!(
            "guestRoot {root} is not accessible ({e}): grant this module a host directory at \
             {root}, or set StorageClass parameter `guestRoot` to the guest path of its grant"
        )),
    }
}

fn create_dir(dir: &str) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(format!("{dir} exists and is not a directory")),
            Err(e) => Err(format!("checking {dir}: {e}")),
        },
        Err(e) => Err(format!("creating directory {dir}: {e}")),
    }
}

impl Provisioner for HostPath {
    fn describe() -> PluginInfo {
        PluginInfo::new("hostpath", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let plan = plan(req)?;
        check_root(&plan.guest_root).map_err(ProvisionError::Failed)?;
        create_dir(&plan.guest_dir).map_err(ProvisionError::Failed)?;
        log::info!(
            "volume directory ready",
            volume = req.volume_name,
            dir = plan.guest_dir
        );
        Ok(plan.volume)
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let pv = &req.volume;
        let name = path::check_pv_name(&pv.name)?;
        on_its_node(&req.context, pv).map_err(DeleteError::Failed)?;
        let node_dir = match &pv.source {
            VolumeSource::HostPath(s) => &s.path,
            VolumeSource::Local(s) => &s.path,
            _ => {
                return Err(DeleteError::Failed(format!(
                    "PV {name} is not a hostPath or local volume: not made by hostpath"
                )));
            }
        };
        if node_dir.trim_end_matches('/').rsplit('/').next() != Some(name) {
            return Err(DeleteError::Failed(format!(
                "PV {name} has path {node_dir}, which does not end in the PV name: refusing \
                 to delete"
            )));
        }

        // The class's parameters when it still exists, else what the PV recorded.
        let class = Params::new(&req.class_parameters);
        let recorded = Params::new(&pv.annotations);
        let (guest_root, on_delete) = if class.is_empty() {
            let root = recorded.get_or(ANN_GUEST_ROOT, DEFAULT_GUEST_ROOT);
            let on_delete = recorded.get_or(ANN_ON_DELETE, "delete");
            (path::check_absolute(root)?, on_delete)
        } else {
            (
                class.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?,
                class.one_of("onDelete", ON_DELETE, "delete")?,
            )
        };
        if on_delete == "retain" {
            log::info!("onDelete retain: keeping the directory", volume = name);
            return Ok(());
        }
        check_root(&guest_root).map_err(DeleteError::Failed)?;
        let dir = path::join(&guest_root, name);
        let exists = match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(DeleteError::Failed(format!("checking {dir}: {e}"))),
            Ok(m) if !m.is_dir() => {
                return Err(DeleteError::Failed(format!(
                    "{dir} is not a directory: refusing to delete it"
                )));
            }
            Ok(_) => true,
        };
        // A delete already under way has moved the directory to the trash: go on there.
        if !exists && on_delete != "delete" {
            log::info!("directory already gone", volume = name, dir = dir);
            return Ok(());
        }
        match on_delete {
            "archive" => {
                let archived = path::join(&guest_root, &format!("archived-{name}"));
                if fs::symlink_metadata(&archived).is_ok() {
                    return Err(DeleteError::Failed(format!(
                        "cannot archive {dir}: {archived} already exists"
                    )));
                }
                fs::rename(&dir, &archived)
                    .map_err(|e| DeleteError::Failed(format!("archiving {dir}: {e}")))?;
                log::info!("archived", volume = name, to = archived);
            }
            "delete" => {
                let budget = sdk::fs::Budget::from_params(&class)?;
                let root = sdk::fs::Dir::open(&guest_root)
                    .map_err(|e| DeleteError::Failed(e.to_string()))?;
                return sdk::fs::delete_volume_dir(&root, &root, name, name, budget)
                    .map_err(|e| DeleteError::Failed(format!("deleting {dir}: {e}")))
                    .and_then(|deletion| sdk::fs::delete_answer(name, &dir, deletion));
            }
            other => {
                return Err(DeleteError::Failed(format!(
                    "PV annotation {ANN_ON_DELETE} is {other:?}: expected delete, archive or retain"
                )));
            }
        }
        Ok(())
    }
}

impl ClassValidator for HostPath {
    fn validate_class(class: &Class) -> Result<(), String> {
        let settings = settings(&Params::new(&class.parameters))?;
        if settings.pv_type == "local"
            && settings.pinned_node.is_none()
            && class.binding_mode == BindingMode::Immediate
        {
            return Err(
                "pvType local needs a node: set StorageClass parameter `node`, or use \
                        volumeBindingMode: WaitForFirstConsumer"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A volume's directory is on the node its PV is pinned to: a delete or expand running
/// on another node would find nothing there (and a delete would answer success, leaving
/// the directory behind), so it fails, saying where it must run.
fn on_its_node(context: &CallContext, pv: &PublishedVolume) -> Result<(), String> {
    match (context.node.as_deref(), sdk::pinned_node(&pv.node_affinity)) {
        (Some(here), Some(node)) if here != node => Err(format!(
            "PV {}'s directory is on node {node}, but this call runs on node {here}: it must run              on node {node} (in node-local mode the host sends it to the node recorded on the              PV, annotation wasm-provisioner.dev/node)",
            pv.name
        )),
        _ => Ok(()),
    }
}

impl Expander for HostPath {
    /// A directory has no size: the new size is checked against `maxSize` and the free
    /// space of the granted filesystem, then recorded (on the PV, by the host), not
    /// enforced.
    fn expand(req: &ExpandRequest) -> Result<u64, ExpandError> {
        let name = path::check_pv_name(&req.volume.name)?;
        on_its_node(&req.context, &req.volume).map_err(ExpandError::Failed)?;
        let params = Params::new(&req.class_parameters);
        let settings = settings(&params)?;
        if let Some(max) = settings.max_size.filter(|max| req.requested_bytes > *max) {
            return Err(ExpandError::Infeasible(format!(
                "the claim asks for {} bytes, more than the class's maxSize ({max} bytes)",
                req.requested_bytes
            )));
        }
        let dir = path::join(&settings.guest_root, name);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(ExpandError::Failed(format!("{dir} is not a directory"))),
            Err(e) => return Err(ExpandError::Failed(format!("checking {dir}: {e}"))),
        }
        let growth = req
            .requested_bytes
            .saturating_sub(req.volume.capacity_bytes);
        let stats =
            sdk::filesystem::stat_filesystem(&settings.guest_root).map_err(ExpandError::Failed)?;
        if growth > stats.available_bytes {
            return Err(ExpandError::Infeasible(format!(
                "growing the volume by {growth} bytes needs more than the {} bytes free on \
                 the filesystem of {}",
                stats.available_bytes, settings.guest_root
            )));
        }
        log::info!(
            "volume expanded (its size is recorded, not enforced)",
            volume = name,
            bytes = req.requested_bytes
        );
        Ok(req.requested_bytes)
    }
}

impl CapacityReporter for HostPath {
    /// The granted filesystem's size and free space; `maxSize` bounds one volume.
    fn get_capacity(req: &CapacityRequest) -> Result<BackendCapacity, String> {
        let settings = settings(&Params::new(&req.class.parameters))?;
        let stats = sdk::filesystem::stat_filesystem(&settings.guest_root)?;
        Ok(BackendCapacity {
            total_bytes: stats.total_bytes,
            available_bytes: stats.available_bytes,
            maximum_volume_bytes: settings.max_size.filter(|max| *max < stats.available_bytes),
        })
    }
}

sdk::export!(HostPath, capabilities: [expand, report_capacity, validate_class]);

#[cfg(test)]
mod tests;
