//! The host's own filesystem boundaries, attacked: granted directories swapped for
//! symlinks, a tampered or world-writable compile cache, and module files that lead out
//! of the modules directory or never end. No cluster needed.
//!
//! Each test is the attack; it must fail (the attack works) when the defence is removed.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use wasm_provisioner_rules::types::{ProvisionRequest, Volume};
use wasm_provisioner_runtime::{
    Grants, LoadError, LoadOutcome, LoadedModule, Runtime, RuntimeConfig, RuntimeError,
};
use wasm_provisioner_tests::guests::{self, load, runtime};

fn config(grants_yaml: &str, cache_dir: Option<PathBuf>) -> RuntimeConfig {
    RuntimeConfig {
        grants: Grants::from_yaml(grants_yaml, "test grants").expect("valid grants"),
        cache_dir,
        ..RuntimeConfig::default()
    }
}

fn request(parameters: &[(&str, &str)]) -> ProvisionRequest {
    guests::provision_request(parameters)
}

fn annotation<'a>(volume: &'a Volume, key: &str) -> &'a str {
    volume
        .annotations
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no annotation {key} in {volume:?}"))
}

/// Calls the test-symlink-swap guest; panics unless it answers a volume.
async fn swap_guest(module: &LoadedModule, parameters: &[(&str, &str)]) -> Volume {
    match module.provision(&request(parameters)).await {
        Ok(Ok(volume)) => volume,
        other => panic!("test-symlink-swap {parameters:?}: {other:?}"),
    }
}

/// A scratch tree: `allow/` (the admin's allowlist entry) and `outside/secret`, which no
/// grant covers.
struct Tree {
    root: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("allow")).unwrap();
        std::fs::create_dir(root.path().join("outside")).unwrap();
        std::fs::write(root.path().join("outside/secret"), b"outside").unwrap();
        Tree { root }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// A directory holding a file `marker`, so a listing tells it apart.
    fn dir_with_marker(&self, relative: &str) -> PathBuf {
        let dir = self.path(relative);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("marker"), b"inside").unwrap();
        dir
    }

    fn assert_outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(self.path("outside"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "the guest wrote outside its grants");
    }
}

// ---------------------------------------------------------------------------------
// Item: a granted directory is opened once, without following symlinks.
// ---------------------------------------------------------------------------------

/// A module swaps a directory inside its read-write grant for a relative symlink out of
/// the grant, where another module's grant leads. The grants do not nest as written (the
/// grants file refuses a read-write grant overlapping another), but the victim's path
/// goes through a symlink into the attacker's directory. Before the fix the victim's
/// next call followed the swapped link out. Now either defence stops it: the host
/// refuses at start a grant that goes through a symlink; and had it opened it, the
/// victim would keep the directory opened at start.
#[tokio::test]
async fn a_module_swapping_a_directory_on_another_grant_s_path_cannot_redirect_it() {
    let tree = Tree::new();
    let data = tree.dir_with_marker("allow/data");
    tree.dir_with_marker("allow/data/victim");
    symlink("data", tree.path("allow/via")).unwrap();
    let victim_grant = tree.path("allow/via/victim");
    let grants = format!(
        "allow: {{ directories: [{allow}] }}\n\
         modules:\n\
         \x20 attacker: {{ directories: [{{ host: {data}, guest: /work, mode: read-write }}] }}\n\
         \x20 victim: {{ directories: [{{ host: {victim_grant}, guest: /shared, mode: read-write }}] }}\n",
        allow = tree.path("allow").display(),
        data = data.display(),
        victim_grant = victim_grant.display(),
    );
    let runtime = match Runtime::new(config(&grants, None)) {
        Err(error) => {
            // The defence at start: the grant is refused, naming the module and path.
            let message = error.to_string();
            assert!(matches!(error, RuntimeError::Grant { .. }), "{message}");
            assert!(message.contains("module victim"), "{message}");
            assert!(
                message.contains(&victim_grant.display().to_string())
                    && message.contains("is a symlink"),
                "{message}"
            );
            return;
        }
        Ok(runtime) => runtime,
    };
    let attacker = load(&runtime, "attacker", "test-symlink-swap").await;
    let victim = load(&runtime, "victim", "test-symlink-swap").await;
    let swapped = swap_guest(
        &attacker,
        &[
            ("action", "swap"),
            ("root", "/work"),
            ("victim", "victim"),
            ("linkTarget", "../../outside"),
        ],
    )
    .await;
    assert_eq!(
        annotation(&swapped, "symlink-swap/swapped"),
        "/work/victim -> ../../outside"
    );
    let probe = swap_guest(&victim, &[("action", "probe"), ("dir", "/shared")]).await;
    assert_eq!(
        annotation(&probe, "symlink-swap/listing"),
        "marker",
        "the victim's grant must stay the directory granted at start"
    );
    tree.assert_outside_untouched();
}

