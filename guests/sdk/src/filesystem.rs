//! The size and free space of a granted filesystem (the host's `filesystem` import):
//! what a plugin answers `get-capacity` with, and checks an expansion against.

pub use crate::bindings::wasm_provisioner::plugin::filesystem::FilesystemStats;

/// `statvfs` of the granted filesystem holding `path`, a guest path inside a directory
/// granted to this module (such as its `guestRoot`). The error says why, for the Event.
#[cfg(target_arch = "wasm32")]
pub fn stat_filesystem(path: &str) -> Result<FilesystemStats, String> {
    crate::bindings::wasm_provisioner::plugin::filesystem::stat_filesystem(path)
}

/// Natively (unit tests) there is no host to ask.
#[cfg(not(target_arch = "wasm32"))]
pub fn stat_filesystem(path: &str) -> Result<FilesystemStats, String> {
    Err(format!(
        "stat-filesystem {path:?}: only the wasm-provisioner host answers this"
    ))
}
