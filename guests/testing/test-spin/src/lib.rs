//! Loops forever on purpose. `describe` works; the calls named in class parameter
//! `calls` (comma-separated: provision, delete; default `provision`) never return.
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Spin;

fn spin_if(params: &[(String, String)], call: &str) {
    let calls = Params::new(params).get_or("calls", "provision");
    if calls.split(',').any(|c| c.trim() == call) {
        sdk::log::info!("test-spin: spinning forever", call = call);
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

impl Provisioner for Spin {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-spin", env!("CARGO_PKG_VERSION"))
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        spin_if(&req.class.parameters, "provision");
        let path = format!("/spin/{}", req.volume_name);
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, None),
        ))
    }
    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        spin_if(&req.class_parameters, "delete");
        Ok(())
    }
}

sdk::export!(Spin);
