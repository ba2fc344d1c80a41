//! The modules directory and hot reload.
//!
//! Module `NAME` is the file `NAME.wasm` in the modules directory (a symlink is followed;
//! names starting with `.` are ignored). The directory may be a ConfigMap volume, whose
//! visible files are symlinks through `..data`, which kubelet swaps atomically to a new
//! timestamped directory: watching the files alone misses that, so the directory itself
//! is watched (not recursively) and any event triggers a full re-scan, after a short
//! debounce, that re-resolves every file through its symlinks. Each scan compares
//! digests: a new or changed file is loaded (and fully validated before it serves), a
//! file gone takes its module out of service. A periodic re-scan covers event sources
//! that miss changes (network filesystems, some image volumes).
//!
//! The modules of a scan load at once (each compile in its own child, at most
//! `COMPILE_CHILDREN` at a time), and the watcher does not wait for a scan to end
//! before reacting to the next change: a module that is slow to compile (up to
//! `--compile-timeout`) holds up only itself. A scan skips a module whose load is still
//! under way, and scans again once it ends, so a newer file is never missed.
//!
//! A module the grants file gives an OCI source (`source.oci`) is not the directory's:
//! the source watcher (`source/`) loads it, a file of its name here is ignored (with a
//! warning), and its absence here removes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use super::error::LoadError;
use super::runtime::{LoadOutcome, LoadingMark, Runtime};

/// Quiet time after the last filesystem event before re-scanning: a ConfigMap update
/// or a `cp` produces a burst of events.
pub const DEBOUNCE: Duration = Duration::from_millis(500);
/// Re-scan this often even without events.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// The file extension of modules.
pub const MODULE_EXTENSION: &str = "wasm";

/// What one scan of the modules directory did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Modules put in service (new, or a new version).
    pub loaded: Vec<String>,
    /// Modules whose file did not change.
    pub unchanged: Vec<String>,
    /// Versions refused; the previous version, if any, keeps serving.
    pub refused: Vec<LoadError>,
    /// Modules taken out of service because their file is gone.
    pub removed: Vec<String>,
    /// Files ignored, with the reason (a name that is not a valid module name).
    pub ignored: Ignored,
    /// Modules the grants file names that have no file here (warned about each scan).
    pub grants_without_module: Vec<String>,
    /// Modules skipped because a load of theirs (an earlier scan's) was still under
    /// way; the watcher scans again when it ends.
    pub loading: Vec<String>,
}

/// A scan begun: the directory listed, removals done, every listed module marked as
/// loading; its loads are still to run ([`Runtime::finish_scan`]).
pub struct Scan {
    dir: PathBuf,
    files: BTreeMap<String, PathBuf>,
    report: SyncReport,
    previous_grants_without_module: Vec<String>,
    marks: Vec<LoadingMark>,
}

/// Why the modules directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot list the modules directory {dir}: {source}")]
    List {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot watch the modules directory {dir}: {source}")]
    Watch { dir: PathBuf, source: notify::Error },
}

/// Files of the modules directory that cannot be modules, with the reason.
pub type Ignored = Vec<(PathBuf, String)>;

/// The module files of `dir`: `NAME.wasm` entries (resolved through symlinks), by name.
/// Entries whose name is not a valid module name are returned apart.
pub fn module_files(dir: &Path) -> std::io::Result<(BTreeMap<String, PathBuf>, Ignored)> {
    let mut modules = BTreeMap::new();
    let mut ignored = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        // `..data`, `..2026_...` and editors' temporary files.
        if file_name.starts_with('.') {
            continue;
        }
        let Some(name) = file_name.strip_suffix(&format!(".{MODULE_EXTENSION}")) else {
            continue;
        };
        // `metadata` follows symlinks: a dangling one (mid-swap) counts as absent.
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if super::is_valid_module_name(name) {
            modules.insert(name.to_string(), path);
        } else {
            ignored.push((
                path,
                format!("{name:?} is not a valid module name (lowercase letters, digits and '-', at most 63 characters)"),
            ));
        }
    }
    Ok((modules, ignored))
}

