//! nfs-subdir: one subdirectory per volume on an NFS export, like
//! kubernetes-sigs/nfs-subdir-external-provisioner.
//!
//! The admin mounts the export `server:share` where the host runs and grants that
//! directory to this module at `guestRoot` (default `/export`). A volume is the
//! directory `guestRoot/<subdir>`, published as an `nfs` PV `server:share/<subdir>`.
//! Parameters and behaviour: see guests/README.md.

pub mod owner;
pub mod pattern;

use std::fs;
use std::io::ErrorKind;
use wasm_provisioner_sdk::{self as sdk, log, path, prelude::*};

/// PV annotations recording how the volume was made, used by delete when the class is gone.
pub const ANN_SHARE: &str = "nfs-subdir/share";
pub const ANN_GUEST_ROOT: &str = "nfs-subdir/guest-root";
pub const ANN_ON_DELETE: &str = "nfs-subdir/on-delete";
/// PV annotation: the volume's owner marker, relative to the share (see [`owner`]). A PV
/// without it was made before markers existed.
pub const ANN_OWNER_MARKER: &str = "nfs-subdir/owner-marker";

const KNOWN: &[&str] = &[
    "server",
    "share",
    "guestRoot",
    "pathPattern",
    "onDelete",
    "archiveOnDelete",
    "deleteChunkEntries",
    "maxSize",
];
const DEFAULT_GUEST_ROOT: &str = "/export";
const ON_DELETE: &[&str] = &["delete", "retain", "archive"];
const SHARE_HINT: &str = "set it to the exported path on the NFS server, such as /srv/nfs";

pub struct NfsSubdir;

/// What a provision will do, decided from the request alone (no I/O).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The granted directory (the mounted export), as the guest sees it.
    pub guest_root: String,
    /// The volume's directory relative to the share (and to `guest_root`).
    pub subdir: String,
    pub volume: Volume,
}

/// The NFS server parameter: a host name or address (no `/`, spaces or control characters).
fn server<'a>(params: &Params<'a>) -> Result<&'a str, ParamError> {
    let server = params.require(
        "server",
        "set it to the NFS server's host name or IP address",
    )?;
    if server.len() > 253
        || server
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(ParamError(format!(
            "StorageClass parameter `server` is {server:?}: set it to a host name or IP address"
        )));
    }
    Ok(server)
}

/// What to do on delete: `onDelete` if set (delete, retain or archive), else archive when
/// `archiveOnDelete` is true, else delete.
fn on_delete(params: &Params) -> Result<&'static str, ParamError> {
    let archive = params.bool("archiveOnDelete", false)?;
    let chosen = params.one_of("onDelete", ON_DELETE, "")?;
    Ok(match ON_DELETE.iter().find(|p| **p == chosen) {
        Some(p) => p,
        None if archive => "archive",
        None => "delete",
    })
}

/// Validates the request and works out the subdirectory and the volume.
pub fn plan(req: &ProvisionRequest) -> Result<Plan, ProvisionError> {
    let params = Params::new(&req.class.parameters);
    params.reject_unknown(KNOWN)?;
    let server = server(&params)?;
    let share = params.absolute_path("share", None, SHARE_HINT)?;
    let guest_root = params.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?;
    let on_delete = on_delete(&params)?;
    sdk::fs::Budget::from_params(&params)?;
    let max_size = params.bytes("maxSize")?;
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
            "nfs-subdir makes filesystem volumes only: volumeMode Block is not supported".into(),
        ));
    }
    if claim.data_source.is_some() {
        return Err(ProvisionError::Infeasible(
            "nfs-subdir cannot populate a volume from a data source".into(),
        ));
    }
    if claim.selector.is_some() {
        return Err(ProvisionError::Infeasible(
            "nfs-subdir makes new volumes only: a claim selector is not supported".into(),
        ));
    }

    let expanded = match params.get("pathPattern") {
        Some(p) => pattern::expand(p, claim).map_err(ProvisionError::Infeasible)?,
        None => None,
    };
    let subdir = match expanded {
        Some(subdir) => subdir,
        None => {
            let default = format!("{}-{}-{name}", claim.namespace, claim.name);
            path::check_component(&default)?.to_string()
        }
    };
    if let Some(reserved) = subdir
        .split('/')
        .find(|c| c.starts_with(owner::RESERVED_PREFIX))
    {
        return Err(ProvisionError::Infeasible(format!(
            "the volume's directory {subdir} has the component {reserved:?}: names starting \
             with {} are reserved for nfs-subdir's own files; change the pathPattern values",
            owner::RESERVED_PREFIX
        )));
    }
    let source = VolumeSource::Nfs(NfsSource {
        server: server.to_string(),
        path: path::join(&share, &subdir),
        read_only: false,
    });
    let volume = Volume::new(claim.requested_bytes, source)
        .annotate(ANN_SHARE, share.as_str())
        .annotate(ANN_GUEST_ROOT, guest_root.as_str())
        .annotate(ANN_ON_DELETE, on_delete)
        .annotate(ANN_OWNER_MARKER, owner::marker_rel(&subdir));
    Ok(Plan {
        guest_root,
        subdir,
        volume,
    })
}