/// Any other writer (here the test) swaps a granted directory, and separately a
/// directory on the path to another grant, for symlinks out; the module keeps seeing
/// the directories opened at start.
#[tokio::test]
async fn directories_swapped_by_another_writer_are_not_followed() {
    let tree = Tree::new();
    let data = tree.dir_with_marker("allow/data");
    let nested = tree.dir_with_marker("allow/parent/nested");
    let runtime = runtime(&format!(
        "allow: {{ directories: [{allow}] }}\n\
         modules:\n  swap:\n    directories:\n\
         \x20     - {{ host: {data}, guest: /data, mode: read-write }}\n\
         \x20     - {{ host: {nested}, guest: /nested, mode: read-only }}\n",
        allow = tree.path("allow").display(),
        data = data.display(),
        nested = nested.display(),
    ));
    let swap = load(&runtime, "swap", "test-symlink-swap").await;

    // The grant root itself becomes an absolute symlink out...
    std::fs::rename(&data, tree.path("allow/data.old")).unwrap();
    symlink(tree.path("outside"), &data).unwrap();
    // ...and a directory on the way to the other grant a relative one.
    std::fs::rename(tree.path("allow/parent"), tree.path("allow/parent.old")).unwrap();
    std::fs::create_dir(tree.path("allow/parent")).unwrap();
    symlink("../../outside", &nested).unwrap();

    let probe = swap_guest(&swap, &[("action", "probe"), ("dir", "/data")]).await;
    assert_eq!(annotation(&probe, "symlink-swap/listing"), "marker");
    assert_eq!(annotation(&probe, "symlink-swap/write"), "ok");
    assert!(tree.path("allow/data.old/written-by-probe").is_file());

    let probe = swap_guest(&swap, &[("action", "probe"), ("dir", "/nested")]).await;
    assert_eq!(annotation(&probe, "symlink-swap/listing"), "marker");
    assert_ne!(
        annotation(&probe, "symlink-swap/write"),
        "ok",
        "a read-only grant"
    );
    tree.assert_outside_untouched();
}

/// A grant whose path is, or goes through, a symlink at start is refused at start,
/// naming the module and the path.
#[tokio::test]
async fn a_grant_through_a_symlink_is_refused_at_start() {
    let tree = Tree::new();
    let real = tree.dir_with_marker("allow/real");
    symlink("real", tree.path("allow/link")).unwrap();
    tree.dir_with_marker("allow/real/inner");
    for (granted, symlink_at) in [
        (tree.path("allow/link"), tree.path("allow/link")),
        (tree.path("allow/link/inner"), tree.path("allow/link")),
    ] {
        let error = Runtime::new(config(
            &format!(
                "allow: {{ directories: [{allow}] }}\n\
                 modules: {{ swap: {{ directories: [{{ host: {granted}, guest: /data, mode: read-write }}] }} }}",
                allow = tree.path("allow").display(),
                granted = granted.display(),
            ),
            None,
        ))
        .err()
        .unwrap_or_else(|| panic!("a grant of {} was accepted", granted.display()));
        let message = error.to_string();
        assert!(matches!(error, RuntimeError::Grant { .. }), "{message}");
        assert!(message.contains("module swap"), "{message}");
        assert!(
            message.contains(&granted.display().to_string()),
            "{message}"
        );
        assert!(
            message.contains(&symlink_at.display().to_string()) && message.contains("symlink"),
            "{message}"
        );
        assert!(message.contains(&real.display().to_string()), "{message}");
    }

    // A file where a directory is granted.
    std::fs::write(tree.path("allow/file"), b"x").unwrap();
    let error = Runtime::new(config(
        &format!(
            "allow: {{ directories: [{allow}] }}\n\
             modules: {{ swap: {{ directories: [{{ host: {granted}, guest: /data, mode: read-only }}] }} }}",
            allow = tree.path("allow").display(),
            granted = tree.path("allow/file").display(),
        ),
        None,
    ))
    .err()
    .expect("a grant of a file was accepted");
    let message = error.to_string();
    assert!(
        message.contains("module swap") && message.contains("not a directory"),
        "{message}"
    );
}

