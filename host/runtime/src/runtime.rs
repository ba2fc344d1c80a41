//! The plugin runtime: one engine, the modules in service, loading and swapping them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::cache::{CacheError, PrecompiledCache, deserialize_verified};
use super::compile::{COMPILE_CHILDREN, CompileFailure, CompilerConfig, compile_in_child};
use super::engine::{
    Allocator, CodegenSettings, DEFAULT_MAX_GUEST_INSTANCES, EpochTicker, InstancePool, new_engine,
};
use super::error::{CallError, LoadError, ResolveError};
use super::grants::Grants;
use super::guest::GuestPre;
use super::metrics::Metrics;
use super::module::{LoadedModule, ModuleParts, VERSION_DIGITS};
use super::module_file::{DEFAULT_MAX_MODULE_BYTES, ModuleFileError, read_module_file};
use super::pool::{CallNeed, PoolShares};
use super::sandbox::{GuestState, linker};
use crate::grants::directories::{GrantDirectoryError, GrantedDirectories};

/// The `moduleSHA256` pin among a class's parameters. A key differing from it only in
/// letter case (`moduleSha256`) is an error, not an unpinned class: the admin meant a
/// pin, and the plugin would otherwise get it as a plain parameter while any version
/// ran.
pub fn class_pin<'a>(
    module: &str,
    parameters: Option<&'a BTreeMap<String, String>>,
) -> Result<Option<&'a str>, ResolveError> {
    let Some(parameters) = parameters else {
        return Ok(None);
    };
    let pin = wasm_provisioner_rules::names::PARAM_MODULE_SHA256;
    if let Some(key) = parameters
        .keys()
        .find(|key| key.as_str() != pin && key.eq_ignore_ascii_case(pin))
    {
        return Err(ResolveError::MisspelledPin {
            module: module.to_string(),
            key: key.clone(),
        });
    }
    Ok(parameters.get(pin).map(String::as_str))
}

/// Compilations running at once in this process (without a [`CompilerConfig`]):
/// compiling is CPU-heavy and must not starve the controllers (Cranelift itself compiles
/// functions in parallel). Compiles in child processes are bounded by
/// [`COMPILE_CHILDREN`] instead.
pub const COMPILE_CONCURRENCY: usize = 1;

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// What each module may touch, and its limits.
    pub grants: Grants,
    /// Where precompiled components are kept; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of log one call may write (`--guest-log-bytes-per-call`); the rest is
    /// dropped and counted.
    pub guest_log_bytes_per_call: usize,
    /// Largest module file read (`--max-module-bytes`); a larger one is refused.
    pub max_module_bytes: u64,
    /// Guest instances alive at once, every module together (`--max-guest-instances`):
    /// the size of the instance pool.
    pub max_guest_instances: u32,
    /// Compile modules in a child process bounded in time and memory (`run` and the
    /// offline runner); `None` compiles in this process, unbounded (library users and
    /// tests that load only trusted modules).
    pub compiler: Option<CompilerConfig>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            grants: Grants::default(),
            cache_dir: None,
            guest_log_bytes_per_call: super::limits::DEFAULT_GUEST_LOG_BYTES_PER_CALL,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            max_guest_instances: DEFAULT_MAX_GUEST_INSTANCES,
            compiler: None,
        }
    }
}

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),
    #[error("cannot use the precompiled cache directory {dir}: {source}")]
    Cache { dir: PathBuf, source: CacheError },
    /// A granted directory is, or goes through, a symlink, or is not a directory.
    #[error("{0}")]
    Grant(#[from] GrantDirectoryError),
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(std::io::Error),
}

/// What a load did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// A module that was not in service now is.
    Loaded { sha256: String },
    /// A new version replaced the one in service.
    Replaced { previous: String, sha256: String },
    /// The bytes are those of the version already in service.
    Unchanged,
}