/// The volume's directory relative to `share`, from the PV's NFS path; an error if the
/// path is not strictly inside the share.
pub fn relative_to_share(nfs_path: &str, share: &str) -> Result<String, String> {
    let outside = || format!("path {nfs_path} is not inside the share {share}");
    let full = path::check_absolute(nfs_path).map_err(|e| format!("{}: {e}", outside()))?;
    let share = path::check_absolute(share).map_err(|e| e.to_string())?;
    let rest = if share == "/" {
        full.strip_prefix('/')
    } else {
        full.strip_prefix(share.as_str())
            .and_then(|r| r.strip_prefix('/'))
    };
    match rest {
        Some(rest) if !rest.is_empty() => Ok(rest.to_string()),
        _ => Err(outside()),
    }
}

/// Fails unless `root` is an accessible directory.
fn check_root(root: &str) -> Result<(), String> {
    match fs::metadata(root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("guestRoot {root} is not a directory")),
        Err(e) => Err(format!(
            "guestRoot {root} is not accessible ({e}): grant this module the mounted export at \
             {root}, or set StorageClass parameter `guestRoot` to the guest path of its grant"
        )),
    }
}

/// Walks `root/rel` one component at a time: an error if a component is a symbolic link
/// or not a directory (a tenant must not redirect us into someone else's directory);
/// `Ok(false)` if a component does not exist, `Ok(true)` if the whole path does.
fn walk(root: &str, rel: &str) -> Result<bool, String> {
    let mut dir = root.to_string();
    for component in rel.split('/') {
        dir = path::join(&dir, component);
        match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("checking {dir}: {e}")),
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!("{dir} is a symbolic link: refusing to use it"));
            }
            Ok(m) if !m.is_dir() => return Err(format!("{dir} is not a directory")),
            Ok(_) => {}
        }
    }
    Ok(true)
}

/// Where `root/rel` is archived: `archived-<last component>` beside it, or
/// `archived-<last component>-<pv name>` if that is taken.
fn archive_target(root: &str, rel: &str, pv_name: &str) -> Result<String, String> {
    let (parent, base) = match rel.rsplit_once('/') {
        Some((parent, base)) => (path::join(root, parent), base),
        None => (root.to_string(), rel),
    };
    for candidate in [
        format!("archived-{base}"),
        format!("archived-{base}-{pv_name}"),
    ] {
        let target = path::join(&parent, &candidate);
        if fs::symlink_metadata(&target).is_err() {
            return Ok(target);
        }
    }
    Err(format!(
        "cannot archive {}: archived-{base} and archived-{base}-{pv_name} both exist in {parent}",
        path::join(root, rel)
    ))
}

