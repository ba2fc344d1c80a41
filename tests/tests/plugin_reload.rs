//! Hot reload from a ConfigMap-style modules directory: timestamped `..YYYY_...`
//! directories, the `..data` symlink swapped atomically by rename, and the visible
//! `NAME.wasm -> ..data/NAME.wasm` symlinks, exactly as kubelet's atomic writer lays
//! them out.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use wasm_provisioner_rules::types::ProvisionRequest;
use wasm_provisioner_runtime::{CallError, DirectoryWatcher, Runtime};
use wasm_provisioner_tests::guests::{self, runtime};

/// How long a change may take to be served: the debounce plus a compile, with room
/// for a loaded machine.
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// A directory laid out like a mounted ConfigMap.
struct ConfigMapDir {
    _root: tempfile::TempDir,
    path: PathBuf,
    generation: u32,
}

impl ConfigMapDir {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("modules");
        std::fs::create_dir(&path).unwrap();
        ConfigMapDir {
            _root: root,
            path,
            generation: 0,
        }
    }

    /// Publishes a new ConfigMap content: `(module name, wasm bytes)`.
    fn publish(&mut self, files: &[(&str, Vec<u8>)]) {
        self.generation += 1;
        let stamp = format!(
            "..2026_01_0{}_12_00_00.{}",
            self.generation % 10,
            1000 + self.generation
        );
        let new_dir = self.path.join(&stamp);
        std::fs::create_dir(&new_dir).unwrap();
        for (name, bytes) in files {
            std::fs::write(new_dir.join(format!("{name}.wasm")), bytes).unwrap();
        }
        let data = self.path.join("..data");
        let old_target = std::fs::read_link(&data).ok();
        // The atomic swap: a new symlink renamed over `..data`.
        let temporary = self.path.join("..data_tmp");
        std::os::unix::fs::symlink(&stamp, &temporary).unwrap();
        std::fs::rename(&temporary, &data).unwrap();
        // Visible symlinks: add the new keys, remove the keys gone.
        for (name, _) in files {
            let link = self.path.join(format!("{name}.wasm"));
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}.wasm"), &link).unwrap();
            }
        }
        for entry in std::fs::read_dir(&self.path).unwrap() {
            let path = entry.unwrap().path();
            let file_name = path.file_name().unwrap().to_str().unwrap().to_string();
            if let Some(name) = file_name.strip_suffix(".wasm")
                && !files.iter().any(|(n, _)| *n == name)
            {
                std::fs::remove_file(&path).unwrap();
            }
        }
        if let Some(old) = old_target {
            std::fs::remove_dir_all(self.path.join(old)).unwrap();
        }
    }
}

