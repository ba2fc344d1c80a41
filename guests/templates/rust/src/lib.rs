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

/// The class's parameters. `deleteChunkEntries` bounds the work of one `delete` call
/// (the SDK's `Budget`, default 100 000 entries).
const KNOWN: &[&str] = &["nodePath", "guestRoot", "maxSize", sdk::fs::Budget::PARAMETER];

/// The class's parameters, checked: (nodePath, guestRoot, maxSize in bytes).
fn settings(params: &Params) -> Result<(String, String, u64), ParamError> {
    params.reject_unknown(KNOWN)?;
    let node_path = params.absolute_path("nodePath", None, "the granted directory on the nodes")?;
    let guest_root = params.absolute_path("guestRoot", Some("/volumes"), "")?;
    // A Kubernetes quantity (10Gi, 500M, 1.5Gi), read exactly as the API server reads it.
    let max = params.quantity("maxSize", Some("1Gi"), "")?;
    sdk::fs::Budget::from_params(params)?;
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

    /// Deletes the volume's directory in bounded, resumable chunks (what a tenant wrote
    /// is hostile input: deep trees, huge directories, names WASI cannot spell): the
    /// directory is moved into a trash directory of `guestRoot` at once, then emptied
    /// within the class's budget per call; until it is gone the answer is
    /// `in-background` and the host calls again. Never follows a symbolic link.
    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let params = Params::new(&req.class_parameters);
        let annotated = sdk::lookup(&req.volume.annotations, "{{name}}/guest-root");
        let guest_root = params.absolute_path("guestRoot", Some(annotated.unwrap_or("/volumes")), "")?;
        let budget = sdk::fs::Budget::from_params(&params)?;
        let name = sdk::path::check_pv_name(&req.volume.name)?;
        let dir = sdk::path::join(&guest_root, name);
        let root = sdk::fs::Dir::open(&guest_root)
            .map_err(|e| DeleteError::Failed(format!("{{name}}: cannot open {guest_root}: {e}")))?;
        let deletion = sdk::fs::delete_volume_dir(&root, &root, name, name, budget)
            .map_err(|e| DeleteError::Failed(format!("{{name}}: cannot delete {dir}: {e}")))?;
        // Success once the directory is gone; `in-background` (logged) while it is not.
        sdk::fs::delete_answer(name, &dir, deletion)
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
    fn sizes_are_kubernetes_quantities() {
        let mut req = testing::provision_request(&[("nodePath", "/srv"), ("maxSize", "1.5Gi")]);
        req.claim.requested_bytes = 3 << 29;
        assert!(Guest::validate_class(&req.class).is_ok());
        let req = testing::provision_request(&[("nodePath", "/srv"), ("maxSize", "10GB")]);
        assert!(Guest::validate_class(&req.class).unwrap_err().contains("10GB"));
    }

    #[test]
    fn typos_are_refused_by_validate_class() {
        let req = testing::provision_request(&[("nodepath", "/srv")]);
        assert!(Guest::validate_class(&req.class).is_err());
        let req = testing::provision_request(&[("nodePath", "/srv")]);
        assert_eq!(Guest::validate_class(&req.class), Ok(()));
    }

    /// Natively the SDK's `Dir` works on paths: provision, fill, then delete in chunks
    /// of one entry (`in-background` until the directory is gone).
    #[test]
    fn delete_goes_on_in_chunks_until_the_directory_is_gone() {
        let root = std::env::temp_dir().join(format!("{{name}}-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let root_text = root.to_str().unwrap();
        let params = [("nodePath", "/srv"), ("guestRoot", root_text), ("deleteChunkEntries", "1")];
        let req = testing::provision_request(&params);
        let volume = Guest::provision(&req).unwrap();
        let dir = root.join(&req.volume_name);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        for i in 0..5 {
            std::fs::write(dir.join(format!("a/b/file-{i}")), "data").unwrap();
        }
        let delete = testing::delete_request(&req, &volume, &params);
        let mut calls = 0;
        while let Err(DeleteError::InBackground(_)) = Guest::delete(&delete) {
            calls += 1;
            assert!(calls < 20, "the delete never finished");
        }
        assert!(calls >= 2, "a budget of one entry takes several calls, not {calls}");
        assert!(!dir.exists());
        assert!(Guest::delete(&delete).is_ok(), "deleting again is a success");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
