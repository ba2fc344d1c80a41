//! Answers `provision` with something far too big, which the host must refuse.
//! Class parameters: `bytes` (default 68157440 = 65 MiB) and `shape`:
//! `annotation` (default: one annotation `test-oversized/blob` of `bytes` bytes),
//! `labels` (one label of `bytes` bytes), `many` (`bytes`/16 empty annotations),
//! `path` (a hostPath path of `bytes` bytes), `message` (a `failed` error of `bytes`
//! bytes). `describe` and `delete` are normal.
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Oversized;

impl Provisioner for Oversized {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-oversized", env!("CARGO_PKG_VERSION"))
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let params = Params::new(&req.class.parameters);
        let bytes: usize = params.get_or("bytes", "68157440").parse().map_err(|e| {
            ProvisionError::Infeasible(format!("test-oversized: parameter `bytes`: {e}"))
        })?;
        let shapes = ["annotation", "labels", "many", "path", "message"];
        let shape = params.one_of("shape", &shapes, "annotation")?;
        let blob = || "x".repeat(bytes);
        let path = format!("/oversized/{}", req.volume_name);
        let mut volume = Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, None),
        );
        match shape {
            "annotation" => volume
                .annotations
                .push(("test-oversized/blob".into(), blob())),
            "labels" => volume.labels.push(("test-oversized/blob".into(), blob())),
            "many" => {
                volume.annotations = (0..bytes / 16)
                    .map(|_| (String::new(), String::new()))
                    .collect()
            }
            "path" => volume.source = VolumeSource::host_path(format!("/{}", blob()), None),
            _ => return Err(ProvisionError::Failed(blob())),
        }
        Ok(volume)
    }
    fn delete(_: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(Oversized);
