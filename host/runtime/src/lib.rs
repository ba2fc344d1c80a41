//! The plugin runtime: loading, sandboxing and calling guest components. It speaks the
//! rules' contract types (`wasm_provisioner_rules::types`) and never Kubernetes' API.
//!
//! - [`Runtime`] holds the one wasmtime `Engine` and the modules in service, loads and
//!   swaps versions ([`Runtime::load_file`], [`Runtime::sync_dir`]) and resolves the
//!   module a class names ([`Runtime::resolve`], with `moduleSHA256` pinning).
//! - [`LoadedModule`] is one version of one module; every call runs in a fresh sandbox
//!   under the module's [`Limits`] and fails alone with a [`CallError`].
//! - [`grants`] reads the admin's grants file: directories, outbound HTTP, limits.
//! - [`reload`] watches the modules directory (ConfigMap-style symlink swaps included).
//! - [`source`] pulls modules the grants file names as OCI artifacts (by digest or tag),
//!   keeps them in a content-addressed store and checks their cosign signatures.
//! - [`cache`] keeps precompiled components on disk; [`compile`] compiles a module in
//!   a child process bounded in time and memory.
//! - [`pool`] bounds each module's share of the shared instance pool.
//!
//! One module per capability handed to guests: [`log`] (the `log` import, stdout and
//! stderr), [`http`] (outbound `wasi:http`), the filesystem through preopens in
//! [`sandbox`], with the links and moves it refuses in `sandbox::fs_rules`.

mod answer;
mod bindings;
pub mod cache;
pub mod compile;
mod contract;
pub mod engine;
pub mod error;
pub mod grants;
mod guest;
mod http;
mod log;
pub mod metrics;
mod module;
mod module_file;
pub mod pool;
mod publish;
pub mod reload;
mod runtime;
mod sandbox;
pub mod source;

pub use compile::{CompileFailure, CompilerConfig};
pub use error::{Call, CallError, CallTarget, LoadError, ResolveError};
pub use grants::directories::{GrantDirectoryError, GrantDirectoryProblem};
pub use grants::limits::{self, Limits};
pub use grants::volumes::{SourceRefused, VolumeDirectory, VolumeGrants};
pub use grants::{Grants, GrantsError, ModuleGrants};
pub use guest::ContractVersion;
pub use metrics::{Metrics, ModuleCounters};
pub use module::{LoadedModule, VERSION_DIGITS};
pub use module_file::DEFAULT_MAX_MODULE_BYTES;
pub use publish::{Unpublishable, check_publishable, publishable_volume, volume_to_publish};
pub use reload::{DirectoryWatcher, ReloadError, SyncReport};
pub use runtime::{LoadOutcome, Runtime, RuntimeConfig, RuntimeError, VersionGate, class_pin};
pub use source::{SourceConfig, SourceWatcher};

/// Most characters of a module name.
pub const MAX_MODULE_NAME: usize = 63;

/// Whether `name` can name a module: a DNS label (lowercase letters, digits and '-',
/// starting and ending with a letter or digit, at most 63 characters), so it is safe in
/// file names, class parameters, logs and metric labels alike.
pub fn is_valid_module_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_MODULE_NAME
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::is_valid_module_name;

    #[test]
    fn module_names_are_dns_labels() {
        for good in ["hostpath", "nfs-subdir", "a", "x1", &"a".repeat(63)] {
            assert!(is_valid_module_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Hostpath",
            "a_b",
            "a.b",
            "../x",
            &"a".repeat(64),
        ] {
            assert!(!is_valid_module_name(bad), "{bad}");
        }
    }
}
