//! The guest components built from `guests/` (see `guests/README.md`).
//!
//! [`dist_dir`] runs `bash guests/build.sh` once per test process (a warm build is a
//! cargo no-op, well under a second) and returns `guests/dist`, which holds
//! `<name>.wasm` for every guest: `hostpath`, `nfs-subdir`, `minimal`, and one testing
//! guest per crate under `guests/testing/` (`test-echo`, `test-escape`,
//! `test-symlink-swap`, `test-publish`, ...).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use wasm_provisioner_rules::types::{
    AccessMode, BindingMode, Claim, Class, ProvisionRequest, ReclaimPolicy, VolumeMode,
};
use wasm_provisioner_runtime::{Grants, LoadedModule, Runtime, RuntimeConfig};

/// The repository root (this crate lives in `<root>/tests`).
fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent directory", manifest_dir.display()))
        .to_path_buf()
}

/// `guests/dist`, after building every guest once in this process. Panics with the
/// build's output if the build fails.
pub fn dist_dir() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let script = repo_root().join("guests").join("build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .current_dir(repo_root())
            .output()
            .unwrap_or_else(|e| panic!("cannot run bash {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            panic!(
                "building the guests failed: bash {} exited with {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                script.display(),
                output.status
            );
        }
        stdout
            .lines()
            .last()
            .map(|line| PathBuf::from(line.trim()))
            .filter(|dist| dist.is_dir())
            .unwrap_or_else(|| {
                panic!(
                    "bash {} succeeded but did not print an existing dist directory on its last line\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                    script.display()
                )
            })
    })
}

/// The built component `dist/<name>.wasm` (such as `module("test-echo")`). Panics if
/// there is no such guest.
pub fn module(name: &str) -> PathBuf {
    let dist = dist_dir();
    let path = dist.join(format!("{name}.wasm"));
    if !path.is_file() {
        let mut available: Vec<String> = std::fs::read_dir(dist)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(|n| n.strip_suffix(".wasm"))
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        available.sort();
        panic!(
            "no guest module {name:?}: {} does not exist (built guests: {})",
            path.display(),
            available.join(", ")
        );
    }
    path
}

/// A guest build kept in `guests/fixtures/` (such as `hostpath-0.1.0`, the last 0.1
/// contract build of hostpath). Panics if there is no such file.
pub fn fixture(name: &str) -> PathBuf {
    let path = repo_root()
        .join("guests")
        .join("fixtures")
        .join(format!("{name}.wasm"));
    assert!(path.is_file(), "no guest fixture {}", path.display());
    path
}

/// Copies the built guest `name` into the modules directory `dir` as `<as_name>.wasm`
/// (write-then-rename, so a watcher never sees a half-written module). Panics on failure.
pub fn copy_module(name: &str, dir: &Path, as_name: &str) {
    let from = module(name);
    let to = dir.join(format!("{as_name}.wasm"));
    let tmp = dir.join(format!(".{as_name}.wasm.{}.tmp", std::process::id()));
    std::fs::copy(&from, &tmp)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, &to)
        .unwrap_or_else(|e| panic!("cannot rename {} to {}: {e}", tmp.display(), to.display()));
}

/// A provision request for a 1 MiB filesystem claim `default/data` of class `test` with
/// these class parameters: what runtime tests hand a guest directly.
pub fn provision_request(parameters: &[(&str, &str)]) -> ProvisionRequest {
    ProvisionRequest {
        volume_name: "pvc-0b6e3d4e-1111-4c3a-9d7e-000000000001".into(),
        claim: Claim {
            name: "data".into(),
            namespace: "default".into(),
            uid: "0b6e3d4e-1111-4c3a-9d7e-000000000001".into(),
            labels: vec![],
            annotations: vec![],
            access_modes: vec![AccessMode::ReadWriteOnce],
            requested_bytes: 1024 * 1024,
            limit_bytes: None,
            volume_mode: VolumeMode::Filesystem,
            data_source: None,
            selector: None,
        },
        class: Class {
            name: "test".into(),
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            reclaim_policy: ReclaimPolicy::Delete,
            mount_options: vec![],
            allowed_topologies: vec![],
            binding_mode: BindingMode::Immediate,
            allow_volume_expansion: false,
        },
        selected_node: None,
        secret: None,
        context: Default::default(),
    }
}

/// A plugin runtime with these grants (YAML), no compile cache and default limits.
pub fn runtime(grants_yaml: &str) -> Runtime {
    let grants = Grants::from_yaml(grants_yaml, "test grants").expect("valid grants");
    Runtime::new(RuntimeConfig {
        grants,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

/// Loads built guest `guest` as module `name` and returns the version in service.
pub async fn load(runtime: &Runtime, name: &str, guest: &str) -> std::sync::Arc<LoadedModule> {
    runtime
        .load_file(name, &module(guest))
        .await
        .unwrap_or_else(|error| panic!("loading {guest} as {name}: {error}"));
    runtime.module(name).expect("module in service")
}
