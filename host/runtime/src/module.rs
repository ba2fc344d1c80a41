//! A loaded module version and the calls into it.
//!
//! A [`LoadedModule`] is immutable: one version (one sha256) of one module, compiled,
//! linked (`GuestPre`, for the contract version it was built for) and described once. Every call gets a fresh `Store` and
//! instance, under the module's limits. A reload makes a new `LoadedModule`; calls that
//! hold an `Arc` of the old one finish on it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use wasmtime::component::ResourceTableError;
use wasmtime::{Engine, PoolConcurrencyLimitError, Store, Trap};

use super::answer::{self, AnswerSize};
use wasm_provisioner_rules::types::{
    BackendCapacity, Capability, CapacityRequest, Class, DeleteError, DeleteRequest, ExpandError,
    ExpandRequest, PluginInfo, ProvisionError, ProvisionRequest, Volume,
};

use super::engine::EpochTicker;
use super::error::{Call, CallError, CallTarget};
use super::grants::ModuleGrants;
use super::guest::{ContractVersion, Guest, GuestPre};
use super::limits::{Limits, MAX_LIFT_BYTES};
use super::metrics::Metrics;
use super::pool::{CallNeed, VersionShare};
use super::sandbox::{DeadlineExceeded, GuestState, Sandbox};
use crate::grants::directories::ModuleDirectories;
use crate::grants::volumes::VolumeDirectory;

/// Hex digits of the sha256 used as a module's short version in logs and errors.
pub const VERSION_DIGITS: usize = 12;

/// Longest trap message kept in an error (backtraces of big guests are long).
const MAX_CAUSE_BYTES: usize = 2048;

/// How long past its timeout the async side waits for a call's thread: the call's own
/// timeout ends it on time unless its thread is stuck in a system call (a hung
/// filesystem), which nothing can interrupt.
const STUCK_CALL_GRACE: Duration = Duration::from_millis(250);

/// How a call's thread ended.
enum CallEnd<R> {
    /// The sandbox could not be made (a granted directory missing since start).
    NoSandbox(String),
    /// Nobody waited for the call any more.
    Abandoned,
    /// The call's timeout passed while it waited on the host.
    TimedOut,
    /// The guest answered, or stopped with this error; and whether it was at its
    /// memory limit.
    Finished(wasmtime::Result<R>, bool),
}

/// A fresh store for one call, made on the call's thread: once every granted directory
/// is open (normally from start) that only clones their handles; until then it opens
/// them, blocking filesystem work (an NFS export can hang) that this thread may do.
/// Then the bounds on what the guest hands the host: hostcall fuel for lifting (answers
/// and import arguments), and the log budget.
fn call_store(
    sandbox: &Sandbox,
    engine: &Engine,
    call: Call,
    log_bytes_per_call: usize,
    metrics: Arc<Metrics>,
) -> Result<Store<GuestState>, String> {
    let mut store = sandbox.store(engine, call.as_str())?;
    store.set_hostcall_fuel(MAX_LIFT_BYTES);
    store.data().log.configure(log_bytes_per_call, metrics);
    Ok(store)
}

/// Whether a call's waiter gave up on it while its thread still ran (stuck in a system
/// call), and whether that thread has returned: the call counts in
/// `wasm_provisioner_guest_calls_stuck` from the one to the other, whichever order
/// they come in.
#[derive(Default)]
struct StuckWatch {
    state: std::sync::Mutex<StuckState>,
}

#[derive(Default)]
struct StuckState {
    declared_stuck: bool,
    returned: bool,
}

impl StuckWatch {
    fn declare(&self, metrics: &Metrics, module: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.returned {
            state.declared_stuck = true;
            metrics.record_stuck_call(module);
        }
    }

    fn thread_returned(&self, metrics: &Metrics, module: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.returned = true;
        if state.declared_stuck {
            metrics.record_stuck_call_ended(module);
        }
    }
}

/// Dropped when a call's thread returns, however it ends.
struct ThreadEnd {
    watch: Arc<StuckWatch>,
    metrics: Arc<Metrics>,
    module: Arc<str>,
}