impl Provisioner for NfsSubdir {
    fn describe() -> PluginInfo {
        PluginInfo::new("nfs-subdir", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let plan = plan(req)?;
        let root = &plan.guest_root;
        let rel = &plan.subdir;
        let volume = &req.volume_name;
        check_root(root).map_err(ProvisionError::Failed)?;
        walk(root, rel).map_err(ProvisionError::Failed)?;
        let dir = path::join(root, rel);
        let taken = |why: &str| {
            ProvisionError::Failed(format!(
                "the directory {rel} (from pathPattern) {why}: volumes never share a \
                 directory; give this claim other values for the pattern's labels or \
                 annotations (or another name), then recreate it"
            ))
        };
        match owner::owner(root, rel).map_err(ProvisionError::Failed)? {
            // Idempotent: this PV's own directory (made by an earlier attempt).
            owner::Owner::Volume(v) if v == *volume => {}
            owner::Owner::Volume(other) => {
                log::warn!(
                    "refused: the directory belongs to another volume",
                    volume = volume,
                    dir = dir,
                    owner = other
                );
                return Err(taken("already belongs to another volume"));
            }
            owner::Owner::Unreadable(why) => {
                log::warn!(
                    "refused: unreadable owner marker",
                    volume = volume,
                    dir = dir,
                    why = why
                );
                return Err(taken("has an owner marker that names no volume"));
            }
            owner::Owner::None => {
                if let Some(outer) =
                    owner::inside_a_volume(root, rel).map_err(ProvisionError::Failed)?
                {
                    log::warn!(
                        "refused: inside another volume",
                        volume = volume,
                        dir = dir,
                        outer = outer
                    );
                    return Err(taken("lies inside another volume's directory"));
                }
                if walk(root, rel).map_err(ProvisionError::Failed)? {
                    log::warn!(
                        "refused: the directory exists and has no owner marker",
                        volume = volume,
                        dir = dir
                    );
                    return Err(taken("already exists and is not a volume of this claim"));
                }
                // Parents first (the markers live beside the directory), then the
                // marker, then the directory: whoever holds the marker owns the path.
                let (parent, _) = owner::split(rel);
                if !parent.is_empty() {
                    let parent_dir = path::join(root, parent);
                    fs::create_dir_all(&parent_dir).map_err(|e| {
                        ProvisionError::Failed(format!("creating directory {parent_dir}: {e}"))
                    })?;
                    walk(root, parent).map_err(ProvisionError::Failed)?;
                }
                let text = owner::marker_text(
                    volume,
                    &req.claim.uid,
                    &format!("{}/{}", req.claim.namespace, req.claim.name),
                );
                match owner::claim(root, rel, volume, &text).map_err(ProvisionError::Failed)? {
                    None => {}
                    Some(owner::Owner::Volume(v)) if v == *volume => {}
                    Some(_) => return Err(taken("was just taken by another volume")),
                }
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        // Made meanwhile by something that does not mark: not ours.
                        owner::release(root, rel).map_err(ProvisionError::Failed)?;
                        return Err(taken("appeared while it was being claimed"));
                    }
                    Err(e) => {
                        return Err(ProvisionError::Failed(format!(
                            "creating directory {dir}: {e}"
                        )));
                    }
                }
            }
        }
        // This PV's marker is in place: (re)create its directory if it is missing.
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ProvisionError::Failed(format!(
                    "creating directory {dir}: {e}"
                )));
            }
        }
        if !walk(root, rel).map_err(ProvisionError::Failed)? {
            return Err(ProvisionError::Failed(format!(
                "{dir} vanished after creation"
            )));
        }
        log::info!("volume directory ready", volume = volume, dir = dir);
        Ok(plan.volume)
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let pv = &req.volume;
        let name = path::check_pv_name(&pv.name)?;
        let VolumeSource::Nfs(nfs) = &pv.source else {
            return Err(DeleteError::Failed(format!(
                "PV {name} is not an nfs volume: not made by nfs-subdir"
            )));
        };

        // The class's parameters when it still exists, else what the PV recorded.
        let class = Params::new(&req.class_parameters);
        let (share, guest_root, on_delete) = if class.is_empty() {
            let recorded = Params::new(&pv.annotations);
            let share = recorded.get(ANN_SHARE).ok_or_else(|| {
                DeleteError::Failed(format!(
                    "the class {} is gone and PV {name} has no {ANN_SHARE} annotation: cannot \
                     tell the share; delete {} by hand",
                    req.class_name, nfs.path
                ))
            })?;
            let root = recorded.get_or(ANN_GUEST_ROOT, DEFAULT_GUEST_ROOT);
            let on_delete = recorded.get_or(ANN_ON_DELETE, "delete");
            if !ON_DELETE.contains(&on_delete) {
                return Err(DeleteError::Failed(format!(
                    "PV annotation {ANN_ON_DELETE} is {on_delete:?}: expected delete, retain or archive"
                )));
            }
            (share.to_string(), path::check_absolute(root)?, on_delete)
        } else {
            let server = server(&class)?;
            if nfs.server != server {
                return Err(DeleteError::Failed(format!(
                    "PV {name} is on NFS server {} but the class names server {server}: \
                     refusing to delete it through this module's grant",
                    nfs.server
                )));
            }
            (
                class.absolute_path("share", None, SHARE_HINT)?,
                class.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?,
                on_delete(&class)?,
            )
        };
        let rel = relative_to_share(&nfs.path, &share)
            .map_err(|e| DeleteError::Failed(format!("PV {name}: {e}: refusing to delete")))?;
        if on_delete == "retain" {
            log::info!(
                "onDelete retain: keeping the directory",
                volume = name,
                path = nfs.path
            );
            return Ok(());
        }
        check_root(&guest_root).map_err(DeleteError::Failed)?;
        let dir = path::join(&guest_root, &rel);
        let marker = owner::marker_path(&guest_root, &rel);
        let exists = walk(&guest_root, &rel).map_err(DeleteError::Failed)?;
        let owned = owner::owner(&guest_root, &rel).map_err(DeleteError::Failed)?;
        let budget = sdk::fs::Budget::from_params(&class)?;
        let root =
            || sdk::fs::Dir::open(&guest_root).map_err(|e| DeleteError::Failed(e.to_string()));
        if !exists {
            // Gone, or moved to the trash by an earlier call of this delete: release the
            // path's marker if it is still this PV's, and finish what is in the trash.
            if owned == owner::Owner::Volume(name.to_string()) {
                owner::release(&guest_root, &rel).map_err(DeleteError::Failed)?;
            }
            if on_delete == "archive" {
                log::info!("directory already gone", volume = name, dir = dir);
                return Ok(());
            }
            let deletion = sdk::fs::resume_deletion(&root()?, name, budget)
                .map_err(|e| DeleteError::Failed(format!("deleting {dir}: {e}")))?;
            return sdk::fs::delete_answer(name, &dir, deletion);
        }
        match owned {
            owner::Owner::Volume(v) if v == name => {}
            owner::Owner::Volume(other) => {
                return Err(DeleteError::Failed(format!(
                    "{dir} belongs to another volume, {other} (owner marker {marker}): refusing \
                     to delete it. PV {name} does not own it; to let the PV go without \
                     touching the directory, remove the finalizer \
                     external-provisioner.volume.kubernetes.io/finalizer from PV {name}"
                )));
            }
            owner::Owner::Unreadable(why) => {
                return Err(DeleteError::Failed(format!(
                    "{why}: cannot tell whether {dir} is PV {name}'s, refusing to delete it; \
                     if it is, write the line `volume: {name}` into {marker}"
                )));
            }
            owner::Owner::None => {
                let made_with_marker = Params::new(&pv.annotations).get(ANN_OWNER_MARKER).is_some();
                let why = if made_with_marker {
                    format!("its owner marker {marker} is missing")
                } else {
                    format!(
                        "PV {name} was made before nfs-subdir wrote owner markers, and {dir} has \
                         none, so another volume may share it"
                    )
                };
                return Err(DeleteError::Failed(format!(
                    "{why}: refusing to delete {dir}. If the directory is PV {name}'s alone, \
                     create the marker (mkdir -p $(dirname {marker}); echo 'volume: {name}' > \
                     {marker}, paths as the module sees the share) and the delete goes on; or \
                     set StorageClass parameter onDelete: retain; or delete the directory by \
                     hand and remove the PV's finalizer"
                )));
            }
        }
        if on_delete == "archive" {
            let target = archive_target(&guest_root, &rel, name).map_err(DeleteError::Failed)?;
            let target_rel = target
                .strip_prefix(&format!("{}/", guest_root.trim_end_matches('/')))
                .unwrap_or(&target)
                .to_string();
            // The archive stays marked as this PV's: no later claim can take it over.
            owner::copy_to(&guest_root, &rel, &target_rel, name).map_err(DeleteError::Failed)?;
            fs::rename(&dir, &target)
                .map_err(|e| DeleteError::Failed(format!("archiving {dir}: {e}")))?;
            owner::release(&guest_root, &rel).map_err(DeleteError::Failed)?;
            log::info!("archived", volume = name, to = target);
            return Ok(());
        }
        let (parent_rel, base) = owner::split(&rel);
        let root = root()?;
        let parent = if parent_rel.is_empty() {
            None
        } else {
            Some(
                root.open_dir_path(parent_rel)
                    .map_err(|e| DeleteError::Failed(e.to_string()))?,
            )
        };
        let deletion =
            sdk::fs::delete_volume_dir(&root, parent.as_ref().unwrap_or(&root), base, name, budget)
                .map_err(|e| DeleteError::Failed(format!("deleting {dir}: {e}")));
        // Moved to the trash (or gone): the path is free, its marker goes too.
        if !walk(&guest_root, &rel).map_err(DeleteError::Failed)? {
            owner::release(&guest_root, &rel).map_err(DeleteError::Failed)?;
        }
        sdk::fs::delete_answer(name, &dir, deletion?)
    }
}

