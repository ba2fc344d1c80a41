//! A hostile guest: it publishes whatever volume source its class asks for, to prove
//! the host checks every answer against the module's volume grants.
//!
//! `provision` creates the directory `/volumes/<volume-name>` when `/volumes` is granted
//! (the backend volume whose cleanup the tests watch), then answers a volume whose
//! source comes from the class parameters: `hostPath` (with `hostPathType`, default
//! none), `local`, `nfsServer` + `nfsPath`, `csiDriver`, or `json` (any
//! PersistentVolumeSource as JSON, e.g. a CSI source with a `nodePublishSecretRef`).
//! `capacityBytes` overrides the capacity answered (the claim's request by default).
//! With `symlinkTarget`, the backend volume is instead a symlink
//! `/volumes/<volume-name>` -> that target (a relative path climbing out of the grant):
//! published as a hostPath below the granted prefix, kubelet would follow it on the
//! node. Creating it fails in the host's sandbox; the answer is then `failed` with
//! `publish: creating the symlink ...: <error>`.
//! `{volume}` in `hostPath` and `local` stands for the volume's name.
//! With `renameFrom` (or `linkFrom`), the backend volume is instead made by renaming (or
//! hard-linking) that path below `/volumes` (a tenant's symlink inside another volume,
//! say `pvc-t/escape -> /`) to `/volumes/<volume-name>`; if the sandbox refuses, the
//! answer is `failed` with `publish: renaming ...: <error>`.
//! `mountOptions` (comma-separated) are answered as the volume's extra mount options;
//! `onNode` pins the volume to that node when no node was selected.
//! `delete` removes `/volumes/<volume-name>` and logs `publish: delete <name>`.
use std::fs;

use wasip2::filesystem::preopens::get_directories;

use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Publish;

const BACKEND: &str = "/volumes";

fn source(params: &Params, volume: &str) -> Result<VolumeSource, ProvisionError> {
    if let Some(path) = params.get("hostPath") {
        return Ok(VolumeSource::host_path(
            path.replace("{volume}", volume),
            params.get("hostPathType"),
        ));
    }
    if let Some(path) = params.get("local") {
        return Ok(VolumeSource::Local(LocalSource {
            path: path.replace("{volume}", volume),
            fs_type: None,
        }));
    }
    if let Some(server) = params.get("nfsServer") {
        return Ok(VolumeSource::Nfs(NfsSource {
            server: server.to_string(),
            path: params.get_or("nfsPath", "/").to_string(),
            read_only: false,
        }));
    }
    if let Some(driver) = params.get("csiDriver") {
        return Ok(VolumeSource::Csi(CsiSource {
            driver: driver.to_string(),
            volume_handle: "handle".to_string(),
            fs_type: None,
            read_only: false,
            volume_attributes: Vec::new(),
        }));
    }
    if let Some(json) = params.get("json") {
        return Ok(VolumeSource::Json(json.to_string()));
    }
    Err(ProvisionError::Failed(
        "publish: name a source (hostPath, local, nfsServer, csiDriver or json)".into(),
    ))
}

impl Provisioner for Publish {
    fn describe() -> PluginInfo {
        // A hostile module claims block support to be asked for raw devices.
        let mut info = PluginInfo::new("test-publish", env!("CARGO_PKG_VERSION"));
        info.supports_block = true;
        info
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let params = Params::new(&req.class.parameters);
        let name = sdk::path::check_pv_name(&req.volume_name)?;
        let source = source(&params, name)?;
        for (param, link) in [("renameFrom", false), ("linkFrom", true)] {
            let Some(from) = params.get(param) else {
                continue;
            };
            let preopens = get_directories();
            let (dir, _) = preopens
                .iter()
                .find(|(_, path)| path == BACKEND)
                .ok_or_else(|| ProvisionError::Failed(format!("publish: {BACKEND} not granted")))?;
            let verb = if link { "linking" } else { "renaming" };
            let moved = if link {
                dir.link_at(
                    wasip2::filesystem::types::PathFlags::empty(),
                    from,
                    dir,
                    name,
                )
            } else {
                dir.rename_at(from, dir, name)
            };
            moved.map_err(|e| {
                ProvisionError::Failed(format!("publish: {verb} {from} to {name}: {}", e.name()))
            })?;
        }
        if let Some(target) = params.get("symlinkTarget") {
            let preopens = get_directories();
            let (dir, _) = preopens
                .iter()
                .find(|(_, path)| path == BACKEND)
                .ok_or_else(|| ProvisionError::Failed(format!("publish: {BACKEND} not granted")))?;
            dir.symlink_at(target, name).map_err(|e| {
                ProvisionError::Failed(format!(
                    "publish: creating the symlink {name} -> {target}: {}",
                    e.name()
                ))
            })?;
        }
        // Best effort: only when the admin granted a backend directory.
        let made = fs::create_dir_all(format!("{BACKEND}/{name}")).is_ok();
        log::info!("publish: provision", volume = name, backend = made);
        let capacity = match params.get("capacityBytes") {
            Some(text) => text.parse().map_err(|e| {
                ProvisionError::Failed(format!("publish: parameter capacityBytes: {e}"))
            })?,
            None => req.claim.requested_bytes,
        };
        let mut volume = Volume::new(capacity, source);
        if let Some(options) = params.get("mountOptions") {
            volume.mount_options = options.split(',').map(str::to_string).collect();
        }
        if let Some(node) = &req.selected_node {
            volume = volume.on_node(&node.name);
        } else if let Some(node) = params.get("onNode") {
            volume = volume.on_node(node);
        }
        Ok(volume)
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let name = &req.volume.name;
        let path = format!("{BACKEND}/{name}");
        let _ = fs::remove_dir(&path).or_else(|_| fs::remove_file(&path));
        log::info!("publish: delete", volume = name);
        Ok(())
    }
}

sdk::export!(Publish);
