//! The one `wasmtime::Engine` of the process, and the epoch ticker that gives every
//! call its wall-clock deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, Strategy, WasmFeatures};

/// How often the epoch advances: the granularity of deadlines, and how often a
/// running guest yields its thread back to the async executor.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Builds the engine: Cranelift, epoch interruption, copy-on-write memory images, the
/// on-demand allocator (the pooling allocator reserves ~6 GiB of address space per
/// memory slot; a provisioner runs few instances at once), and only the proposals a
/// provisioner plugin plausibly needs.
pub fn new_engine() -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config
        .strategy(Strategy::Cranelift)
        .epoch_interruption(true)
        .memory_init_cow(true)
        .allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .signals_based_traps(true)
        .wasm_component_model(true)
        .parallel_compilation(true);
    // Proposals a provisioner does not need: less compiler and runtime surface. The
    // toolchains' defaults (bulk memory, multi-value, reference types, SIMD, ...) stay.
    for feature in [
        WasmFeatures::THREADS,
        WasmFeatures::SHARED_EVERYTHING_THREADS,
        WasmFeatures::MEMORY64,
        WasmFeatures::GC,
        WasmFeatures::STACK_SWITCHING,
        WasmFeatures::EXCEPTIONS,
        WasmFeatures::LEGACY_EXCEPTIONS,
        WasmFeatures::WIDE_ARITHMETIC,
        WasmFeatures::CUSTOM_PAGE_SIZES,
        WasmFeatures::CM_ASYNC,
        WasmFeatures::CM_MORE_ASYNC_BUILTINS,
        WasmFeatures::CM_ASYNC_STACKFUL,
        WasmFeatures::CM_THREADING,
        WasmFeatures::CM_ERROR_CONTEXT,
    ] {
        config.wasm_features(feature, false);
    }
    Engine::new(&config)
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`]. Without it, no
/// deadline would ever fire. Stops when dropped.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: &Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.clone();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