impl Expander for NfsSubdir {
    /// An NFS directory has no size: the new size is checked against the class's
    /// `maxSize`, the volume's directory must still be there, and the size is recorded
    /// (on the PV, by the host), not enforced.
    fn expand(req: &ExpandRequest) -> Result<u64, ExpandError> {
        let pv = &req.volume;
        let name = path::check_pv_name(&pv.name)?;
        let VolumeSource::Nfs(nfs) = &pv.source else {
            return Err(ExpandError::Failed(format!(
                "PV {name} is not an nfs volume: not made by nfs-subdir"
            )));
        };
        let class = Params::new(&req.class_parameters);
        class.reject_unknown(KNOWN)?;
        if let Some(max) = class
            .bytes("maxSize")?
            .filter(|max| req.requested_bytes > *max)
        {
            return Err(ExpandError::Infeasible(format!(
                "the claim asks for {} bytes, more than the class's maxSize ({max} bytes)",
                req.requested_bytes
            )));
        }
        let share = class.absolute_path("share", None, SHARE_HINT)?;
        let guest_root = class.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?;
        let rel = relative_to_share(&nfs.path, &share)
            .map_err(|e| ExpandError::Failed(format!("PV {name}: {e}")))?;
        check_root(&guest_root).map_err(ExpandError::Failed)?;
        if !walk(&guest_root, &rel).map_err(ExpandError::Failed)? {
            return Err(ExpandError::Failed(format!(
                "the directory of PV {name} ({}) is gone",
                path::join(&guest_root, &rel)
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

/// The checks `plan` makes of a class's parameters, without a claim: unknown keys,
/// `server`, `share`, `guestRoot`, `onDelete`/`archiveOnDelete`, `maxSize`, `deleteChunkEntries`, and
/// the syntax of `pathPattern` (expanded for a stand-in claim). Answers the granted root.
pub fn check_class(parameters: &StringMap) -> Result<String, String> {
    let params = Params::new(parameters);
    params.reject_unknown(KNOWN)?;
    server(&params)?;
    params.absolute_path("share", None, SHARE_HINT)?;
    let guest_root = params.absolute_path("guestRoot", Some(DEFAULT_GUEST_ROOT), "")?;
    on_delete(&params)?;
    params.bytes("maxSize")?;
    sdk::fs::Budget::from_params(&params)?;
    if let Some(pattern) = params.get("pathPattern") {
        pattern::expand(pattern, &sdk::testing::claim("namespace", "name"))?;
    }
    Ok(guest_root)
}

impl ClassValidator for NfsSubdir {
    fn validate_class(class: &Class) -> Result<(), String> {
        check_class(&class.parameters).map(drop)
    }
}

impl CapacityReporter for NfsSubdir {
    /// The export's size and free space, as the filesystem granted at `guestRoot` says.
    fn get_capacity(req: &CapacityRequest) -> Result<BackendCapacity, String> {
        let guest_root = check_class(&req.class.parameters)?;
        let stats = sdk::filesystem::stat_filesystem(&guest_root)?;
        Ok(BackendCapacity {
            total_bytes: stats.total_bytes,
            available_bytes: stats.available_bytes,
            maximum_volume_bytes: None,
        })
    }
}

sdk::export!(
    NfsSubdir,
    capabilities: [expand, report_capacity, validate_class]
);

#[cfg(test)]
mod tests;