/// A granted directory missing at start does not stop the host: the module cannot run
/// (its `describe` needs its sandbox) until the directory exists; the next scan after
/// that loads it, with the directory opened under the same checks.
#[tokio::test]
async fn a_granted_directory_missing_at_start_is_used_once_it_exists() {
    let tree = Tree::new();
    let later = tree.path("allow/later");
    let runtime = runtime(&format!(
        "allow: {{ directories: [{allow}] }}\n\
         modules: {{ swap: {{ directories: [{{ host: {later}, guest: /data, mode: read-write }}] }} }}",
        allow = tree.path("allow").display(),
        later = later.display(),
    ));
    let (_root, modules) = modules_dir();
    guests::copy_module("test-symlink-swap", &modules, "swap");
    let report = runtime.sync_dir(&modules).await.unwrap();
    assert_eq!(report.refused.len(), 1, "{report:?}");
    let message = report.refused[0].to_string();
    assert!(
        message.contains("module swap")
            && message.contains(&later.display().to_string())
            && message.contains("does not exist"),
        "{message}"
    );

    tree.dir_with_marker("allow/later");
    let report = runtime.sync_dir(&modules).await.unwrap();
    assert_eq!(report.loaded, ["swap"], "{report:?}");
    let swap = runtime.module("swap").unwrap();
    let probe = swap_guest(&swap, &[("action", "probe"), ("dir", "/data")]).await;
    assert_eq!(annotation(&probe, "symlink-swap/listing"), "marker");
}

// ---------------------------------------------------------------------------------
// Item: the compile cache is private and its entries are verified.
// ---------------------------------------------------------------------------------

/// Copies every cache file of module version `from` (entry and whatever sits beside
/// it) over the names of version `to`: a valid entry of another module, so it
/// deserialises fine.
fn swap_cache_entries(dir: &Path, from: &str, to: &str) -> usize {
    let mut swapped = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(rest) = name.strip_prefix(from) {
            let staging = dir.join(format!("{to}{rest}.attack"));
            std::fs::copy(dir.join(&name), &staging).unwrap();
            std::fs::rename(&staging, dir.join(format!("{to}{rest}"))).unwrap();
            swapped += 1;
        }
    }
    swapped
}

#[tokio::test]
async fn a_swapped_cache_entry_is_refused_and_compiled_again() {
    let scratch = tempfile::tempdir().unwrap();
    let cache = scratch.path().join("cache");
    {
        let first = Runtime::new(config("", Some(cache.clone()))).unwrap();
        load(&first, "echo", "test-echo").await;
        load(&first, "escape", "test-escape").await;
        assert_eq!(first.metrics().compiles_total(), 2);
    }
    let echo_sha = sha256_of(&guests::module("test-echo"));
    let escape_sha = sha256_of(&guests::module("test-escape"));
    assert!(swap_cache_entries(&cache, &escape_sha, &echo_sha) >= 1);

    // A restart: echo's entry now holds test-escape's native code.
    let second = Runtime::new(config("", Some(cache.clone()))).unwrap();
    let echo = load(&second, "echo", "test-echo").await;
    assert_eq!(
        echo.info().name,
        "test-echo",
        "the swapped entry ran another module's code under echo's name and grants"
    );
    assert_eq!(
        (
            second.metrics().compiles_total(),
            second.metrics().cache_hits_total()
        ),
        (1, 0),
        "the swapped entry must count as a miss"
    );
    // The entry was replaced by a good one: the next restart hits it.
    drop((second, echo));
    let third = Runtime::new(config("", Some(cache))).unwrap();
    let echo = load(&third, "echo", "test-echo").await;
    assert_eq!(echo.info().name, "test-echo");
    assert_eq!(third.metrics().cache_hits_total(), 1);
}

#[test]
fn a_cache_directory_others_can_write_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    for mode in [0o777, 0o770, 0o707, 0o750] {
        let cache = scratch.path().join(format!("cache-{mode:o}"));
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode)).unwrap();
        let error = Runtime::new(config("", Some(cache.clone())))
            .err()
            .unwrap_or_else(|| panic!("a cache directory with mode {mode:o} was accepted"));
        let message = error.to_string();
        assert!(matches!(error, RuntimeError::Cache { .. }), "{message}");
        assert!(
            message.contains(&cache.display().to_string()) && message.contains("chmod 700"),
            "{message}"
        );
    }
    // Created by the host: private, and so is its key.
    let cache = scratch.path().join("new/cache");
    Runtime::new(config("", Some(cache.clone()))).unwrap();
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    for entry in std::fs::read_dir(&cache).unwrap() {
        let entry = entry.unwrap();
        let mode = entry.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", entry.path().display());
    }
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

// ---------------------------------------------------------------------------------
// Item: module files are regular files inside the modules directory, bounded.
// ---------------------------------------------------------------------------------

fn modules_dir() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let modules = root.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    (root, modules)
}