/// The plugin runtime. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    allocator: Allocator,
    linker: Linker<GuestState>,
    cache: Option<PrecompiledCache>,
    grants: Grants,
    /// Every granted directory, opened once at start (see `preopen`).
    directories: GrantedDirectories,
    guest_log_bytes_per_call: usize,
    max_module_bytes: u64,
    modules: RwLock<BTreeMap<String, Arc<LoadedModule>>>,
    /// Each module's share of the instance pool, reserved at load.
    shares: PoolShares,
    /// The concurrency budget of each module name, shared by all its versions.
    permits: Mutex<HashMap<String, Arc<Semaphore>>>,
    metrics: Arc<Metrics>,
    ticker: Arc<EpochTicker>,
    /// What compiled code depends on: the compile child builds its engine from it.
    codegen: CodegenSettings,
    compiler: Option<CompilerConfig>,
    compiles: Semaphore,
    /// One lock per module name: two loads of one module cannot race, and a module's
    /// slow compile never holds up another module's load.
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Modules whose load is under way (a count per name: scans may overlap); while one
    /// is not in service yet, resolving it says "still loading", not "missing".
    pending: Mutex<HashMap<String, usize>>,
    /// The sha256 of the last version refused per module: re-scans meet the same broken
    /// file again, and it is refused (logged, counted) once, not at every scan.
    refused_versions: Mutex<HashMap<String, String>>,
    /// Why the last load of each module failed, until one succeeds: what a claim of a
    /// module not in service is told.
    last_refusal: Mutex<HashMap<String, String>>,
    /// What a new version must pass before it replaces the one in service.
    gate: RwLock<Option<Arc<dyn VersionGate>>>,
}

/// A check, supplied by whoever uses the runtime, that a new version of a module must
/// pass before it replaces the version in service (the host checks the StorageClasses
/// the module serves). The runtime knows nothing of what is checked: `admit` gets the
/// new version, described and callable on a permit of its own, and the version in
/// service; an `Err(reason)` holds the new version back ([`LoadError::HeldBack`]) and
/// the version in service keeps serving. A module's first version is not gated: there
/// is nothing to keep serving instead.
pub trait VersionGate: Send + Sync {
    fn admit<'a>(
        &'a self,
        candidate: &'a LoadedModule,
        serving: &'a LoadedModule,
    ) -> futures::future::BoxFuture<'a, Result<(), String>>;
}

/// A module marked as loading ([`Runtime::mark_loading`]) until this is dropped.
pub(crate) struct LoadingMark {
    runtime: Runtime,
    name: String,
}

impl Drop for LoadingMark {
    fn drop(&mut self) {
        let mut pending = lock(&self.runtime.inner.pending);
        if let Some(count) = pending.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                pending.remove(&self.name);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Runtime {
    /// Builds the engine, the linker and the cache, opens every granted directory,
    /// and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let pool = InstancePool {
            max_guest_instances: config.max_guest_instances,
            max_memory_bytes: config.grants.max_memory_bytes(),
        };
        let (engine, allocator) =
            new_engine(pool).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let codegen = CodegenSettings::of(allocator, pool);
        let linker = linker(&engine).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let cache = match &config.cache_dir {
            Some(dir) => match PrecompiledCache::open(dir, &engine) {
                Ok(cache) => Some(cache),
                Err(source) if source.is_out_of_space() => {
                    tracing::warn!(
                        dir = %dir.display(),
                        "running without the precompiled cache: {source}; its filesystem is full, so every start compiles every module until there is room (a volume filling the node's disk does this; keep the cache and the volumes on different filesystems)"
                    );
                    None
                }
                Err(source) => {
                    return Err(RuntimeError::Cache {
                        dir: dir.clone(),
                        source,
                    });
                }
            },
            None => None,
        };
        let directories = GrantedDirectories::open(&config.grants)?;
        let ticker = Arc::new(EpochTicker::start(&engine).map_err(RuntimeError::Ticker)?);
        Ok(Runtime {
            inner: Arc::new(Inner {
                engine,
                allocator,
                linker,
                cache,
                grants: config.grants,
                directories,
                guest_log_bytes_per_call: config.guest_log_bytes_per_call,
                max_module_bytes: config.max_module_bytes,
                modules: RwLock::default(),
                shares: PoolShares::new(allocator),
                permits: Mutex::default(),
                metrics: Arc::default(),
                ticker,
                compiles: Semaphore::new(if config.compiler.is_some() {
                    COMPILE_CHILDREN
                } else {
                    COMPILE_CONCURRENCY
                }),
                codegen,
                compiler: config.compiler,
                loading: Mutex::default(),
                pending: Mutex::default(),
                refused_versions: Mutex::default(),
                last_refusal: Mutex::default(),
                gate: RwLock::default(),
            }),
        })
    }

