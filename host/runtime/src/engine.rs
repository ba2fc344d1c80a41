//! The one `wasmtime::Engine` of the process, and the epoch ticker that gives every
//! call its wall-clock deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Strategy,
    WasmFeatures,
};

use super::limits::{MAX_INSTANCES, MAX_MEMORIES, MAX_TABLE_ELEMENTS, MAX_TABLES};

/// How often the epoch advances: the granularity of deadlines, and how often a
/// running guest yields its thread back to the async executor.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Default of `--max-guest-instances`: guest instances alive at once, every module
/// together (the size of the instance pool). Each module reserves one instance per call
/// of its `maxConcurrentCalls` (see `pool`), so this holds 16 modules at the default 8
/// calls (15 while one is replaced with calls in flight: the new version's `describe`
/// is reserved on top).
pub const DEFAULT_MAX_GUEST_INSTANCES: u32 = 128;

/// Linear-memory and table slots of the pool per instance of `--max-guest-instances`
/// (a Rust guest's call takes 1 memory; a Python or JavaScript guest's more). Each
/// module reserves its share of them at load, what one call defines times its
/// `maxConcurrentCalls` (see `pool`); a version that does not fit is refused.
pub const MEMORIES_PER_INSTANCE: u32 = 4;
pub const TABLES_PER_INSTANCE: u32 = 4;

/// Of each pooled linear memory, at most this many bytes the last call wrote are reset
/// in place when the call ends (restored to the module's initial image, or zeroed)
/// instead of being returned to the kernel; the rest is decommitted as before. With
/// Linux's `PAGEMAP_SCAN` (6.7 and later) only the pages the call wrote are reset.
/// Returning them (`madvise`) cost every call a TLB shootdown on every core and a page
/// fault for each page the next call touched: a third of a `should-provision` call's
/// CPU was the kernel's. A Rust guest's call writes a few hundred KiB; a Python or
/// JavaScript guest's more, of which this much is kept. The price is resident memory:
/// at most this much per memory slot in use.
const MEMORY_KEEP_RESIDENT_BYTES: usize = 1 << 20;

/// The same for each pooled table (a few KiB each).
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// The instance pool: how many guest instances may be alive at once, and the largest
/// linear memory any module may grow (the largest `memoryBytes` granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstancePool {
    pub max_guest_instances: u32,
    pub max_memory_bytes: u64,
}

impl Default for InstancePool {
    fn default() -> Self {
        InstancePool {
            max_guest_instances: DEFAULT_MAX_GUEST_INSTANCES,
            max_memory_bytes: super::limits::DEFAULT_MEMORY_BYTES,
        }
    }
}

/// The instance allocator the engine runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Slots for this many guest instances reserved once at start and reused
    /// ([`pooling`]).
    Pooling { instances: u32 },
    /// Each call maps its memories, tables and stack afresh, reserving only what its
    /// grant allows ([`on_demand`]): asked for with `--max-guest-instances 0`
    /// (`pool_unavailable` false), or because the pool's address space could not be
    /// reserved (`pool_unavailable` true: about twice the CPU per call, which an
    /// operator should hear of).
    OnDemand { pool_unavailable: bool },
}

/// Builds the engine: Cranelift, epoch interruption, copy-on-write memory images, the
/// pooling allocator (see [`pooling`]), and only the proposals a provisioner plugin
/// plausibly needs.
///
/// A pool whose address space cannot be reserved (a process address-space limit,
/// `ulimit -v`, is the usual cause) does not stop the host: it warns and runs with the
/// on-demand allocator instead, whose memories reserve only what a grant allows.
pub fn new_engine(pool: InstancePool) -> wasmtime::Result<(Engine, Allocator)> {
    if pool.max_guest_instances == 0 {
        return Ok((
            Engine::new(&on_demand(pool))?,
            Allocator::OnDemand {
                pool_unavailable: false,
            },
        ));
    }
    let mut config = common();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(pool)));
    match Engine::new(&config) {
        Ok(engine) => Ok((
            engine,
            Allocator::Pooling {
                instances: pool.max_guest_instances,
            },
        )),
        Err(error) => {
            let engine = Engine::new(&on_demand(pool))?;
            tracing::warn!(
                "cannot reserve the instance pool for {} guest instances ({error:#}); using the on-demand allocator instead: every call maps its memory afresh (about twice the CPU per call) and reserves only what its grant allows. To get the pool back, raise the process's address-space limit (ulimit -v) or lower --max-guest-instances; --max-guest-instances 0 chooses the on-demand allocator without this warning",
                pool.max_guest_instances
            );
            Ok((
                engine,
                Allocator::OnDemand {
                    pool_unavailable: true,
                },
            ))
        }
    }
}

/// What the compiled code of a component depends on besides the wasmtime version and
/// the target: the engine's codegen settings and tunables. An engine built from it by
/// [`compile_engine`] (in the compile child, without reserving any instance pool)
/// produces code the runtime's own engine accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodegenSettings {
    /// The pooling allocator's engine: the default memory tunables.
    Pooled,
    /// The on-demand allocator's engine, its memories reserving this many bytes.
    OnDemand { memory_reservation: u64 },
}

