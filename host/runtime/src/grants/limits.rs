//! Per-module resource limits: wall-clock deadline, total guest memory (linear memories
//! and tables together), concurrent calls, and the bounds on what a guest hands the
//! host (its answer, its log).
//!
//! Defaults are named constants; an admin overrides them per module (or for every
//! module) in the grants file (see [`super`]).

use std::time::Duration;

/// Default wall-clock budget of one call (instantiation included).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default memory budget of one call: every linear memory and every table of the call's
/// instances together.
pub const DEFAULT_MEMORY_BYTES: u64 = 128 * 1024 * 1024;
/// Default number of calls into one module that may run at the same time.
pub const DEFAULT_MAX_CONCURRENT_CALLS: u32 = 8;

/// Upper bounds an admin override may not exceed (a typo should not disable a limit).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
pub const MAX_MEMORY_BYTES: u64 = 4 * 1024 * 1024 * 1024;
pub const MIN_MEMORY_BYTES: u64 = 1024 * 1024;
pub const MAX_CONCURRENT_CALLS: u32 = 1024;

/// Bound on the total bytes of strings in one answer (a volume, an error message, a
/// plugin-info): a PV is a small object, anything bigger is a broken or hostile guest.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Most bytes the host may allocate while lifting what a guest hands it in one go: an
/// export's answer, or the arguments of one import call (`log`, WASI). Enforced by
/// wasmtime's hostcall fuel, which counts string bytes plus the host size of every list
/// element (up to 72 bytes for a node selector requirement, where [`MAX_ANSWER_BYTES`]
/// counts 8), so every answer under `MAX_ANSWER_BYTES` lifts, and a hostile one (many
/// list elements aliasing one big string) stops at this many bytes instead of
/// allocating gigabytes before the size check after the call.
pub const MAX_LIFT_BYTES: usize = 10 * MAX_ANSWER_BYTES;

/// Default bound on the bytes of guest log (the `log` import and stdout/stderr
/// together, messages and fields) one call may write; the rest is dropped and counted.
pub const DEFAULT_GUEST_LOG_BYTES_PER_CALL: usize = 64 * 1024;

/// Host bytes charged per table element against the memory budget. Wasmtime 48 stores
/// a funcref element in 8 bytes, a GC reference in 4 and a continuation in 16; charging
/// the largest keeps the bound conservative whatever the element type.
pub const TABLE_ELEMENT_BYTES: u64 = 16;
/// Bound on the elements of one table, whatever the memory budget.
pub const MAX_TABLE_ELEMENTS: usize = 1_000_000;
/// Bound on instances, memories and tables per store: a component built by a normal
/// toolchain uses a handful; Python and JS guests use more memories than Rust ones.
pub const MAX_INSTANCES: usize = 64;
pub const MAX_MEMORIES: usize = 64;
pub const MAX_TABLES: usize = 256;

/// The limits one module runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline of one call.
    pub timeout: Duration,
    /// Memory of one call: all linear memories and tables of its instances together.
    pub memory_bytes: u64,
    /// Calls allowed at the same time; more fail at once with `CallError::Busy`.
    pub max_concurrent_calls: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: DEFAULT_TIMEOUT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            max_concurrent_calls: DEFAULT_MAX_CONCURRENT_CALLS,
        }
    }
}

/// A [`wasmtime::ResourceLimiter`] that bounds the host memory a store's guest can make
/// the host hold: the total size of *all* linear memories **and all tables** of the
/// store against one budget, not each memory on its own (`StoreLimits` is per memory; a
/// component can hold several), and not memories only (a table of a million elements is
/// megabytes of host heap: 256 such tables were 2 GB with a 1 MiB memory limit).
#[derive(Debug)]
pub struct MemoryLimiter {
    limit_bytes: u64,
    total_bytes: u64,
    /// The memory growth last permitted, undone if the growth then fails.
    pending_memory_bytes: u64,
    /// The table growth last permitted, undone if the growth then fails.
    pending_table_bytes: u64,
    /// Set when a growth was refused: a trap after that is reported as memory exhaustion.
    exhausted: bool,
    /// Linear memories and tables the store may create: the call's version's need,
    /// what its module reserved of the instance pool (see `pool`).
    max_memories: usize,
    max_tables: usize,
}

impl MemoryLimiter {
    pub fn new(limit_bytes: u64) -> Self {
        MemoryLimiter {
            limit_bytes,
            total_bytes: 0,
            pending_memory_bytes: 0,
            pending_table_bytes: 0,
            exhausted: false,
            max_memories: MAX_MEMORIES,
            max_tables: MAX_TABLES,
        }
    }

    /// At most `memories` linear memories and `tables` tables in the store (never more
    /// than [`MAX_MEMORIES`] and [`MAX_TABLES`]): a component's instantiation is static,
    /// so its calls create exactly what it defines, and this only holds them to it.
    pub fn with_slots(mut self, memories: u32, tables: u32) -> Self {
        self.max_memories = (memories as usize).min(MAX_MEMORIES);
        self.max_tables = (tables as usize).min(MAX_TABLES);
        self
    }

