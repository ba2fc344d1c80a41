//! {{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
//! inside the directory the cluster admin granted this module, published as the hostPath
//! `nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible.
use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Guest;

const KNOWN: &[&str] = &["nodePath", "guestRoot", "maxSize"];

impl Provisioner for Guest {
    fn describe() -> PluginInfo {
        PluginInfo::new("{{name}}", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let params = Params::new(&req.class.parameters);
        params.reject_unknown(KNOWN)?;
        let node_path = params.absolute_path("nodePath", None, "the granted directory on the nodes")?;
        let guest_root = params.absolute_path("guestRoot", Some("/volumes"), "")?;
        let max: u64 = params
            .get_or("maxSize", "1073741824")
            .parse()
            .map_err(|_| ProvisionError::Infeasible("`maxSize` must be a number of bytes".into()))?;
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

sdk::export!(Guest);

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
}
