//! The sandbox of one call: a fresh `Store` with an empty WASI context plus exactly the
//! grants of the module, the memory limiter, and the wall-clock deadline.
//!
//! Nothing is inherited from the host: no environment, no arguments, no stdin, no
//! preopened directory unless granted, TCP, UDP and name lookups denied, `wasi:http`
//! refused unless granted. Guest stdout/stderr go to the host log. Granted directories
//! are the handles opened once at start (`preopen`), never paths looked up per call.

mod fs_rules;

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{log as wit_log, v1, v2};
use super::grants::ModuleGrants;
use super::http::OutboundHttp;
use super::limits::MemoryLimiter;
use super::log::{CallTag, GuestLog};
use super::pool::CallNeed;
use crate::grants::directories::{GrantRoots, ModuleDirectories};
use crate::grants::volumes::VolumeDirectory;

/// The data of a call's `Store`.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    http_hooks: OutboundHttp,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) log: GuestLog,
    /// The module's granted directories, for the rename and link rules.
    grant_roots: GrantRoots,
}

impl GuestState {
    pub(crate) fn table(&self) -> &ResourceTable {
        &self.table
    }

    pub(crate) fn grant_roots(&self) -> &GrantRoots {
        &self.grant_roots
    }

    /// Says in the call's log (within its budget) why the sandbox refused an operation.
    pub(crate) fn log_refusal(&self, message: &str) {
        self.log
            .log(wit_log::Level::Warn, &format!("sandbox: {message}"), &[]);
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for GuestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

// The `types` interfaces have no functions, but the worlds' linkers want their (empty)
// traits.
impl v1::types::Host for GuestState {}
impl v2::types::Host for GuestState {}

impl wit_log::Host for GuestState {
    fn log(&mut self, level: wit_log::Level, message: String, fields: Vec<(String, String)>) {
        self.log.log(level, &message, &fields);
    }
}

impl v2::log::Host for GuestState {
    fn log(&mut self, level: v2::log::Level, message: String, fields: Vec<(String, String)>) {
        let level = match level {
            v2::log::Level::Trace => wit_log::Level::Trace,
            v2::log::Level::Debug => wit_log::Level::Debug,
            v2::log::Level::Info => wit_log::Level::Info,
            v2::log::Level::Warn => wit_log::Level::Warn,
            v2::log::Level::Error => wit_log::Level::Error,
        };
        self.log.log(level, &message, &fields);
    }
}

/// `statvfs` of the granted directory holding a path, on the handle opened at start (no
/// path lookup, so no symlink can point it elsewhere). Runs on the call's own thread, like every
/// filesystem operation of the call, within the call's timeout.
impl v2::filesystem::Host for GuestState {
    fn stat_filesystem(&mut self, path: String) -> Result<v2::filesystem::FilesystemStats, String> {
        // The grant whose guest path holds `path` (the longest, if grants nest). The
        // answer is always that grant's filesystem: `path` itself is never looked up.
        let holder = self
            .grant_roots
            .guest_paths()
            .into_iter()
            .filter(|root| {
                let root = root.trim_end_matches('/');
                path == root || path.starts_with(&format!("{root}/"))
            })
            .max_by_key(|root| root.len());
        let Some(root) = holder.and_then(|holder| self.grant_roots.handle(holder)) else {
            let granted = self.grant_roots.guest_paths().join(", ");
            let message = format!(
                "stat-filesystem {path:?}: not inside a directory granted to this module \
                 (granted: {})",
                if granted.is_empty() { "none" } else { &granted }
            );
            self.log_refusal(&message);
            return Err(message);
        };
        let stats = rustix::fs::fstatvfs(root)
            .map_err(|error| format!("stat-filesystem {path:?}: {error}"))?;
        Ok(v2::filesystem::FilesystemStats {
            total_bytes: stats.f_blocks.saturating_mul(stats.f_frsize),
            available_bytes: stats.f_bavail.saturating_mul(stats.f_frsize),
        })
    }
}

/// The error a call's deadline raises inside wasmtime.
#[derive(Debug)]
pub(crate) struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the call's wall-clock deadline passed")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// The linker every module is instantiated with: WASI p2 (empty unless granted),
/// `wasi:http` (refused unless granted) and the imports of both contract versions
/// (0.1's `log`; 0.2's `log` and `filesystem`).
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    v1::Provisioner::add_to_linker::<GuestState, HasSelf<GuestState>>(&mut linker, |state| state)?;
    v2::PluginWithEveryCapability::add_to_linker::<GuestState, HasSelf<GuestState>>(
        &mut linker,
        |state| state,
    )?;
    fs_rules::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// What a module version's calls are sandboxed with.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    pub(crate) module: Arc<str>,
    pub(crate) version: Arc<str>,
    pub(crate) grants: ModuleGrants,
    http: Arc<[super::grants::HttpGrant]>,
    /// The granted directories, opened at start.
    directories: Arc<ModuleDirectories>,
    /// The memories and tables one call of the version defines: its store may create
    /// no more (what the module reserved of the instance pool).
    need: CallNeed,
}

impl Sandbox {
    pub(crate) fn new(
        module: Arc<str>,
        version: Arc<str>,
        grants: ModuleGrants,
        directories: Arc<ModuleDirectories>,
        need: CallNeed,
    ) -> Self {
        let http = grants.http.clone().into();
        Sandbox {
            module,
            version,
            grants,
            http,
            directories,
            need,
        }
    }

    /// See [`ModuleDirectories::check_volume_directory`].
    pub(crate) fn check_volume_directory(&self, volume: &VolumeDirectory) -> Result<(), String> {
        self.directories.check_volume_directory(volume)
    }

    /// A fresh store for one call, its deadline already running.
    pub(crate) fn store(
        &self,
        engine: &Engine,
        call: &'static str,
    ) -> Result<Store<GuestState>, String> {
        let limits = self.grants.limits;
        let log = GuestLog::new(CallTag {
            module: self.module.clone(),
            version: self.version.clone(),
            call,
        });
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(log.stdio(false))
            .stderr(log.stdio(true))
            // Filesystem calls run inline: the whole call runs on a blocking thread.
            .allow_blocking_current_thread(true)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        let mut wasi = wasi.build();
        // The preopens: clones of the handles opened at start (no path lookup here).
        let opened = self
            .directories
            .opened()
            .map_err(|error| error.to_string())?;
        *wasi.filesystem() = opened.filesystem;
        let state = GuestState {
            wasi,
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            http_hooks: OutboundHttp {
                module: self.module.clone(),
                grants: self.http.clone(),
                timeout: limits.timeout,
            },
            limiter: MemoryLimiter::new(limits.memory_bytes)
                .with_slots(self.need.memories, self.need.tables),
            log,
            grant_roots: opened.roots,
        };
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.limiter);
        set_deadline(&mut store, limits.timeout);
        Ok(store)
    }
}

/// Every tick the guest yields to the executor (so an abandoned call is dropped at the
/// next tick, see `LoadedModule::invoke`) until the deadline, when the call traps with
/// [`DeadlineExceeded`].
fn set_deadline(store: &mut Store<GuestState>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline {
            Err(wasmtime::Error::new(DeadlineExceeded))
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
}
