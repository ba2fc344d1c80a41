//! A backend that keeps a journal, for the chaos tests. Every backend-changing call
//! appends `start <call> <volume> <unix-nanos>` to `/journal/calls` when it begins and
//! `end <call> <volume> <unix-nanos>` when it is done, so a test can tell whether two
//! host processes ever changed the backend at the same time (each process is granted
//! its own `/journal`). `provision` makes the directory `/volumes/<volume-name>` and
//! answers a hostPath volume `/srv/journal/<volume-name>`; `delete` removes the
//! directory. Both are idempotent. Class parameter `sleepMillis` (default 0) makes each
//! call wait that long on the WASI clock half-way, as a slow storage API would.
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Journal;

fn note(event: &str, call: &str, volume: &str) -> Result<(), String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_nanos();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/journal/calls")
        .map_err(|e| format!("journal: {e}"))?;
    file.write_all(format!("{event} {call} {volume} {nanos}\n").as_bytes())
        .map_err(|e| format!("journal: {e}"))
}

fn pause(params: &[(String, String)]) -> Result<(), String> {
    let millis: u64 = Params::new(params)
        .get_or("sleepMillis", "0")
        .parse()
        .map_err(|_| "sleepMillis must be a number".to_string())?;
    std::thread::sleep(Duration::from_millis(millis));
    Ok(())
}

impl Provisioner for Journal {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-journal", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let name = &req.volume_name;
        note("start", "provision", name).map_err(ProvisionError::Failed)?;
        pause(&req.class.parameters).map_err(ProvisionError::Infeasible)?;
        std::fs::create_dir_all(format!("/volumes/{name}"))
            .map_err(|e| ProvisionError::Failed(format!("making /volumes/{name}: {e}")))?;
        note("end", "provision", name).map_err(ProvisionError::Failed)?;
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(format!("/srv/journal/{name}"), Some("DirectoryOrCreate")),
        ))
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let name = &req.volume.name;
        note("start", "delete", name).map_err(DeleteError::Failed)?;
        pause(&req.class_parameters).map_err(DeleteError::Failed)?;
        match std::fs::remove_dir(format!("/volumes/{name}")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DeleteError::Failed(format!(
                    "removing /volumes/{name}: {e}"
                )));
            }
        }
        note("end", "delete", name).map_err(DeleteError::Failed)
    }
}

sdk::export!(Journal);
