//! {{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
//! inside the directory the cluster admin granted this module, published as the hostPath
//! `nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible.
//!
//! Optional capabilities (contract 0.2) are traits named in `export!`: this plugin has
//! `validate_class` (the host checks a StorageClass with it before any claim of it
//! fails). Implement `Expander` (grow a volume) or `CapacityReporter` (the backend's
//! space) and name `expand` or `report_capacity` in `export!` to have those too; the SDK
//! exports exactly the named capabilities and `describe` lists them.
use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Guest;

const KNOWN: &[&str] = &["nodePath", "guestRoot", "maxSize"];

/// The class's parameters, checked: (nodePath, guestRoot, maxSize in bytes).
fn settings(params: &Params) -> Result<(String, String, u64), ParamError> {
    params.reject_unknown(KNOWN)?;
    let node_path = params.absolute_path("nodePath", None, "the granted directory on the nodes")?;
    let guest_root = params.absolute_path("guestRoot", Some("/volumes"), "")?;
    let max = params.bytes("maxSize")?.unwrap_or(1 << 30);
    Ok((node_path, guest_root, max))
}

/// Capability `validate-class`: an error refuses the class (the message goes to the admin).
impl ClassValidator for Guest {
    fn validate_class(class: &Class) -> Result<(), String> {
        settings(&Params::new(&class.parameters))?;
        Ok(())
    }
}

// Capability `expand`: uncomment, and name `expand` in `export!` below.
// impl Expander for Guest {
//     fn expand(req: &ExpandRequest) -> Result<u64, ExpandError> {
//         let (_, _, max) = settings(&Params::new(&req.class_parameters))?;
//         if req.requested_bytes > max {
//             return Err(ExpandError::Infeasible(format!("more than maxSize {max}")));
//         }
//         Ok(req.requested_bytes) // the new size: a directory has no size of its own
//     }
// }

impl Provisioner for Guest {
    fn describe() -> PluginInfo {
        PluginInfo::new("{{name}}", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let (node_path, guest_root, max) = settings(&Params::new(&req.class.parameters))?;
        if req.claim.requested_bytes > max {
            return Err(ProvisionError::Infeasible(format!(
                "{{name}}: the claim asks for {} bytes, more than maxSize {max}",
                req.claim.requested_bytes
            )));
        }
        let name = sdk::path::check_pv_name(&req.volume_name)?;
        let dir = sdk::path::join(&guest_root, name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ProvisionError::Failed(format!("{{name}}: cannot create {dir}: {e}")))?;
        log::info!("provisioned", volume = name, dir = dir);
        let source = VolumeSource::host_path(sdk::path::join(&node_path, name), Some("Directory"));
        Ok(Volume::new(req.claim.requested_bytes, source).annotate("{{name}}/guest-root", guest_root))
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let params = Params::new(&req.class_parameters);
        let annotated = sdk::lookup(&req.volume.annotations, "{{name}}/guest-root");
        let guest_root = params.absolute_path("guestRoot", Some(annotated.unwrap_or("/volumes")), "")?;
        let name = sdk::path::check_pv_name(&req.volume.name)?;
        let dir = sdk::path::join(&guest_root, name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DeleteError::Failed(format!("{{name}}: cannot delete {dir}: {e}"))),
        }
        log::info!("deleted", volume = name, dir = dir);
        Ok(())
    }
}

sdk::export!(Guest, capabilities: [validate_class]);

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_provisioner_sdk::testing;

    #[test]
    fn claims_above_max_size_are_infeasible() {
        let mut req = testing::provision_request(&[("nodePath", "/srv"), ("maxSize", "1000")]);
        req.claim.requested_bytes = 1001;
        assert!(matches!(Guest::provision(&req), Err(ProvisionError::Infeasible(_))));
    }

    #[test]
    fn typos_are_infeasible() {
        let req = testing::provision_request(&[("nodepath", "/srv")]);
        assert!(matches!(Guest::provision(&req), Err(ProvisionError::Infeasible(_))));
    }

    #[test]
    fn typos_are_refused_by_validate_class() {
        let req = testing::provision_request(&[("nodepath", "/srv")]);
        assert!(Guest::validate_class(&req.class).is_err());
        let req = testing::provision_request(&[("nodePath", "/srv")]);
        assert_eq!(Guest::validate_class(&req.class), Ok(()));
    }
}