impl Runtime {
    /// Brings the modules in service in line with `dir`: loads new and changed files
    /// (all at once), removes modules whose file is gone.
    pub async fn sync_dir(&self, dir: &Path) -> Result<SyncReport, ReloadError> {
        let scan = self.begin_scan(dir)?;
        Ok(self.finish_scan(scan).await)
    }

    /// The quick part of a scan: lists `dir`, takes modules whose file is gone out of
    /// service, and marks every listed module as loading, so that from now until its
    /// load ends a claim of it waits rather than failing.
    pub fn begin_scan(&self, dir: &Path) -> Result<Scan, ReloadError> {
        let (mut files, mut ignored) = module_files(dir).map_err(|source| ReloadError::List {
            dir: dir.to_path_buf(),
            source,
        })?;
        files.retain(|name, path| {
            let from_oci = self.from_oci(name);
            if from_oci {
                ignored.push((
                    path.clone(),
                    format!(
                        "module {name} comes from the OCI source the grants file names                          (modules.{name}.source); this file is not used"
                    ),
                ));
            }
            !from_oci
        });
        let mut report = SyncReport {
            ignored,
            ..SyncReport::default()
        };
        for (path, reason) in &report.ignored {
            tracing::warn!(file = %path.display(), "ignoring a file in the modules directory: {reason}");
        }
        report.grants_without_module = self
            .grants()
            .modules
            .iter()
            .filter(|(name, grants)| grants.source.is_none() && !files.contains_key(*name))
            .map(|(name, _)| name.clone())
            .collect();
        // Warned at the first scan, at every reload and whenever the list changes, not at
        // every quiet re-scan; the metric always holds the current list.
        let previous = self.metrics().grants_without_module();
        self.metrics()
            .set_grants_without_module(report.grants_without_module.clone());
        for module in self.modules() {
            if !files.contains_key(module.name()) && !self.from_oci(module.name()) {
                self.remove(module.name());
                report.removed.push(module.name().to_string());
            }
        }
        self.forget_refusals_except(&|name| files.contains_key(name) || self.from_oci(name));
        let marks = files.keys().map(|name| self.mark_loading(name)).collect();
        Ok(Scan {
            dir: dir.to_path_buf(),
            files,
            report,
            previous_grants_without_module: previous,
            marks,
        })
    }

    /// The loads of a scan, all at once. A module whose load (an earlier scan's) is
    /// still under way is skipped and listed in `loading`.
    pub async fn finish_scan(&self, scan: Scan) -> SyncReport {
        let Scan {
            dir,
            files,
            mut report,
            previous_grants_without_module: previous,
            marks,
        } = scan;
        let mut loads = Vec::new();
        for (name, path) in files {
            if self.load_lock(&name).try_lock().is_err() {
                report.loading.push(name);
                continue;
            }
            loads.push(async move {
                let outcome = self.load_file(&name, &path).await;
                (name, outcome)
            });
        }
        for (name, outcome) in futures::future::join_all(loads).await {
            match outcome {
                Ok(LoadOutcome::Unchanged) => report.unchanged.push(name),
                Ok(_) => report.loaded.push(name),
                Err(error) => report.refused.push(error),
            }
        }
        drop(marks);
        let reloaded = !report.loaded.is_empty() || !report.removed.is_empty();
        // The first scan is a change: the list starts empty.
        if reloaded || previous != report.grants_without_module {
            for name in &report.grants_without_module {
                tracing::warn!(
                    module = %name,
                    dir = %dir.display(),
                    "the grants file names module {name}, but the modules directory has no \
                     {name}.wasm; a typo in the grants file (its grants go unused), or a module \
                     not deployed yet"
                );
            }
        }
        report
    }
}

