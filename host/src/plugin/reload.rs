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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use super::error::LoadError;
use super::runtime::{LoadOutcome, Runtime};

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
    /// Brings the modules in service in line with `dir`: loads new and changed files,
    /// removes modules whose file is gone.
    pub async fn sync_dir(&self, dir: &Path) -> Result<SyncReport, ReloadError> {
        let (files, ignored) = module_files(dir).map_err(|source| ReloadError::List {
            dir: dir.to_path_buf(),
            source,
        })?;
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
            .keys()
            .filter(|name| !files.contains_key(*name))
            .cloned()
            .collect();
        // Warned at the first scan, at every reload and whenever the list changes, not at
        // every quiet re-scan; the metric always holds the current list.
        let previous = self.metrics().grants_without_module();
        self.metrics()
            .set_grants_without_module(report.grants_without_module.clone());
        for module in self.modules() {
            if !files.contains_key(module.name()) {
                self.remove(module.name());
                report.removed.push(module.name().to_string());
            }
        }
        for (name, path) in files {
            match self.load_file(&name, &path).await {
                Ok(LoadOutcome::Unchanged) => report.unchanged.push(name),
                Ok(_) => report.loaded.push(name),
                Err(error) => report.refused.push(error),
            }
        }
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
        Ok(report)
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
        let (events, mut receiver) = mpsc::channel::<()>(1);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                match &event {
                    Err(error) => tracing::warn!(
                        "modules directory watch error (re-scanning anyway): {error}"
                    ),
                    // Reading the modules (as every scan does) is no change; re-scanning
                    // on it would scan for ever.
                    Ok(event) if event.kind.is_access() => return,
                    Ok(_) => {}
                }
                // A full channel already holds a pending re-scan.
                let _ = events.try_send(());
            })
            .map_err(|source| ReloadError::Watch {
                dir: dir.clone(),
                source,
            })?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| ReloadError::Watch {
                dir: dir.clone(),
                source,
            })?;
        // Scan after the watch is in place, so no change falls between the two.
        let report = runtime.sync_dir(&dir).await?;
        let task = tokio::spawn(async move {
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
                match runtime.sync_dir(&dir).await {
                    Ok(report) => {
                        if !report.loaded.is_empty()
                            || !report.removed.is_empty()
                            || !report.refused.is_empty()
                        {
                            tracing::info!(
                                dir = %dir.display(),
                                loaded = ?report.loaded,
                                removed = ?report.removed,
                                refused = report.refused.len(),
                                "modules directory re-scanned"
                            );
                        }
                    }
                    Err(error) => tracing::warn!("{error}; the modules in service keep serving"),
                }
            }
        });
        Ok((
            DirectoryWatcher {
                _watcher: watcher,
                task,
            },
            report,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grants_naming_a_missing_module_are_reported_at_every_scan() {
        let dir = tempfile::tempdir().unwrap();
        let grants = crate::plugin::Grants::from_yaml(
            "modules: { hostpth: { limits: { timeoutSeconds: 5 } } }",
            "grants.yaml",
        )
        .unwrap();
        let runtime = Runtime::new(crate::plugin::RuntimeConfig {
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
