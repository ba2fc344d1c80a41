//! The smallest useful guest: a hostPath volume per claim under the class's `root`.
//! It does no backend work: kubelet creates the directory (DirectoryOrCreate).
use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Minimal;

impl Provisioner for Minimal {
    fn describe() -> PluginInfo {
        PluginInfo::new("minimal", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let root = Params::new(&req.class.parameters).get_or("root", "/var/lib/minimal");
        let path = sdk::path::join(root, sdk::path::check_pv_name(&req.volume_name)?);
        log::info!("provisioning", volume = req.volume_name, path = path);
        let source = VolumeSource::host_path(path, Some("DirectoryOrCreate"));
        Ok(Volume::new(req.claim.requested_bytes, source))
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        log::info!(
            "nothing to delete: the node keeps the directory",
            volume = req.volume.name
        );
        Ok(())
    }
}

sdk::export!(Minimal);