fn wasm(guest: &str) -> Vec<u8> {
    std::fs::read(guests::module(guest)).unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + RELOAD_WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The shared sample request, its class parameter `version` (test-echo answers it as
/// the annotation `echo/version`).
fn request(version: &str) -> ProvisionRequest {
    guests::provision_request(&[("version", version)])
}

async fn assert_serves(runtime: &Runtime, name: &str) {
    let module = runtime.module(name).expect("module in service");
    let answer = module
        .provision(&request("v"))
        .await
        .expect("call succeeds");
    assert!(answer.is_ok(), "{answer:?}");
}

#[tokio::test]
async fn initial_scan_loads_every_module() {
    let mut dir = ConfigMapDir::new();
    dir.publish(&[("echo", wasm("test-echo")), ("hostpath", wasm("hostpath"))]);
    let runtime = runtime("");
    let (_watcher, report) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    assert_eq!(report.loaded, ["echo", "hostpath"]);
    assert!(report.refused.is_empty());
    assert_serves(&runtime, "echo").await;
}

#[tokio::test]
async fn new_version_is_served_after_the_swap() {
    let mut dir = ConfigMapDir::new();
    let first = wasm("test-echo");
    dir.publish(&[("plugin", first.clone())]);
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    assert_eq!(runtime.module("plugin").unwrap().sha256(), sha256(&first));

    let second = wasm("hostpath");
    dir.publish(&[("plugin", second.clone())]);
    let expected = sha256(&second);
    wait_for("the new version", || {
        runtime
            .module("plugin")
            .is_some_and(|m| m.sha256() == expected)
    })
    .await;
    assert_eq!(runtime.metrics().module("plugin").reloads_total, 2);
}

/// The host's `/metrics` names the bytes serving each module
/// (`wasm_provisioner_module_version_info`), and a reload moves the 1 to the new
/// version; the build and the process are there too.
#[tokio::test]
async fn the_metrics_name_the_version_in_service_and_follow_a_reload() {
    let mut dir = ConfigMapDir::new();
    let first = wasm("test-echo");
    dir.publish(&[("plugin", first.clone())]);
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    let metrics = wasm_provisioner::metrics::Metrics::new();
    metrics.register_runtime(runtime.clone());
    let serving = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| line.starts_with("wasm_provisioner_module_version_info{"))
            .map(str::to_string)
            .collect()
    };
    let before = serving(&metrics.render());
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(
        before[0].contains(r#"module="plugin""#)
            && before[0].contains(&format!(r#"sha256="{}""#, sha256(&first)))
            && before[0].ends_with(" 1"),
        "{before:?}"
    );

    let second = wasm("hostpath");
    dir.publish(&[("plugin", second.clone())]);
    let expected = sha256(&second);
    wait_for("the new version", || {
        runtime
            .module("plugin")
            .is_some_and(|m| m.sha256() == expected)
    })
    .await;
    let after = serving(&metrics.render());
    assert_eq!(after.len(), 1, "only the version in service: {after:?}");
    assert!(
        after[0].contains(&format!(r#"sha256="{expected}""#))
            && after[0].contains(r#"plugin_version="0.1.0""#),
        "{after:?}"
    );

    let text = metrics.render();
    assert!(
        text.contains(&format!(
            "wasm_provisioner_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "no build_info"
    );
    for process in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_start_time_seconds ",
        "process_open_fds ",
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(process)),
            "no {process}"
        );
    }
}

#[tokio::test]
async fn broken_version_is_refused_and_the_old_one_keeps_serving() {
    let mut dir = ConfigMapDir::new();
    let good = wasm("test-echo");
    dir.publish(&[("plugin", good.clone())]);
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();

    dir.publish(&[("plugin", b"\0asm\x0d\0\x01\0 truncated".to_vec())]);
    wait_for("the refusal", || {
        runtime.metrics().module("plugin").refusals_total >= 1
    })
    .await;
    assert_eq!(runtime.module("plugin").unwrap().sha256(), sha256(&good));
    assert_serves(&runtime, "plugin").await;

    // A version whose describe traps is refused the same way.
    dir.publish(&[("plugin", wasm("test-describe-trap"))]);
    wait_for("the second refusal", || {
        runtime.metrics().module("plugin").refusals_total >= 2
    })
    .await;
    assert_eq!(runtime.module("plugin").unwrap().sha256(), sha256(&good));
    assert_serves(&runtime, "plugin").await;

    // And a good version after the broken ones is taken.
    let fixed = wasm("hostpath");
    dir.publish(&[("plugin", fixed.clone())]);
    let expected = sha256(&fixed);
    wait_for("the fixed version", || {
        runtime
            .module("plugin")
            .is_some_and(|m| m.sha256() == expected)
    })
    .await;
}

#[tokio::test]
async fn removed_module_stops_being_offered() {
    let mut dir = ConfigMapDir::new();
    dir.publish(&[("a", wasm("test-echo")), ("b", wasm("test-echo"))]);
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    assert!(runtime.module("b").is_some());

    dir.publish(&[("a", wasm("test-echo"))]);
    wait_for("the removal", || runtime.module("b").is_none()).await;
    assert!(runtime.module("a").is_some());
    assert_eq!(runtime.metrics().module("b").removals_total, 1);
    assert_serves(&runtime, "a").await;
}

#[tokio::test]
async fn in_flight_call_finishes_on_its_version_after_removal() {
    let mut dir = ConfigMapDir::new();
    dir.publish(&[("spin", wasm("test-spin")), ("echo", wasm("test-echo"))]);
    let runtime = runtime("modules: { spin: { limits: { timeoutSeconds: 3 } } }");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    let spin = runtime.module("spin").unwrap();
    let version = spin.version().to_string();
    let call = tokio::spawn({
        let spin = spin.clone();
        async move { spin.provision(&request("v")).await }
    });
    wait_for("the call to start", || spin.calls_in_flight() == 1).await;
    drop(spin);

    dir.publish(&[("echo", wasm("test-echo"))]);
    wait_for("the removal", || runtime.module("spin").is_none()).await;
    // The call is still running, on the removed version, and ends by its own deadline.
    let error = call.await.unwrap().unwrap_err();
    assert!(matches!(error, CallError::Timeout { .. }), "{error}");
    assert_eq!(error.target().version, version);
    assert_serves(&runtime, "echo").await;
}

#[tokio::test]
async fn plain_directory_with_copies_reloads_too() {
    // Not a ConfigMap: an emptyDir filled by an init container, files replaced by rename.
    let root = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let temporary: PathBuf = root.path().join(format!(".{name}.tmp"));
        std::fs::write(&temporary, bytes).unwrap();
        std::fs::rename(&temporary, root.path().join(format!("{name}.wasm"))).unwrap();
    };
    write("plugin", &wasm("test-echo"));
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), root.path().to_path_buf())
        .await
        .unwrap();
    let next = wasm("hostpath");
    write("plugin", &next);
    let expected = sha256(&next);
    wait_for("the new version", || {
        runtime
            .module("plugin")
            .is_some_and(|m| m.sha256() == expected)
    })
    .await;
    std::fs::remove_file(root.path().join("plugin.wasm")).unwrap();
    wait_for("the removal", || runtime.module("plugin").is_none()).await;
}

/// What a call on `module` must answer if it ran `module`'s own bytes: the echo guest
/// provisions, the trap guest traps, and the error names the version the call ran on.
async fn assert_runs_its_own_version(module: &wasm_provisioner_runtime::LoadedModule) {
    let answer = module.provision(&request("v")).await;
    match (module.info().name.as_str(), answer) {
        ("test-echo", Ok(Ok(volume))) => assert!(
            volume.annotations.iter().any(|(k, _)| k == "echo/version"),
            "{volume:?}"
        ),
        ("test-trap", Err(error @ CallError::Trap { .. })) => {
            assert_eq!(error.target().version, module.version(), "{error}")
        }
        (name, answer) => panic!(
            "a call on version {} ({name}) answered {answer:?}",
            module.version()
        ),
    }
}

/// A ConfigMap swapped again and again (between two guests) while calls run and while
/// versions are being validated: the module is never missing, every call runs one
/// complete version (the answer is that version's, and an error names it), and once the
/// swaps stop the last version published is the one serving.
#[tokio::test]
async fn configmap_swaps_during_calls_serve_only_complete_versions() {
    let mut dir = ConfigMapDir::new();
    let (echo, trap) = (wasm("test-echo"), wasm("test-trap"));
    dir.publish(&[("m", echo.clone())]);
    let runtime = runtime("");
    let (_watcher, _) = DirectoryWatcher::start(runtime.clone(), dir.path.clone())
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let runtime = runtime.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut calls = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let module = runtime.module("m").expect("the module is never missing");
                    assert_runs_its_own_version(&module).await;
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    // Swaps closer together than the debounce, and some spaced so a scan (and a
    // validation) runs between them.
    for i in 0..16u64 {
        let bytes = if i % 2 == 0 { &trap } else { &echo };
        dir.publish(&[("m", bytes.clone())]);
        tokio::time::sleep(Duration::from_millis(if i % 3 == 0 { 900 } else { 150 })).await;
    }
    // The last version is bytes never published before (the trap guest plus a custom
    // section), so an earlier trap still serving cannot pass for it.
    let mut final_version = trap.clone();
    final_version.extend_from_slice(b"\x00\x0c\x06attackfinal");
    dir.publish(&[("m", final_version.clone())]);
    let last = sha256(&final_version);
    wait_for("the last version published", || {
        runtime.module("m").is_some_and(|m| m.sha256() == last)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(runtime.module("m").unwrap().sha256(), last);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut calls = 0;
    for caller in callers {
        calls += caller.await.expect("every call ran a complete version");
    }
    assert!(calls > 10, "only {calls} calls ran during the swaps");
    assert!(runtime.metrics().module("m").reloads_total >= 3);
}

/// A module file rewritten in place (truncated, then written in pieces) while scans
/// run: a scan may read a torn mix of the two versions, which is refused; what serves
/// is always exactly one of the two versions, never a half-written one.
#[tokio::test]
async fn a_file_rewritten_during_reads_never_serves_a_torn_version() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("m.wasm");
    let (echo, trap) = (wasm("test-echo"), wasm("test-trap"));
    std::fs::write(&path, &echo).unwrap();
    let runtime = runtime("");
    runtime.sync_dir(root.path()).await.unwrap();
    let versions = [sha256(&echo), sha256(&trap)];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rewrites = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = std::thread::spawn({
        let (path, stop, rewrites) = (path.clone(), stop.clone(), rewrites.clone());
        let (echo, trap) = (echo.clone(), trap.clone());
        move || {
            use std::io::Write as _;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for bytes in [&trap, &echo] {
                    let mut file = std::fs::File::create(&path).unwrap();
                    for piece in bytes.chunks(16 * 1024) {
                        file.write_all(piece).unwrap();
                    }
                    rewrites.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    });
    let (mut scans, mut refused) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while scans < 40 || rewrites.load(std::sync::atomic::Ordering::Relaxed) < 40 {
        assert!(
            Instant::now() < deadline,
            "the scans and rewrites took too long"
        );
        let report = runtime.sync_dir(root.path()).await.unwrap();
        refused += report.refused.len();
        scans += 1;
        let module = runtime.module("m").expect("the module stays in service");
        assert!(
            versions.contains(&module.sha256().to_string()),
            "a version that is neither file serves: {}",
            module.sha256()
        );
        assert_runs_its_own_version(&module).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let rewrites = rewrites.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{scans} scans, {rewrites} rewrites, {refused} torn reads refused");
}
