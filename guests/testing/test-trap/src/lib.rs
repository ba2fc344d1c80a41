//! Traps on purpose. `describe` works; the calls named in class parameter `calls`
//! (comma-separated: should-provision, provision, should-delete, delete,
//! validate-class; default `provision`) panic, which traps. Calls that do not trap
//! succeed.
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Trap;

fn trap_if(params: &[(String, String)], call: &str) {
    let calls = Params::new(params).get_or("calls", "provision");
    if calls.split(',').any(|c| c.trim() == call) {
        panic!("test-trap: {call} traps on purpose");
    }
}

impl Provisioner for Trap {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-trap", env!("CARGO_PKG_VERSION"))
    }
    fn should_provision(req: &ProvisionRequest) -> bool {
        trap_if(&req.class.parameters, "should-provision");
        true
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        trap_if(&req.class.parameters, "provision");
        let path = format!("/trap/{}", req.volume_name);
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, None),
        ))
    }
    fn should_delete(req: &DeleteRequest) -> bool {
        trap_if(&req.class_parameters, "should-delete");
        true
    }
    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        trap_if(&req.class_parameters, "delete");
        Ok(())
    }
}

impl ClassValidator for Trap {
    fn validate_class(class: &Class) -> Result<(), String> {
        trap_if(&class.parameters, "validate-class");
        Ok(())
    }
}

sdk::export!(Trap, capabilities: [validate_class]);
