//! Per-module resource limits: wall-clock deadline, total guest memory, concurrent
//! calls, and the bound on the size of a guest's answer.
//!
//! Defaults are named constants; an admin overrides them per module (or for every
//! module) in the grants file (see [`super::grants`]).

use std::time::Duration;

/// Default wall-clock budget of one call (instantiation included).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default budget of linear memory, summed over all the memories of one instance.
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

/// Bound on table elements per instance (each costs the host a pointer).
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
    /// Total linear memory of one instance, all memories together.
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

/// A [`wasmtime::ResourceLimiter`] that bounds the total size of *all* linear memories
/// of a store, not each memory on its own (`StoreLimits` is per memory; a component can
/// hold several).
#[derive(Debug)]
pub struct MemoryLimiter {
    limit_bytes: u64,
    total_bytes: u64,
    /// The growth last permitted, undone if the growth then fails.
    pending_bytes: u64,
    /// Set when a growth was refused: a trap after that is reported as memory exhaustion.
    exhausted: bool,
}

impl MemoryLimiter {
    pub fn new(limit_bytes: u64) -> Self {
        MemoryLimiter {
            limit_bytes,
            total_bytes: 0,
            pending_bytes: 0,
            exhausted: false,
        }
    }

    /// Whether the guest asked for more memory than its budget at some point.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// Linear memory in use, all memories together.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
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
        match self.total_bytes.checked_add(delta) {
            Some(total) if total <= self.limit_bytes => {
                self.total_bytes = total;
                self.pending_bytes = delta;
                Ok(true)
            }
            _ => {
                self.exhausted = true;
                Ok(false)
            }
        }
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total_bytes -= std::mem::take(&mut self.pending_bytes);
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
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
    fn failed_growth_is_given_back() {
        let mut limiter = MemoryLimiter::new(4 * MIB as u64);
        assert!(limiter.memory_growing(0, 3 * MIB, None).unwrap());
        limiter
            .memory_grow_failed(wasmtime::Error::msg("no"))
            .unwrap();
        assert_eq!(limiter.total_bytes(), 0);
    }
}