    /// Whether the guest asked for more memory than its budget at some point.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// Memory charged: linear memories plus [`TABLE_ELEMENT_BYTES`] per table element.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Charges `delta` bytes to the budget; false (and `exhausted`) when it does not fit.
    fn charge(&mut self, delta: u64) -> bool {
        match self.total_bytes.checked_add(delta) {
            Some(total) if total <= self.limit_bytes => {
                self.total_bytes = total;
                true
            }
            _ => {
                self.exhausted = true;
                false
            }
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Memories only grow, and a new memory reports current = 0: the sum of the
        // deltas is the total of all memories.
        let delta = desired.saturating_sub(current) as u64;
        let granted = self.charge(delta);
        self.pending_memory_bytes = if granted { delta } else { 0 };
        Ok(granted)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total_bytes -= std::mem::take(&mut self.pending_memory_bytes);
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Like memories: tables only grow and a new table reports current = 0, so the
        // deltas sum to every table's size. Both share the one budget.
        if desired > MAX_TABLE_ELEMENTS {
            self.exhausted = true;
            return Ok(false);
        }
        let delta = (desired.saturating_sub(current) as u64).saturating_mul(TABLE_ELEMENT_BYTES);
        let granted = self.charge(delta);
        self.pending_table_bytes = if granted { delta } else { 0 };
        Ok(granted)
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total_bytes -= std::mem::take(&mut self.pending_table_bytes);
        Ok(())
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        self.max_tables
    }

    fn memories(&self) -> usize {
        self.max_memories
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn sums_all_memories_against_one_budget() {
        let mut limiter = MemoryLimiter::new(3 * MIB as u64);
        assert!(limiter.memory_growing(0, 2 * MIB, None).unwrap());
        // A second memory of 2 MiB would fit on its own but not in the shared budget.
        assert!(!limiter.memory_growing(0, 2 * MIB, None).unwrap());
        assert!(limiter.exhausted());
        assert!(limiter.memory_growing(0, MIB, None).unwrap());
        assert_eq!(limiter.total_bytes(), 3 * MIB as u64);
    }

    #[test]
    fn growth_counts_only_the_delta() {
        let mut limiter = MemoryLimiter::new(4 * MIB as u64);
        assert!(limiter.memory_growing(0, MIB, None).unwrap());
        assert!(limiter.memory_growing(MIB, 4 * MIB, None).unwrap());
        assert!(!limiter.exhausted());
        assert!(!limiter.memory_growing(4 * MIB, 4 * MIB + 1, None).unwrap());
    }

    #[test]
    fn tables_are_charged_to_the_same_budget() {
        let mut limiter = MemoryLimiter::new(2 * MIB as u64);
        assert!(limiter.memory_growing(0, MIB, None).unwrap());
        // 65536 elements of 16 bytes: exactly the MiB left.
        assert!(limiter.table_growing(0, 65_536, None).unwrap());
        assert_eq!(limiter.total_bytes(), 2 * MIB as u64);
        assert!(!limiter.exhausted());
        // One more element, or a second table, does not fit any more.
        assert!(!limiter.table_growing(65_536, 65_537, None).unwrap());
        assert!(limiter.exhausted());
        assert!(!limiter.table_growing(0, 1, None).unwrap());
        assert!(!limiter.memory_growing(MIB, MIB + 1, None).unwrap());
    }

    #[test]
    fn the_table_bomb_of_issue_9_does_not_fit_one_mib() {
        // 256 tables of a million elements each were 2 GB of host heap.
        let mut limiter = MemoryLimiter::new(MIB as u64);
        let granted = (0..256)
            .take_while(|_| limiter.table_growing(0, MAX_TABLE_ELEMENTS, None).unwrap())
            .count();
        assert_eq!(granted, 0);
        assert!(limiter.exhausted());
        assert!(
            !limiter
                .table_growing(0, MAX_TABLE_ELEMENTS + 1, None)
                .unwrap()
        );
    }

    #[test]
    fn failed_table_growth_is_given_back() {
        let mut limiter = MemoryLimiter::new(4 * MIB as u64);
        assert!(limiter.table_growing(0, 1000, None).unwrap());
        limiter
            .table_grow_failed(wasmtime::Error::msg("no"))
            .unwrap();
        assert_eq!(limiter.total_bytes(), 0);
    }

    /// A store may create no more memories and tables than its version reserved of
    /// the instance pool: an instance defining one more fails to instantiate.
    #[test]
    fn a_store_creates_no_more_memories_and_tables_than_reserved() {
        let engine = wasmtime::Engine::default();
        let instantiate = |memories: u32, tables: u32, wat: &str| {
            let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
            let mut store = wasmtime::Store::new(
                &engine,
                MemoryLimiter::new(4 * MIB as u64).with_slots(memories, tables),
            );
            store.limiter(|limiter| limiter);
            wasmtime::Instance::new(&mut store, &module, &[]).map(|_| ())
        };
        let two = "(module (memory 1) (memory 1) (table 1 funcref) (table 1 funcref))";
        instantiate(2, 2, two).expect("exactly what it reserved");
        for (memories, tables) in [(1, 2), (2, 1)] {
            let error = instantiate(memories, tables, two).unwrap_err();
            assert!(
                format!("{error:#}").contains("resource limit exceeded"),
                "{error:#}"
            );
        }
    }

    #[test]
    fn failed_growth_is_given_back() {
        let mut limiter = MemoryLimiter::new(4 * MIB as u64);
        assert!(limiter.memory_growing(0, 3 * MIB, None).unwrap());
        limiter
            .memory_grow_failed(wasmtime::Error::msg("no"))
            .unwrap();
        assert_eq!(limiter.total_bytes(), 0);
    }
}
