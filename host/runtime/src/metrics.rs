//! Counters of the plugin runtime: loads, refusals, removals and call outcomes, per
//! module, plus compiles and compile-cache hits and misses. Plain counters; the metrics
//! endpoint reads them at each scrape.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one module name (all its versions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleCounters {
    /// Versions accepted and put in service (the first load counts).
    pub reloads_total: u64,
    /// Versions refused (compile error, wrong world, `describe` failed, ...).
    pub refusals_total: u64,
    /// Of those, versions whose compile was stopped at a limit, by limit (`timeout`,
    /// `memory`).
    pub compile_limit_refusals_total: BTreeMap<&'static str, u64>,
    /// Times the module was taken out of service because its file disappeared.
    pub removals_total: u64,
    /// Calls made (all outcomes).
    pub calls_total: u64,
    /// Calls that failed in the host's sandbox, by `CallError::metric_label`.
    pub call_failures_total: BTreeMap<&'static str, u64>,
    /// Bytes of guest log (the `log` import, stdout, stderr) dropped past a call's
    /// bounds (`--guest-log-bytes-per-call`, lines per call, line length).
    pub guest_log_dropped_bytes_total: u64,
    /// Calls running now past their timeout, stuck in a system call (a hung network
    /// filesystem): each holds a thread, an instance and one of the module's
    /// `maxConcurrentCalls` until the system call returns. A gauge.
    pub calls_stuck: u64,
    /// Pulls of its OCI source, by outcome (`pulled`, `store_hit`, `unchanged`,
    /// `registry_error`, `digest_mismatch`, `too_large`, `not_a_module`, `unsigned`,
    /// `bad_signature`).
    pub pulls_total: BTreeMap<&'static str, u64>,
}

/// The runtime's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    compiles_total: AtomicU64,
    cache_hits_total: AtomicU64,
    cache_misses_total: AtomicU64,
    modules: Mutex<BTreeMap<String, ModuleCounters>>,
    /// Modules the grants file names that the last scan found no file for.
    grants_without_module: Mutex<Vec<String>>,
}

impl Metrics {
    /// Components compiled from wasm (cache misses included).
    pub fn compiles_total(&self) -> u64 {
        self.compiles_total.load(Ordering::Relaxed)
    }

    /// Components loaded from the precompiled cache without compiling.
    pub fn cache_hits_total(&self) -> u64 {
        self.cache_hits_total.load(Ordering::Relaxed)
    }

    /// Loads that found no usable entry in the precompiled cache (none, or one refused)
    /// and compiled; always 0 without `--cache-dir`.
    pub fn cache_misses_total(&self) -> u64 {
        self.cache_misses_total.load(Ordering::Relaxed)
    }

    /// The counters of one module (zero when never seen).
    pub fn module(&self, name: &str) -> ModuleCounters {
        self.lock().get(name).cloned().unwrap_or_default()
    }

    /// The counters of every module seen.
    pub fn snapshot(&self) -> BTreeMap<String, ModuleCounters> {
        self.lock().clone()
    }

    /// One component load: from the cache (`cache_hit`), or compiled, which is a cache
    /// miss when a cache is configured (`cached`).
    pub(crate) fn record_compile(&self, cache_hit: bool, cached: bool) {
        if cache_hit {
            self.cache_hits_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.compiles_total.fetch_add(1, Ordering::Relaxed);
        if cached {
            self.cache_misses_total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Modules the grants file names but the modules directory lacked at the last scan
    /// (a typo in the grants file, or a module not deployed yet).
    pub fn grants_without_module(&self) -> Vec<String> {
        self.grants_without_module
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_grants_without_module(&self, modules: Vec<String>) {
        *self
            .grants_without_module
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = modules;
    }

    pub(crate) fn record_reload(&self, module: &str) {
        self.update(module, |c| c.reloads_total += 1);
    }

    pub(crate) fn record_refusal(&self, module: &str) {
        self.update(module, |c| c.refusals_total += 1);
    }

    pub(crate) fn record_compile_limit_refusal(&self, module: &str, limit: &'static str) {
        self.update(module, |c| {
            *c.compile_limit_refusals_total.entry(limit).or_default() += 1
        });
    }

    pub(crate) fn record_removal(&self, module: &str) {
        self.update(module, |c| c.removals_total += 1);
    }

    pub(crate) fn record_call(&self, module: &str, failure: Option<&'static str>) {
        self.update(module, |c| {
            c.calls_total += 1;
            if let Some(label) = failure {
                *c.call_failures_total.entry(label).or_default() += 1;
            }
        });
    }

    /// A call's waiter gave up on it while its thread was still in a system call.
    pub(crate) fn record_stuck_call(&self, module: &str) {
        self.update(module, |c| c.calls_stuck += 1);
    }

    /// A stuck call's thread has returned.
    pub(crate) fn record_stuck_call_ended(&self, module: &str) {
        self.update(module, |c| c.calls_stuck = c.calls_stuck.saturating_sub(1));
    }

    pub(crate) fn record_pull(&self, module: &str, outcome: &'static str) {
        self.update(module, |c| *c.pulls_total.entry(outcome).or_default() += 1);
    }

    pub(crate) fn record_log_dropped(&self, module: &str, bytes: u64) {
        self.update(module, |c| c.guest_log_dropped_bytes_total += bytes);
    }

    fn update(&self, module: &str, change: impl FnOnce(&mut ModuleCounters)) {
        let mut modules = self.lock();
        match modules.get_mut(module) {
            Some(counters) => change(counters),
            None => change(modules.entry(module.to_string()).or_default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ModuleCounters>> {
        self.modules.lock().unwrap_or_else(|e| e.into_inner())
    }
}
