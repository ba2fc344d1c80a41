//! Tries to get out of its granted directory on purpose.
//!
//! `provision` makes every attempt below against the grant at class parameter
//! `guestRoot` (default `/volumes`), cleans up the symlinks it made, and answers:
//! - all refused (the sandbox holds): `failed` with the message
//!   `test-escape: all N escape attempts refused: <attempt>: <error>; ...`;
//! - any succeeded (a sandbox bug): a volume with source json `{"escaped": true}` and
//!   annotations `test-escape/escaped` (the attempts that worked) and
//!   `test-escape/refused`.
//!
//! `describe` and `delete` are normal.
use std::fs;
use wasip2::filesystem::preopens::get_directories;
use wasip2::filesystem::types::{Descriptor, DescriptorFlags, OpenFlags, PathFlags};
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Escape;

const UP: &str = "../../../../../../../../../..";

/// Reads a file through the grant's descriptor with a raw `open-at`.
fn open_at_read(dir: &Descriptor, path: &str) -> Result<usize, String> {
    let file = dir
        .open_at(
            PathFlags::SYMLINK_FOLLOW,
            path,
            OpenFlags::empty(),
            DescriptorFlags::READ,
        )
        .map_err(|e| e.name().to_string())?;
    let (bytes, _) = file.read(4096, 0).map_err(|e| e.name().to_string())?;
    Ok(bytes.len())
}

fn std_read(path: &str) -> Result<usize, String> {
    fs::read(path).map(|b| b.len()).map_err(|e| e.to_string())
}

fn std_write(path: &str) -> Result<usize, String> {
    fs::write(path, b"escaped\n")
        .map(|_| 8)
        .map_err(|e| e.to_string())
}

/// Makes symlink `name` -> `target` inside the grant, then runs `attempt` through it.
fn via_link(
    dir: Option<&Descriptor>,
    name: &str,
    target: &str,
    attempt: impl FnOnce() -> Result<usize, String>,
) -> Result<usize, String> {
    let dir = dir.ok_or("no preopened descriptor for guestRoot")?;
    let _ = dir.unlink_file_at(name);
    dir.symlink_at(target, name)
        .map_err(|e| format!("creating the symlink: {}", e.name()))?;
    let result = attempt();
    let _ = dir.unlink_file_at(name);
    result
}

impl Provisioner for Escape {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-escape", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let root = Params::new(&req.class.parameters).get_or("guestRoot", "/volumes");
        let root = root.trim_end_matches('/');
        let preopens = get_directories();
        let dir = preopens
            .iter()
            .find(|(_, p)| p.trim_end_matches('/') == root)
            .map(|(d, _)| d);
        let in_root = |name: &str| format!("{root}/{name}");

        let attempts: Vec<(String, Result<usize, String>)> = vec![
            ("read /etc/passwd".into(), std_read("/etc/passwd")),
            (
                format!("read {root}/../../etc/passwd"),
                std_read(&in_root("../../etc/passwd")),
            ),
            (
                format!("write {root}/../escape-probe"),
                std_write(&in_root("../escape-probe")),
            ),
            (
                format!("open-at {UP}/etc/passwd in the grant"),
                match dir {
                    Some(d) => open_at_read(d, &format!("{UP}/etc/passwd")),
                    None => Err("no preopened descriptor for guestRoot".into()),
                },
            ),
            (
                "read through a relative symlink to /etc/passwd".into(),
                via_link(dir, "escape-rel", &format!("{UP}/etc/passwd"), || {
                    std_read(&in_root("escape-rel"))
                }),
            ),
            (
                "read through an absolute symlink to /etc/passwd".into(),
                via_link(dir, "escape-abs", "/etc/passwd", || {
                    std_read(&in_root("escape-abs"))
                }),
            ),
            (
                "read through a symlinked directory to /".into(),
                via_link(dir, "escape-dir", UP, || {
                    std_read(&in_root("escape-dir/etc/passwd"))
                }),
            ),
            (
                "write through a symlink to /tmp/escape-probe".into(),
                via_link(
                    dir,
                    "escape-write",
                    &format!("{UP}/tmp/escape-probe"),
                    || std_write(&in_root("escape-write")),
                ),
            ),
        ];

        let (escaped, refused): (Vec<_>, Vec<_>) = attempts.iter().partition(|(_, r)| r.is_ok());
        let refused: Vec<String> = refused
            .iter()
            .map(|(what, r)| format!("{what}: {}", r.as_ref().unwrap_err()))
            .collect();
        if escaped.is_empty() {
            return Err(ProvisionError::Failed(format!(
                "test-escape: all {} escape attempts refused: {}",
                attempts.len(),
                refused.join("; ")
            )));
        }
        let escaped: Vec<&str> = escaped.iter().map(|(what, _)| what.as_str()).collect();
        sdk::log::error!("test-escape: ESCAPED", attempts = escaped.join("; "));
        let source = VolumeSource::Json(r#"{"escaped": true}"#.into());
        Ok(Volume::new(req.claim.requested_bytes, source)
            .annotate("test-escape/escaped", escaped.join("; "))
            .annotate("test-escape/refused", refused.join("; ")))
    }

    fn delete(_: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(Escape);