impl Drop for ThreadEnd {
    fn drop(&mut self) {
        self.watch.thread_returned(&self.metrics, &self.module);
    }
}

/// One version of one module, ready to call.
pub struct LoadedModule {
    name: Arc<str>,
    sha256: String,
    version: Arc<str>,
    info: PluginInfo,
    pre: GuestPre,
    engine: Engine,
    /// Shared with the blocking thread that makes each call's store.
    sandbox: Arc<Sandbox>,
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// Bytes of log one call may write (`--guest-log-bytes-per-call`).
    log_bytes_per_call: usize,
    loaded_at: SystemTime,
    // Deadlines need the ticker running as long as any version can be called.
    ticker: Arc<EpochTicker>,
    /// The version's part of its module's share of the instance pool: held by every
    /// call's thread too, so it lasts until the version's last call has returned.
    share: Arc<VersionShare>,
}

impl std::fmt::Debug for LoadedModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModule")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("info", &self.info)
            .field("limits", &self.sandbox.grants.limits)
            .finish_non_exhaustive()
    }
}

/// What a module is made of before its `describe` call.
pub(crate) struct ModuleParts {
    pub(crate) name: Arc<str>,
    pub(crate) sha256: String,
    pub(crate) pre: GuestPre,
    pub(crate) engine: Engine,
    pub(crate) grants: ModuleGrants,
    pub(crate) directories: Arc<ModuleDirectories>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) ticker: Arc<EpochTicker>,
    pub(crate) log_bytes_per_call: usize,
    pub(crate) share: VersionShare,
}

impl LoadedModule {
    /// Calls `describe` and, if it answers sanely, makes the module callable: still on
    /// its validation permit, so a [`crate::VersionGate`] may call it; [`Self::serve`]
    /// then gives it the module's permits.
    pub(crate) async fn describe(
        parts: ModuleParts,
    ) -> Result<(LoadedModule, Arc<Semaphore>), CallError> {
        let version: Arc<str> = parts.sha256[..VERSION_DIGITS].into();
        let sandbox = Arc::new(Sandbox::new(
            parts.name.clone(),
            version.clone(),
            parts.grants,
            parts.directories,
            parts.share.need(),
        ));
        let mut module = LoadedModule {
            name: parts.name,
            sha256: parts.sha256,
            version,
            info: PluginInfo {
                name: String::new(),
                version: String::new(),
                supports_block: false,
                data_source_kinds: Vec::new(),
                capabilities: Vec::new(),
            },
            pre: parts.pre,
            engine: parts.engine,
            sandbox,
            // Validation runs on a permit of its own: it must not compete with the calls
            // of the version in service (a busy module would refuse its own update).
            permits: Arc::new(Semaphore::new(1)),
            metrics: parts.metrics,
            log_bytes_per_call: parts.log_bytes_per_call,
            loaded_at: SystemTime::now(),
            ticker: parts.ticker,
            share: Arc::new(parts.share),
        };
        let info = module
            .invoke(Call::Describe, async |g, s| g.describe(s).await)
            .await?;
        answer::check_info(&info, &module.pre.capabilities())
            .map_err(|reason| module.malformed(Call::Describe, reason))?;
        module.info = info;
        Ok((module, parts.permits))
    }

    /// Puts a described version on its module's permits: from now on its calls take
    /// them, within its share.
    pub(crate) fn serve(mut self, permits: Arc<Semaphore>) -> LoadedModule {
        self.permits = permits;
        self.share.described();
        self
    }