    /// Sets the check every replacement version must pass ([`VersionGate`]).
    pub fn set_version_gate(&self, gate: Arc<dyn VersionGate>) {
        *self.inner.gate.write().unwrap_or_else(|e| e.into_inner()) = Some(gate);
    }

    /// Forgets that `name`'s last version was refused, so the next scan tries it again
    /// (what the gate checked has changed: a class fixed or deleted).
    pub fn retry_refused(&self, name: &str) {
        lock(&self.inner.refused_versions).remove(name);
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The instance allocator the engine runs with.
    pub fn allocator(&self) -> Allocator {
        self.inner.allocator
    }

    pub fn grants(&self) -> &Grants {
        &self.inner.grants
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The version of `name` in service, if any.
    pub fn module(&self, name: &str) -> Option<Arc<LoadedModule>> {
        self.read_modules().get(name).cloned()
    }

    /// Every module in service.
    pub fn modules(&self) -> Vec<Arc<LoadedModule>> {
        self.read_modules().values().cloned().collect()
    }

    /// The module a class names, checked against the class's `moduleSHA256` pin.
    pub fn resolve(
        &self,
        name: &str,
        pinned_sha256: Option<&str>,
    ) -> Result<Arc<LoadedModule>, ResolveError> {
        let module = self.module(name).ok_or_else(|| self.not_in_service(name))?;
        // A pin present but empty (a template that rendered nothing) is refused, never
        // read as "no pin": a class pinned by mistake to nothing must not run any bytes.
        if let Some(pinned) = pinned_sha256.map(str::trim) {
            let digest = pinned
                .strip_prefix("sha256:")
                .unwrap_or(pinned)
                .to_ascii_lowercase();
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ResolveError::InvalidPin {
                    module: name.to_string(),
                    pinned: pinned.to_string(),
                });
            }
            if digest != module.sha256() {
                return Err(ResolveError::PinMismatch {
                    module: name.to_string(),
                    pinned: digest,
                    current: module.sha256().to_string(),
                });
            }
        }
        Ok(module)
    }

    /// Why `name`, not in service, cannot be resolved: still loading, refused, or
    /// missing.
    fn not_in_service(&self, name: &str) -> ResolveError {
        if lock(&self.inner.pending).contains_key(name) {
            return ResolveError::Loading {
                module: name.to_string(),
            };
        }
        if let Some(refusal) = lock(&self.inner.last_refusal).get(name) {
            return ResolveError::Refused {
                module: name.to_string(),
                refusal: refusal.clone(),
            };
        }
        ResolveError::NotLoaded {
            module: name.to_string(),
            loaded: self.read_modules().keys().cloned().collect(),
        }
    }

    /// Modules not in service whose load is under way.
    pub fn modules_loading(&self) -> Vec<String> {
        let pending: Vec<String> = lock(&self.inner.pending).keys().cloned().collect();
        let modules = self.read_modules();
        pending
            .into_iter()
            .filter(|name| !modules.contains_key(name))
            .collect()
    }

