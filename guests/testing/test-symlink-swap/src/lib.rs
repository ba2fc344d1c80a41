//! Swaps a directory inside its read-write grant for a symlink out of the grant, then
//! looks through another grant, to test that a granted directory is the directory that
//! was opened at start, never whatever a path names at call time.
//!
//! `provision`, by class parameter `action`:
//! - `swap`: in the grant at `root`, renames the directory `victim` to
//!   `<victim>.swapped-away` and puts a symlink `victim -> <linkTarget>` in its place
//!   (raw `rename-at` and `symlink-at` through the grant's descriptor). Answers a volume
//!   annotated `symlink-swap/swapped`, or `failed` with the WASI error.
//! - `probe`: lists the grant at `dir` and tries to write `<dir>/written-by-probe`.
//!   Answers a volume annotated `symlink-swap/listing` (entry names, sorted, joined by
//!   `,`) and `symlink-swap/write` (`ok` or the error).
//!
//! `describe` and `delete` are normal.
use std::fs;
use wasip2::filesystem::preopens::get_directories;
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct SymlinkSwap;

fn failed(message: String) -> ProvisionError {
    ProvisionError::Failed(format!("test-symlink-swap: {message}"))
}

fn swap(params: &Params) -> Result<Volume, ProvisionError> {
    let root = params.get_or("root", "/work").trim_end_matches('/');
    let victim = params.get_or("victim", "shared");
    let target = params.get_or("linkTarget", "../../../../../../../..");
    let preopens = get_directories();
    let (dir, _) = preopens
        .iter()
        .find(|(_, path)| path.trim_end_matches('/') == root)
        .ok_or_else(|| failed(format!("no preopened directory {root}")))?;
    let away = format!("{victim}.swapped-away");
    dir.rename_at(victim, dir, &away)
        .map_err(|e| failed(format!("rename {victim} -> {away}: {}", e.name())))?;
    dir.symlink_at(target, victim)
        .map_err(|e| failed(format!("symlink {victim} -> {target}: {}", e.name())))?;
    Ok(Volume::new(0, VolumeSource::Json("{}".into())).annotate(
        "symlink-swap/swapped",
        format!("{root}/{victim} -> {target}"),
    ))
}

fn probe(params: &Params) -> Result<Volume, ProvisionError> {
    let dir = params.get_or("dir", "/shared").trim_end_matches('/');
    let mut listing: Vec<String> = fs::read_dir(dir)
        .map_err(|e| failed(format!("listing {dir}: {e}")))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    listing.sort();
    let write = match fs::write(format!("{dir}/written-by-probe"), b"probe\n") {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    Ok(Volume::new(0, VolumeSource::Json("{}".into()))
        .annotate("symlink-swap/listing", listing.join(","))
        .annotate("symlink-swap/write", write))
}

impl Provisioner for SymlinkSwap {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-symlink-swap", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let params = Params::new(&req.class.parameters);
        match params.get_or("action", "probe") {
            "swap" => swap(&params),
            "probe" => probe(&params),
            other => Err(failed(format!("unknown action {other:?}"))),
        }
    }

    fn delete(_: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(SymlinkSwap);