/// Loads `dir/NAME.wasm` through a directory scan, as the host does, and expects it
/// refused with `reason` in the error; the version in service (if any) keeps serving.
async fn assert_scan_refuses(runtime: &Runtime, dir: &Path, name: &str, reason: &str) {
    let scan = tokio::time::timeout(std::time::Duration::from_secs(20), runtime.sync_dir(dir))
        .await
        .expect("the scan must not hang on the file")
        .expect("the directory lists");
    let refused: Vec<&LoadError> = scan.refused.iter().filter(|e| e.module() == name).collect();
    assert_eq!(refused.len(), 1, "{name} not refused: {scan:?}");
    let message = refused[0].to_string();
    assert!(message.contains(&format!("module {name}")), "{message}");
    assert!(
        message.contains(&dir.join(format!("{name}.wasm")).display().to_string()),
        "{message}"
    );
    assert!(message.contains(reason), "{message}");
}

#[tokio::test]
async fn a_module_linked_to_proc_pagemap_is_refused_without_reading_it() {
    let (_root, modules) = modules_dir();
    symlink("/proc/self/pagemap", modules.join("pagemap.wasm")).unwrap();
    let runtime = runtime("");
    assert_scan_refuses(
        &runtime,
        &modules,
        "pagemap",
        "outside the modules directory",
    )
    .await;
    assert!(runtime.module("pagemap").is_none());
}

#[tokio::test]
async fn a_module_linked_out_of_the_directory_is_refused_and_the_old_version_serves() {
    let (root, modules) = modules_dir();
    let runtime = runtime("");
    guests::copy_module("test-echo", &modules, "echo");
    let report = runtime.sync_dir(&modules).await.unwrap();
    assert_eq!(report.loaded, ["echo"]);
    let serving = runtime.module("echo").unwrap().sha256().to_string();

    // An absolute link to a valid module outside the directory.
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::copy(guests::module("test-escape"), elsewhere.join("escape.wasm")).unwrap();
    std::fs::remove_file(modules.join("echo.wasm")).unwrap();
    symlink(elsewhere.join("escape.wasm"), modules.join("echo.wasm")).unwrap();
    assert_scan_refuses(&runtime, &modules, "echo", "outside the modules directory").await;
    assert_eq!(runtime.module("echo").unwrap().sha256(), serving);

    // A relative link climbing out.
    std::fs::remove_file(modules.join("echo.wasm")).unwrap();
    symlink("../elsewhere/escape.wasm", modules.join("echo.wasm")).unwrap();
    assert_scan_refuses(&runtime, &modules, "echo", "outside the modules directory").await;
    assert_eq!(runtime.module("echo").unwrap().sha256(), serving);
    assert_eq!(runtime.module("echo").unwrap().info().name, "test-echo");
}

#[tokio::test]
async fn an_oversized_module_is_refused_before_it_is_read() {
    let (_root, modules) = modules_dir();
    guests::copy_module("test-echo", &modules, "echo");
    let size = std::fs::metadata(modules.join("echo.wasm")).unwrap().len();
    let capped = |max| {
        Runtime::new(RuntimeConfig {
            max_module_bytes: max,
            ..config("", None)
        })
        .unwrap()
    };
    let runtime = capped(size - 1);
    assert_scan_refuses(
        &runtime,
        &modules,
        "echo",
        &format!("{size} bytes, more than the {} bytes", size - 1),
    )
    .await;
    assert!(runtime.module("echo").is_none());
    // At the cap exactly it loads.
    let runtime = capped(size);
    assert_eq!(runtime.sync_dir(&modules).await.unwrap().loaded, ["echo"]);
    // The default is 64 MiB.
    assert_eq!(RuntimeConfig::default().max_module_bytes, 64 * 1024 * 1024);
}

/// kubelet's layout `NAME.wasm -> ..data/NAME.wasm -> ..2026_.../NAME.wasm` stays
/// inside the directory and loads.
#[tokio::test]
async fn the_configmap_layout_still_loads() {
    let (_root, modules) = modules_dir();
    let stamp = "..2026_12_03_08_00_00.123456789";
    std::fs::create_dir(modules.join(stamp)).unwrap();
    std::fs::copy(
        guests::module("test-echo"),
        modules.join(stamp).join("echo.wasm"),
    )
    .unwrap();
    symlink(stamp, modules.join("..data")).unwrap();
    symlink("..data/echo.wasm", modules.join("echo.wasm")).unwrap();
    let runtime = runtime("");
    let report = runtime.sync_dir(&modules).await.unwrap();
    assert_eq!(report.loaded, ["echo"], "{report:?}");
    assert!(matches!(
        runtime
            .load_file("echo", &modules.join("echo.wasm"))
            .await
            .unwrap(),
        LoadOutcome::Unchanged
    ));
}
