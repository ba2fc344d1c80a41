//! The plugin runtime: loading, sandboxing and calling guest components.
//!
//! - [`Runtime`] holds the one wasmtime `Engine` and the modules in service, loads and
//!   swaps versions ([`Runtime::load_file`], [`Runtime::sync_dir`]) and resolves the
//!   module a class names ([`Runtime::resolve`], with `moduleSHA256` pinning).
//! - [`LoadedModule`] is one version of one module; every call runs in a fresh sandbox
//!   under the module's [`Limits`] and fails alone with a [`CallError`].
//! - [`grants`] reads the admin's grants file: directories, outbound HTTP, limits.
//! - [`reload`] watches the modules directory (ConfigMap-style symlink swaps included).
//! - [`cache`] keeps precompiled components on disk; [`compile`] compiles a module in
//!   a child process bounded in time and memory.
//! - [`pool`] bounds each module's share of the shared instance pool.
//!
//! One module per capability handed to guests: [`log`] (the `log` import, stdout and
//! stderr), [`http`] (outbound `wasi:http`), the filesystem through preopens in
//! [`sandbox`], with the links and moves it refuses in [`fs_rules`].

mod answer;
pub mod bindings;
pub mod cache;
pub mod compile;
pub mod engine;
pub mod error;
mod fs_rules;
pub mod grants;
mod http;
pub mod limits;
mod log;
pub mod metrics;
mod module;
mod module_file;
pub mod pool;
mod preopen;
pub mod reload;
mod runtime;
mod sandbox;
pub mod volume_grants;

pub use bindings::types;
pub use compile::{CompileFailure, CompilerConfig};
pub use error::{Call, CallError, CallTarget, LoadError, ResolveError};
pub use grants::{Grants, GrantsError, ModuleGrants};
pub use limits::Limits;
pub use metrics::{Metrics, ModuleCounters};
pub use module::{LoadedModule, VERSION_DIGITS};
pub use module_file::DEFAULT_MAX_MODULE_BYTES;
pub use preopen::{GrantDirectoryError, GrantDirectoryProblem};
pub use reload::{DirectoryWatcher, ReloadError, SyncReport};
pub use runtime::{LoadOutcome, Runtime, RuntimeConfig, RuntimeError, class_pin};
pub use volume_grants::{SourceRefused, VolumeDirectory, VolumeGrants};

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