impl CodegenSettings {
    /// The settings the engine `new_engine` built with `pool` and ended up with
    /// `allocator` compiles with.
    pub fn of(allocator: Allocator, pool: InstancePool) -> Self {
        match allocator {
            Allocator::Pooling { .. } => CodegenSettings::Pooled,
            Allocator::OnDemand { .. } => CodegenSettings::OnDemand {
                memory_reservation: pool.max_memory_bytes,
            },
        }
    }
}

/// An engine that only compiles: the settings of the runtime's engine, with the
/// on-demand allocator (nothing reserved up front, so it works under an address-space
/// limit). Compiled code does not depend on the allocation strategy, only on the
/// settings and tunables, which are the same.
pub fn compile_engine(settings: CodegenSettings) -> wasmtime::Result<Engine> {
    let config = match settings {
        CodegenSettings::Pooled => {
            let mut config = common();
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            config
        }
        CodegenSettings::OnDemand { memory_reservation } => on_demand(InstancePool {
            max_guest_instances: 0,
            max_memory_bytes: memory_reservation,
        }),
    };
    Engine::new(&config)
}

/// The on-demand allocator, its linear memories reserving the largest memory granted
/// (and a 64 KiB guard) instead of 4 GiB each: bounds are checked by the compiled code
/// rather than by guard pages, so a host under an address-space limit can still run as
/// many calls at once as its workers make.
fn on_demand(pool: InstancePool) -> Config {
    let mut config = common();
    config
        .allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .memory_reservation(pool.max_memory_bytes)
        .memory_reservation_for_growth(0)
        .memory_guard_size(64 << 10);
    config
}

/// What both allocators share.
fn common() -> Config {
    let mut config = Config::new();
    config
        .strategy(Strategy::Cranelift)
        .epoch_interruption(true)
        .memory_init_cow(true)
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
    config
}

/// The pooling allocator: every call's instance, memories, tables and async stack come
/// from slots reserved once at start and reused, instead of being mapped and unmapped
/// per call. Each call makes a fresh instance (four per volume), so this is the hot
/// path: the on-demand allocator's mmap/munmap, page faults and TLB shootdowns were a
/// quarter of a call's CPU (see docs/benchmarks.md, "Plugin call benchmarks"). A slot's memory is reset
/// (zeroed, its copy-on-write image restored) when the call ends: nothing carries over.
///
/// The price is address space, not memory: each linear-memory slot reserves 4 GiB plus
/// a guard, never touched unless used (`MEMORIES_PER_INSTANCE` x 128 instances is about
/// 2 TiB of the 128 TiB a 64-bit process has).
///
/// Every module's calls fit the pool together: each module version reserves its share
/// at load (`pool`). Core instances are only a counter in the pool (no memory behind
/// them) and no public API tells how many a component makes, so the pool allows the
/// store's maximum (`MAX_INSTANCES`) for every instance: they cannot run out. A call
/// that still finds the pool full fails at once (`CallError::InstancesFull`, metric
/// label `pool_full`, a Warning Event).
fn pooling(pool: InstancePool) -> PoolingAllocationConfig {
    let instances = pool.max_guest_instances.max(1);
    let mut config = PoolingAllocationConfig::new();
    config
        .total_component_instances(instances)
        .total_stacks(instances)
        .total_core_instances(instances.saturating_mul(MAX_INSTANCES as u32))
        .total_memories(instances.saturating_mul(MEMORIES_PER_INSTANCE))
        .total_tables(instances.saturating_mul(TABLES_PER_INSTANCE))
        .max_core_instances_per_component(MAX_INSTANCES as u32)
        .max_memories_per_component(MAX_MEMORIES as u32)
        .max_tables_per_component(MAX_TABLES as u32)
        .max_memories_per_module(MAX_MEMORIES as u32)
        .max_tables_per_module(MAX_TABLES as u32)
        .table_elements(MAX_TABLE_ELEMENTS)
        .max_memory_size(usize::try_from(pool.max_memory_bytes).unwrap_or(usize::MAX))
        // Metadata of an instance (its VMContext: one entry per function, global,
        // table, memory): big guests (CPython, SpiderMonkey) need more than the 1 MiB
        // default.
        .max_core_instance_size(16 << 20)
        .max_component_instance_size(16 << 20)
        .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT_BYTES)
        .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
        .pagemap_scan(Enabled::Auto);
    config
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_on_demand_allocator_asked_for_is_not_an_unavailable_pool() {
        let (_, allocator) = new_engine(InstancePool {
            max_guest_instances: 0,
            ..InstancePool::default()
        })
        .expect("engine");
        assert_eq!(
            allocator,
            Allocator::OnDemand {
                pool_unavailable: false
            }
        );
    }
}