/// Watches a modules directory and keeps the runtime in line with it. Dropping it stops
/// watching; the modules in service stay.
pub struct DirectoryWatcher {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DirectoryWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DirectoryWatcher {
    /// Scans `dir` once (the report says what was loaded and refused), then watches it.
    pub async fn start(
        runtime: Runtime,
        dir: PathBuf,
    ) -> Result<(DirectoryWatcher, SyncReport), ReloadError> {
        let (watcher, events, receiver) = watch(&dir)?;
        // Scan after the watch is in place, so no change falls between the two.
        let report = runtime.sync_dir(&dir).await?;
        let task = tokio::spawn(watch_loop(runtime, dir, events, receiver, None));
        Ok((
            DirectoryWatcher {
                _watcher: watcher,
                task,
            },
            report,
        ))
    }

    /// Lists `dir` (every module in it counts as loading from now on), then loads the
    /// modules in the background and watches it: the caller goes on (serves `/healthz`,
    /// starts the controllers) while modules compile.
    pub fn start_in_background(
        runtime: Runtime,
        dir: PathBuf,
    ) -> Result<DirectoryWatcher, ReloadError> {
        let (watcher, events, receiver) = watch(&dir)?;
        let first = runtime.begin_scan(&dir)?;
        let task = tokio::spawn(watch_loop(runtime, dir, events, receiver, Some(first)));
        Ok(DirectoryWatcher {
            _watcher: watcher,
            task,
        })
    }
}

type Events = (
    notify::RecommendedWatcher,
    mpsc::Sender<()>,
    mpsc::Receiver<()>,
);

/// Watches `dir`; each event (but reads) puts a pending re-scan in the channel.
fn watch(dir: &Path) -> Result<Events, ReloadError> {
    let (events, receiver) = mpsc::channel::<()>(1);
    let sender = events.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match &event {
            Err(error) => {
                tracing::warn!("modules directory watch error (re-scanning anyway): {error}")
            }
            // Reading the modules (as every scan does) is no change; re-scanning on it
            // would scan for ever.
            Ok(event) if event.kind.is_access() => return,
            Ok(_) => {}
        }
        // A full channel already holds a pending re-scan.
        let _ = sender.try_send(());
    })
    .map_err(|source| ReloadError::Watch {
        dir: dir.to_path_buf(),
        source,
    })?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|source| ReloadError::Watch {
            dir: dir.to_path_buf(),
            source,
        })?;
    Ok((watcher, events, receiver))
}

/// Re-scans on events (debounced) and every [`RESCAN_INTERVAL`]. Each scan's loads run
/// in a task of their own, so a slow compile never holds up the next scan; the tasks
/// end (their compile children killed) when the watcher is dropped.
async fn watch_loop(
    runtime: Runtime,
    dir: PathBuf,
    events: mpsc::Sender<()>,
    mut receiver: mpsc::Receiver<()>,
    first: Option<Scan>,
) {
    let mut scans = tokio::task::JoinSet::new();
    if let Some(first) = first {
        scans.spawn(finish(runtime.clone(), first, events.clone(), true));
    }
    let mut rescan = tokio::time::interval(RESCAN_INTERVAL);
    rescan.tick().await;
    loop {
        tokio::select! {
            event = receiver.recv() => {
                if event.is_none() {
                    break;
                }
                // Debounce: wait for quiet, then drop the events that piled up.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, receiver.recv()).await {}
            }
            _ = rescan.tick() => {}
        }
        while scans.try_join_next().is_some() {}
        match runtime.begin_scan(&dir) {
            Ok(scan) => {
                scans.spawn(finish(runtime.clone(), scan, events.clone(), false));
            }
            Err(error) => tracing::warn!("{error}; the modules in service keep serving"),
        }
    }
}