    /// The module's name (its file is `NAME.wasm`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The full sha256 of the module bytes, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The short version used in logs and errors: the first 12 hex digits of the sha256.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// What the plugin said about itself when it was loaded.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    pub fn limits(&self) -> Limits {
        self.sandbox.grants.limits
    }

    /// The linear memories and tables one call of this version creates: what its module
    /// reserves of the instance pool per call, and what its calls' stores allow.
    pub fn call_need(&self) -> CallNeed {
        self.share.need()
    }

    pub fn grants(&self) -> &ModuleGrants {
        &self.sandbox.grants
    }

    /// Checks, through the host's own open handle of the module's directory grant, that
    /// a hostPath or local volume about to be published is a directory and no symlink
    /// (or does not exist yet). Off the async threads, within the module's timeout: the
    /// grant may be on a hung filesystem.
    pub async fn check_volume_directory(&self, volume: &VolumeDirectory) -> Result<(), String> {
        let sandbox = self.sandbox.clone();
        let volume = volume.clone();
        let timeout = self.limits().timeout;
        let check = tokio::task::spawn_blocking(move || sandbox.check_volume_directory(&volume));
        match tokio::time::timeout(timeout, check).await {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => Err(format!("checking the volume's directory failed: {error}")),
            Err(_) => Err(format!(
                "checking the volume's directory did not finish within {timeout:?} (a hung filesystem?)"
            )),
        }
    }

    pub fn loaded_at(&self) -> SystemTime {
        self.loaded_at
    }

    /// Calls currently running in this module (all its versions share the budget).
    pub fn calls_in_flight(&self) -> u32 {
        let max = self.limits().max_concurrent_calls as usize;
        (max.saturating_sub(self.permits.available_permits())) as u32
    }

    /// The contract version the module was built for.
    pub fn contract(&self) -> ContractVersion {
        self.pre.contract()
    }

    /// Whether the module has an optional capability (it exports its interface).
    pub fn has(&self, capability: Capability) -> bool {
        self.info.capabilities.contains(&capability)
    }

    /// The plugin's veto before `provision`.
    pub async fn should_provision(&self, request: &ProvisionRequest) -> Result<bool, CallError> {
        let request = request.clone();
        self.ask(Call::ShouldProvision, async move |g, s| {
            g.should_provision(s, request).await
        })
        .await
    }

    /// Makes the backend volume. `Ok(Err(_))` is the plugin's own answer (ignored,
    /// failed, in background, reschedule, infeasible); `Err(_)` is a host-side failure.
    pub async fn provision(
        &self,
        request: &ProvisionRequest,
    ) -> Result<Result<Volume, ProvisionError>, CallError> {
        let request = request.clone();
        self.ask(Call::Provision, async move |g, s| {
            g.provision(s, request).await
        })
        .await
    }

    /// The plugin's veto before `delete`.
    pub async fn should_delete(&self, request: &DeleteRequest) -> Result<bool, CallError> {
        let request = request.clone();
        self.ask(Call::ShouldDelete, async move |g, s| {
            g.should_delete(s, request).await
        })
        .await
    }

    /// Deletes (or archives) the backend volume. `Ok(Err(_))` is the plugin's answer.
    pub async fn delete(
        &self,
        request: &DeleteRequest,
    ) -> Result<Result<(), DeleteError>, CallError> {
        let request = request.clone();
        self.ask(Call::Delete, async move |g, s| g.delete(s, request).await)
            .await
    }

    /// Grows the backend volume (capability `expand`): `Ok(Ok(bytes))` is its new
    /// capacity, `Ok(Err(_))` the plugin's refusal.
    pub async fn expand(
        &self,
        request: &ExpandRequest,
    ) -> Result<Result<u64, ExpandError>, CallError> {
        let request = request.clone();
        self.ask(Call::Expand, async move |g, s| g.expand(s, request).await)
            .await
    }

    /// The backend's space (capability `report-capacity`).
    pub async fn get_capacity(
        &self,
        request: &CapacityRequest,
    ) -> Result<Result<BackendCapacity, String>, CallError> {
        let request = request.clone();
        self.ask(Call::GetCapacity, async move |g, s| {
            g.get_capacity(s, request).await
        })
        .await
    }

    /// The plugin's verdict on a class (capability `validate-class`).
    pub async fn validate_class(&self, class: &Class) -> Result<Result<(), String>, CallError> {
        let class = class.clone();
        self.ask(Call::ValidateClass, async move |g, s| {
            g.validate_class(s, class).await
        })
        .await
    }

    /// One call whose answer is bounded in size (see [`answer::check_size`]).
    async fn ask<A: AnswerSize + Send + 'static>(
        &self,
        call: Call,
        run: impl AsyncFnOnce(&Guest, &mut Store<GuestState>) -> wasmtime::Result<A> + Send + 'static,
    ) -> Result<A, CallError> {
        let answer = self.invoke(call, run).await?;
        answer::check_size(&answer).map_err(|reason| self.malformed(call, reason))?;
        Ok(answer)
    }

    /// Which call of this version, for an error about it.
    pub fn target(&self, call: Call) -> CallTarget {
        CallTarget {
            module: self.name.to_string(),
            version: self.version.to_string(),
            call,
        }
    }

    fn malformed(&self, call: Call, reason: String) -> CallError {
        let error = CallError::MalformedAnswer {
            target: self.target(call),
            reason,
        };
        self.metrics
            .record_call(&self.name, Some(error.metric_label()));
        tracing::warn!(module = %self.name, version = %self.version, call = %call, "{error}");
        error
    }

    /// One call: a permit, a fresh store and instance, the export, the verdict.
    async fn invoke<R: Send + 'static>(
        &self,
        call: Call,
        run: impl AsyncFnOnce(&Guest, &mut Store<GuestState>) -> wasmtime::Result<R> + Send + 'static,
    ) -> Result<R, CallError> {
        let result = self.invoke_inner(call, run).await;
        self.metrics.record_call(
            &self.name,
            result.as_ref().err().map(CallError::metric_label),
        );
        if let Err(error) = &result {
            tracing::warn!(module = %self.name, version = %self.version, call = %call, "{error}");
        }
        result
    }

    /// The call runs on a blocking thread of its own, from the making of its store to
    /// its drop, with its filesystem operations inline on that thread (the sandbox
    /// allows it): a guest's `stat`, `rename` or `readdir` on a hung network filesystem
    /// blocks that thread, never an async worker, and costs no hand-off to yet another
    /// thread per operation. The async side waits at most the call's timeout (plus
    /// [`STUCK_CALL_GRACE`]); a call stuck in a system call keeps its thread, its
    /// instance and its permit until the system call returns ([`CallError::Stuck`]), so
    /// a hung backend holds at most its own module's `maxConcurrentCalls` threads. When
    /// the waiter goes (it timed out, or the controller dropped the call), the call is
    /// dropped on its thread at once if it waits in a host call, else at the guest's
    /// next epoch tick.
    async fn invoke_inner<R: Send + 'static>(
        &self,
        call: Call,
        run: impl AsyncFnOnce(&Guest, &mut Store<GuestState>) -> wasmtime::Result<R> + Send + 'static,
    ) -> Result<R, CallError> {
        let limits = self.limits();
        let permit = self
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| CallError::Busy {
                target: self.target(call),
                max_concurrent_calls: limits.max_concurrent_calls,
            })?;
        // Dropped when this future ends or is dropped: then the thread drops the call.
        let (_waiting, abandoned) = tokio::sync::oneshot::channel::<()>();
        let (sandbox, engine, pre) = (self.sandbox.clone(), self.engine.clone(), self.pre.clone());
        let (log_bytes_per_call, metrics) = (self.log_bytes_per_call, self.metrics.clone());
        let runtime = tokio::runtime::Handle::current();
        // The epochs must go on while the call runs, or a spinning guest would never
        // yield (nor meet its deadline): even when every `LoadedModule` and the
        // `Runtime` are gone (the process is shutting down, and waits for this thread).
        let ticker = self.ticker.clone();
        // The version's pool share outlives the call even when the version is replaced.
        let share = self.share.clone();
        let stuck = Arc::new(StuckWatch::default());
        let thread_end = ThreadEnd {
            watch: stuck.clone(),
            metrics: metrics.clone(),
            module: self.name.clone(),
        };
        let thread = tokio::task::spawn_blocking(move || {
            let (_permit, _ticker, _share, _end) = (permit, ticker, share, thread_end);
            let mut store = match call_store(&sandbox, &engine, call, log_bytes_per_call, metrics) {
                Ok(store) => store,
                Err(cause) => return CallEnd::NoSandbox(cause),
            };
            // The epoch deadline stops guest code; this timeout also bounds host I/O
            // the guest waits on (an HTTP request), which epochs cannot interrupt.
            let run = tokio::time::timeout(limits.timeout, async {
                let guest = pre.instantiate(&mut store).await?;
                run(&guest, &mut store).await
            });
            // Nobody waits any more: the call is dropped where it stands, in a host
            // call or, since the guest yields at every epoch tick, at its next tick.
            let end = runtime.block_on(async {
                tokio::select! {
                    biased;
                    _ = abandoned => CallEnd::Abandoned,
                    outcome = run => match outcome {
                        Err(_elapsed) => CallEnd::TimedOut,
                        Ok(answer) => CallEnd::Finished(answer, false),
                    },
                }
            });
            store.data().log.finish();
            match end {
                CallEnd::Finished(answer, _) => {
                    CallEnd::Finished(answer, store.data().limiter.exhausted())
                }
                other => other,
            }
        });
        let target = || self.target(call);
        match tokio::time::timeout(limits.timeout + STUCK_CALL_GRACE, thread).await {
            Err(_stuck) => {
                stuck.declare(&self.metrics, &self.name);
                Err(CallError::Stuck {
                    target: target(),
                    timeout: limits.timeout,
                })
            }
            Ok(Err(failed)) => Err(CallError::Trap {
                target: target(),
                cause: truncate(format!("the call's thread failed: {failed}")),
            }),
            Ok(Ok(CallEnd::NoSandbox(cause))) => Err(CallError::Sandbox {
                target: target(),
                cause,
            }),
            // Abandoned cannot be seen while this future still waits.
            Ok(Ok(CallEnd::TimedOut | CallEnd::Abandoned)) => Err(CallError::Timeout {
                target: target(),
                timeout: limits.timeout,
            }),
            Ok(Ok(CallEnd::Finished(Ok(answer), _))) => Ok(answer),
            Ok(Ok(CallEnd::Finished(Err(error), memory_exhausted))) => {
                Err(self.classify(call, error, memory_exhausted))
            }
        }
    }

    fn classify(&self, call: Call, error: wasmtime::Error, memory_exhausted: bool) -> CallError {
        let target = self.target(call);
        let limits = self.limits();
        if let Some(full) = error.downcast_ref::<PoolConcurrencyLimitError>() {
            return CallError::InstancesFull {
                target,
                cause: full.to_string(),
            };
        }
        if error.downcast_ref::<DeadlineExceeded>().is_some() {
            return CallError::Timeout {
                target,
                timeout: limits.timeout,
            };
        }
        if is_hostcall_fuel_exhausted(&error) {
            return CallError::MalformedAnswer {
                target,
                reason: format!(
                    "the guest handed the host more than {MAX_LIFT_BYTES} bytes in one go (its \
                     answer, or the arguments of one import call, counting every list element \
                     and string, aliased ones included); the host stopped copying it"
                ),
            };
        }
        if memory_exhausted
            || error
                .downcast_ref::<ResourceTableError>()
                .is_some_and(|e| matches!(e, ResourceTableError::Full))
        {
            return CallError::MemoryExhausted {
                target,
                limit_bytes: limits.memory_bytes,
            };
        }
        let cause = match error.downcast_ref::<Trap>() {
            Some(trap) => format!("{trap}: {error:?}"),
            None => format!("{error:?}"),
        };
        CallError::Trap {
            target,
            cause: truncate(cause),
        }
    }
}

/// Whether wasmtime stopped lifting guest data because the store's hostcall fuel ran
/// out. Wasmtime 48 keeps the error type private, so this matches its message; the test
/// `hostile_abi::aliased_answer_is_stopped_while_lifting` fails if that message changes.
fn is_hostcall_fuel_exhausted(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .to_string()
            .contains("fuel allocated for hostcalls has been exhausted")
    })
}

fn truncate(mut text: String) -> String {
    if text.len() > MAX_CAUSE_BYTES {
        let mut end = MAX_CAUSE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" ...");
    }
    text
}
