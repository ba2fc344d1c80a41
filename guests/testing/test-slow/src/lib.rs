//! A slow backend on purpose, for the fairness tests: `provision` takes class parameter
//! `sleepMillis` (default 2000) before answering a hostPath volume
//! `/srv/slow/<volume-name>` (type DirectoryOrCreate). `mode: sleep` (the default) waits
//! on the WASI monotonic clock, as a guest waiting for a slow storage API would; `mode:
//! spin` busy-waits, polling the clock, as a CPU-bound guest would. `delete` takes class
//! parameter `deleteSleepMillis` (default 0) the same way.
use std::time::{Duration, Instant};

use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Slow;

/// Waits the number of milliseconds in parameter `key` (default `default`).
fn wait(params: &[(String, String)], key: &str, default: &str) -> Result<(), String> {
    let params = Params::new(params);
    let millis: u64 = params
        .get_or(key, default)
        .parse()
        .map_err(|_| format!("{key} must be a number"))?;
    let duration = Duration::from_millis(millis);
    match params.get_or("mode", "sleep") {
        "sleep" => std::thread::sleep(duration),
        "spin" => {
            let start = Instant::now();
            while start.elapsed() < duration {
                std::hint::spin_loop();
            }
        }
        other => return Err(format!("mode {other:?}: use sleep or spin")),
    }
    Ok(())
}

impl Provisioner for Slow {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-slow", env!("CARGO_PKG_VERSION"))
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        wait(&req.class.parameters, "sleepMillis", "2000").map_err(ProvisionError::Infeasible)?;
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(
                format!("/srv/slow/{}", req.volume_name),
                Some("DirectoryOrCreate"),
            ),
        ))
    }
    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        wait(&req.class_parameters, "deleteSleepMillis", "0").map_err(DeleteError::Failed)
    }
}

sdk::export!(Slow);