/// Runs a scan's loads and logs what they did; when it skipped modules still loading,
/// waits for their loads to end and asks for another scan.
async fn finish(runtime: Runtime, scan: Scan, events: mpsc::Sender<()>, first: bool) {
    let dir = scan.dir.clone();
    let report = runtime.finish_scan(scan).await;
    if first {
        tracing::info!(?report, dir = %dir.display(), "modules loaded");
    } else {
        tracing::debug!(?report, dir = %dir.display(), "modules directory scanned");
    }
    if !first
        && (!report.loaded.is_empty() || !report.removed.is_empty() || !report.refused.is_empty())
    {
        tracing::info!(
            dir = %dir.display(),
            loaded = ?report.loaded,
            removed = ?report.removed,
            refused = report.refused.len(),
            "modules directory re-scanned"
        );
    }
    if !report.loading.is_empty() {
        for name in &report.loading {
            let _ = runtime.load_lock(name).lock().await;
        }
        let _ = events.send(()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grants_naming_a_missing_module_are_reported_at_every_scan() {
        let dir = tempfile::tempdir().unwrap();
        let grants = crate::Grants::from_yaml(
            "modules: { hostpth: { limits: { timeoutSeconds: 5 } } }",
            "grants.yaml",
        )
        .unwrap();
        let runtime = Runtime::new(crate::RuntimeConfig {
            grants,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..2 {
            let report = runtime.sync_dir(dir.path()).await.unwrap();
            assert_eq!(report.grants_without_module, ["hostpth"]);
            assert_eq!(runtime.metrics().grants_without_module(), ["hostpth"]);
        }
        std::fs::write(dir.path().join("hostpth.wasm"), b"not wasm").unwrap();
        let report = runtime.sync_dir(dir.path()).await.unwrap();
        assert!(report.grants_without_module.is_empty());
        assert!(runtime.metrics().grants_without_module().is_empty());
    }

    #[tokio::test]
    async fn a_module_from_an_oci_source_is_not_the_directorys() {
        let dir = tempfile::tempdir().unwrap();
        let grants = crate::Grants::from_yaml(
            &format!(
                "modules: {{ pulled: {{ source: {{ oci: \"r.example.com/pulled@sha256:{}\" }} }} }}",
                "a".repeat(64)
            ),
            "grants.yaml",
        )
        .unwrap();
        let runtime = Runtime::new(crate::RuntimeConfig {
            grants,
            ..Default::default()
        })
        .unwrap();
        // No file: not a grant without a module (the source watcher loads it).
        let report = runtime.sync_dir(dir.path()).await.unwrap();
        assert!(report.grants_without_module.is_empty(), "{report:?}");
        // A file of its name: ignored, saying why.
        std::fs::write(dir.path().join("pulled.wasm"), b"not wasm").unwrap();
        let report = runtime.sync_dir(dir.path()).await.unwrap();
        assert!(report.refused.is_empty(), "{report:?}");
        assert!(
            report.ignored[0].1.contains("modules.pulled.source"),
            "{report:?}"
        );
    }

    #[test]
    fn lists_modules_through_configmap_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("..2026_01_01_00_00_00.1")).unwrap();
        std::fs::write(root.join("..2026_01_01_00_00_00.1/hostpath.wasm"), b"x").unwrap();
        std::os::unix::fs::symlink("..2026_01_01_00_00_00.1", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/hostpath.wasm", root.join("hostpath.wasm")).unwrap();
        std::os::unix::fs::symlink("..data/gone.wasm", root.join("gone.wasm")).unwrap();
        std::fs::write(root.join("Bad_Name.wasm"), b"x").unwrap();
        std::fs::write(root.join("readme.txt"), b"x").unwrap();
        std::fs::write(root.join(".hidden.wasm"), b"x").unwrap();

        let (modules, ignored) = module_files(root).unwrap();
        assert_eq!(modules.keys().collect::<Vec<_>>(), ["hostpath"]);
        assert_eq!(std::fs::read(&modules["hostpath"]).unwrap(), b"x");
        assert_eq!(ignored.len(), 1);
        assert!(ignored[0].1.contains("Bad_Name"));
    }
}
