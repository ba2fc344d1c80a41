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

use super::bindings::{Provisioner, log as wit_log};
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

// The `types` interface has no functions, but the world's linker wants its (empty) trait.
impl super::bindings::types::Host for GuestState {}

impl wit_log::Host for GuestState {
    fn log(&mut self, level: wit_log::Level, message: String, fields: Vec<(String, String)>) {
        self.log.log(level, &message, &fields);
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
/// `wasi:http` (refused unless granted) and the world's `log` import.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    Provisioner::add_to_linker::<GuestState, HasSelf<GuestState>>(&mut linker, |state| state)?;
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