    /// Marks `name` as loading until the mark is dropped: a claim of it then waits
    /// instead of failing (see [`ResolveError::Loading`]).
    pub(crate) fn mark_loading(&self, name: &str) -> LoadingMark {
        *lock(&self.inner.pending)
            .entry(name.to_string())
            .or_default() += 1;
        LoadingMark {
            runtime: self.clone(),
            name: name.to_string(),
        }
    }

    /// Forgets the refusals of modules whose file is gone.
    pub(crate) fn forget_refusals_except(&self, present: &dyn Fn(&str) -> bool) {
        lock(&self.inner.last_refusal).retain(|name, _| present(name));
        lock(&self.inner.refused_versions).retain(|name, _| present(name));
    }

    /// The load lock of `name`.
    pub(crate) fn load_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.inner.loading)
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Loads `path` as module `name`: validates it fully (compile, world, `describe`)
    /// and only then puts it in service. On failure the version in service, if any,
    /// keeps serving; the refusal is logged and counted.
    ///
    /// The file must be a regular file inside its directory (a symlink is followed only
    /// if it stays inside) of at most `max_module_bytes` (see `module_file`).
    pub async fn load_file(&self, name: &str, path: &Path) -> Result<LoadOutcome, LoadError> {
        let _loading = self.mark_loading(name);
        let bytes = self
            .read_module(name, path)
            .await
            .inspect_err(|error| self.refused(error))?;
        self.load_bytes(name, bytes).await
    }

    /// Like [`Runtime::load_file`], from bytes.
    /// A version refused before is not tried again: `Unchanged` (nothing changed since
    /// the last scan; the version in service, if any, keeps serving).
    pub async fn load_bytes(&self, name: &str, bytes: Vec<u8>) -> Result<LoadOutcome, LoadError> {
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let refused_before =
            |versions: &HashMap<String, String>| versions.get(name) == Some(&sha256);
        if refused_before(
            &self
                .inner
                .refused_versions
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ) {
            return Ok(LoadOutcome::Unchanged);
        }
        let _loading = self.mark_loading(name);
        let result = self.load_checked(name, bytes).await;
        let mut refused = self
            .inner
            .refused_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match &result {
            Err(error) => {
                // Only a deterministic failure (compile, link, describe trapped or
                // answered wrong) is remembered; a sandbox the host could not set up (a
                // granted directory missing since start), a busy module or a describe
                // timed out under load is not the version's fault: the next scan tries
                // it again.
                if !transient(error) {
                    refused.insert(name.to_string(), sha256);
                }
                drop(refused);
                lock(&self.inner.last_refusal).insert(name.to_string(), error.to_string());
                self.refused(error);
            }
            Ok(_) => {
                refused.remove(name);
                drop(refused);
                lock(&self.inner.last_refusal).remove(name);
            }
        }
        result
    }

    /// Takes `name` out of service. Calls already running finish on their version.
    pub fn remove(&self, name: &str) -> Option<Arc<LoadedModule>> {
        let removed = self
            .inner
            .modules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(module) = &removed {
            self.inner.metrics.record_removal(name);
            tracing::info!(
                module = name,
                version = module.version(),
                in_flight = module.calls_in_flight(),
                "module removed from service; calls already running finish on their version"
            );
        }
        removed
    }

    /// Largest module read (`--max-module-bytes`), from a file or a registry.
    pub fn max_module_bytes(&self) -> u64 {
        self.inner.max_module_bytes
    }

    /// Whether module `name` comes from an OCI source (the grants file's `source`), not
    /// from the modules directory.
    pub fn from_oci(&self, name: &str) -> bool {
        self.inner
            .grants
            .modules
            .get(name)
            .is_some_and(|grants| grants.source.is_some())
    }

    pub(crate) fn refused(&self, error: &LoadError) {
        self.inner.metrics.record_refusal(error.module());
        if let Some(limit) = error.compile_limit() {
            self.inner
                .metrics
                .record_compile_limit_refusal(error.module(), limit);
        }
        if matches!(
            error,
            LoadError::Read { .. } | LoadError::TooLarge { .. } | LoadError::Pull { .. }
        ) {
            // Not read, so nothing was remembered for it: a claim is told why.
            lock(&self.inner.last_refusal).insert(error.module().to_string(), error.to_string());
        }
        let serving = self.module(error.module());
        tracing::warn!(
            module = error.module(),
            version = error.version().unwrap_or("unknown"),
            serving = serving.as_ref().map(|m| m.version()).unwrap_or("none"),
            "module version refused: {error}; {}",
            if serving.is_some() {
                "the previous version keeps serving"
            } else {
                "the module is not in service"
            }
        );
    }

    async fn load_checked(&self, name: &str, bytes: Vec<u8>) -> Result<LoadOutcome, LoadError> {
        if !super::is_valid_module_name(name) {
            return Err(LoadError::InvalidName {
                module: name.to_string(),
                name: name.to_string(),
            });
        }
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let version = sha256[..VERSION_DIGITS].to_string();
        let lock = self.load_lock(name);
        let _loading = lock.lock().await;
        let previous = self.module(name);
        if previous.as_ref().is_some_and(|m| m.sha256() == sha256) {
            return Ok(LoadOutcome::Unchanged);
        }

        let component = self.compile(name, &version, &sha256, bytes).await?;
        let pre = GuestPre::new(&self.inner.linker, &component).map_err(|e| LoadError::World {
            module: name.to_string(),
            version: version.clone(),
            cause: format!("{e:#}"),
        })?;
        let grants = self.inner.grants.for_module(name);
        let share = self
            .inner
            .shares
            .reserve(
                name,
                grants.limits.max_concurrent_calls,
                CallNeed::of(&component),
            )
            .map_err(|error| LoadError::PoolShare {
                module: name.to_string(),
                version: version.clone(),
                error: Box::new(error),
            })?;
        let permits = self
            .inner
            .permits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Semaphore::new(grants.limits.max_concurrent_calls as usize))
            })
            .clone();
        let (module, permits) = LoadedModule::describe(ModuleParts {
            name: name.into(),
            sha256: sha256.clone(),
            pre,
            engine: self.inner.engine.clone(),
            grants,
            directories: self.inner.directories.for_module(name),
            permits,
            metrics: self.inner.metrics.clone(),
            ticker: self.inner.ticker.clone(),
            log_bytes_per_call: self.inner.guest_log_bytes_per_call,
            share,
        })
        .await
        .map_err(|error| LoadError::Describe {
            module: name.to_string(),
            version: version.clone(),
            error: Box::new(error),
        })?;
        // A replacement passes the host's gate first (the classes it would serve), while
        // the version in service keeps serving.
        let gate = self
            .inner
            .gate
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let (Some(gate), Some(serving)) = (gate, previous.as_deref()) {
            gate.admit(&module, serving)
                .await
                .map_err(|reason| LoadError::HeldBack {
                    module: name.to_string(),
                    version: version.clone(),
                    reason,
                })?;
        }
        let module = module.serve(permits);

        let info = module.info().clone();
        self.inner
            .modules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), Arc::new(module));
        self.inner.metrics.record_reload(name);
        tracing::info!(
            module = name,
            version,
            previous = previous.as_ref().map(|m| m.version()).unwrap_or("none"),
            plugin = info.name,
            plugin_version = info.version,
            "module version in service"
        );
        Ok(match previous {
            Some(previous) => LoadOutcome::Replaced {
                previous: previous.sha256().to_string(),
                sha256,
            },
            None => LoadOutcome::Loaded { sha256 },
        })
    }

    /// Compiles off the async threads, through the cache: a hit is deserialised here;
    /// a miss is compiled in a child process when the runtime has a [`CompilerConfig`]
    /// (bounded in time and memory, at most [`COMPILE_CHILDREN`] at once), else in this
    /// process (one at a time).
    async fn compile(
        &self,
        name: &str,
        version: &str,
        sha256: &str,
        bytes: Vec<u8>,
    ) -> Result<Component, LoadError> {
        let compile_error = |cause: String| LoadError::Compile {
            module: name.to_string(),
            version: version.to_string(),
            cause,
        };
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let cached = cache.is_some();
        if let Some(cache) = cache.clone() {
            let digest = sha256.to_string();
            let engine = engine.clone();
            let hit = tokio::task::spawn_blocking(move || cache.lookup(&engine, &digest))
                .await
                .map_err(|e| compile_error(format!("the cache task failed: {e}")))?;
            if let Some(component) = hit {
                self.inner.metrics.record_compile(true, cached);
                return Ok(component);
            }
        }
        let _permit = self
            .inner
            .compiles
            .acquire()
            .await
            .map_err(|e| compile_error(e.to_string()))?;
        let digest = sha256.to_string();
        let component = match &self.inner.compiler {
            Some(compiler) => {
                tracing::info!(
                    module = name,
                    version,
                    timeout = ?compiler.timeout,
                    memory_bytes = compiler.memory_bytes,
                    "compiling module in a child process"
                );
                let native = compile_in_child(compiler, self.inner.codegen, bytes)
                    .await
                    .map_err(|failure| match failure {
                        CompileFailure::Invalid(cause) => compile_error(cause),
                        failure => LoadError::CompileChild {
                            module: name.to_string(),
                            version: version.to_string(),
                            failure,
                        },
                    })?;
                tokio::task::spawn_blocking(move || match cache {
                    Some(cache) => cache.store_compiled(&engine, &digest, &native),
                    None => deserialize_verified(&engine, &native),
                })
                .await
            }
            None => {
                tokio::task::spawn_blocking(move || match cache {
                    Some(cache) => engine
                        .precompile_component(&bytes)
                        .and_then(|native| cache.store_compiled(&engine, &digest, &native)),
                    None => Component::new(&engine, &bytes),
                })
                .await
            }
        }
        .map_err(|e| compile_error(format!("the compile task failed: {e}")))?
        .map_err(|e| compile_error(format!("{e:#}")))?;
        self.inner.metrics.record_compile(false, cached);
        Ok(component)
    }

    fn read_modules(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<LoadedModule>>> {
        self.inner.modules.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads a module file off the async threads (the modules directory may be a
    /// network volume).
    async fn read_module(&self, name: &str, path: &Path) -> Result<Vec<u8>, LoadError> {
        let max = self.inner.max_module_bytes;
        let file = path.to_path_buf();
        let read = tokio::task::spawn_blocking(move || read_module_file(&file, max))
            .await
            .unwrap_or_else(|error| {
                Err(ModuleFileError::Io {
                    at: path.to_path_buf(),
                    source: std::io::Error::other(format!("the reading thread failed: {error}")),
                })
            });
        read.map_err(|error| match error {
            ModuleFileError::TooLarge { size, max, .. } => LoadError::TooLarge {
                module: name.to_string(),
                path: path.display().to_string(),
                size,
                max,
            },
            other => LoadError::Read {
                module: name.to_string(),
                path: path.display().to_string(),
                cause: other.to_string(),
            },
        })
    }
}

/// Whether a load failed for a reason that may pass (the sandbox could not be made, the
/// module was busy, `describe` timed out, the pool had no room for its share while
/// other modules held it), rather than because of the version itself.
fn transient(error: &LoadError) -> bool {
    match error {
        LoadError::Describe { error, .. } => {
            error.is_transient() || matches!(**error, CallError::Sandbox { .. })
        }
        // The pool had no room for its share while other modules held it.
        LoadError::PoolShare { .. } => true,
        // The compile child could not run at all: the host's problem. A compile that hit
        // its time or memory limit would hit it again: the version's.
        LoadError::CompileChild { failure, .. } => failure.is_transient(),
        _ => false,
    }
}
