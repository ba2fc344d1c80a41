//! Each module's share of the shared instance pool.
//!
//! The pooling allocator has a fixed number of slots for every module together
//! (`--max-guest-instances` instances, each with its async stack, and 4 linear-memory
//! and 4 table slots per instance). A call takes one instance and as many memory and
//! table slots as its component defines: a component's instantiation is static (no
//! core instance, memory or table is created after it), so that number is known at load
//! from the compiled component ([`CallNeed::of`]). Without a bound, a module defining
//! many tables could fill the pool with a few calls and every other module's call would
//! fail for want of a slot. So a module version is put in service only if its share,
//! what one call needs times its `maxConcurrentCalls`, fits beside the shares of every
//! module in service; and each call's store may create no more memories and tables than
//! its version needs (`MemoryLimiter`), so a module never holds more than it reserved.
//!
//! A module's share lasts while any of its versions can still have calls: an old
//! version's calls may finish after a new one is in service, so the module reserves the
//! largest need of its live versions. A new version's `describe` runs outside the
//! module's `maxConcurrentCalls`: when another version of the module is live it is
//! reserved on top until it answers. Core instances are not counted here (no public
//! API tells how many a component makes); the pool allows `MAX_INSTANCES` per instance
//! slot, which a store cannot pass, so they cannot run out. The on-demand allocator
//! (`--max-guest-instances 0`, or a pool that could not be reserved) has no slots to
//! share: every version fits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use wasmtime::component::Component;

use super::engine::{Allocator, MEMORIES_PER_INSTANCE, TABLES_PER_INSTANCE};
use super::limits::{MAX_MEMORIES, MAX_TABLES};

/// The linear memories and tables one call of a module version creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallNeed {
    pub memories: u32,
    pub tables: u32,
}

impl CallNeed {
    /// What every core instance the component makes defines. A component importing a
    /// core module (which this host's linker never provides) cannot be counted: it is
    /// taken at the store's maxima.
    pub fn of(component: &Component) -> CallNeed {
        match component.resources_required() {
            Some(required) => CallNeed {
                memories: required.num_memories,
                tables: required.num_tables,
            },
            None => CallNeed {
                memories: MAX_MEMORIES as u32,
                tables: MAX_TABLES as u32,
            },
        }
    }

    fn max(self, other: CallNeed) -> CallNeed {
        CallNeed {
            memories: self.memories.max(other.memories),
            tables: self.tables.max(other.tables),
        }
    }
}

/// Slots of the pool: instances (one per call, each with its stack), linear memories
/// and tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slots {
    pub instances: u64,
    pub memories: u64,
    pub tables: u64,
}

impl Slots {
    /// The pool the engine reserves for `--max-guest-instances` instances.
    pub fn pool(instances: u32) -> Slots {
        let instances = u64::from(instances);
        Slots {
            instances,
            memories: instances * u64::from(MEMORIES_PER_INSTANCE),
            tables: instances * u64::from(TABLES_PER_INSTANCE),
        }
    }

    /// What `calls` calls at once of a version needing `need` take.
    pub fn for_calls(need: CallNeed, calls: u32) -> Slots {
        let calls = u64::from(calls);
        Slots {
            instances: calls,
            memories: calls * u64::from(need.memories),
            tables: calls * u64::from(need.tables),
        }
    }

    fn plus(self, other: Slots) -> Slots {
        Slots {
            instances: self.instances + other.instances,
            memories: self.memories + other.memories,
            tables: self.tables + other.tables,
        }
    }

    fn minus(self, other: Slots) -> Slots {
        Slots {
            instances: self.instances.saturating_sub(other.instances),
            memories: self.memories.saturating_sub(other.memories),
            tables: self.tables.saturating_sub(other.tables),
        }
    }

    fn fits_in(self, capacity: Slots) -> bool {
        self.instances <= capacity.instances
            && self.memories <= capacity.memories
            && self.tables <= capacity.tables
    }
}

/// Why a module version does not fit the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolShareError {
    pub module: String,
    pub need: CallNeed,
    pub calls: u32,
    /// The module's share with this version: its calls, plus its `describe` when
    /// another version of it is live.
    pub share: Slots,
    /// What the other modules' shares leave.
    pub left: Slots,
    pub capacity: Slots,
    /// Whether another version of the module is live (its calls may still run).
    pub describe_on_top: bool,
}

impl fmt::Display for PoolShareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PoolShareError {
            module,
            need,
            calls,
            share,
            left,
            capacity,
            describe_on_top,
        } = self;
        write!(
            f,
            "its share of the host's instance pool does not fit: each call needs {} linear \
             memories and {} tables x {calls} calls at once (modules.{module}.limits.\
             maxConcurrentCalls){}: {} memories, {} tables and {} instances, but only {} \
             memories, {} tables and {} instances are left (the pool holds {}, {} and {} for \
             --max-guest-instances {}; the other modules in service reserve the rest). Raise \
             --max-guest-instances, or lower modules.{module}.limits.maxConcurrentCalls (or \
             the other modules')",
            need.memories,
            need.tables,
            if *describe_on_top {
                ", plus one call to validate it while its previous version's calls may run"
            } else {
                ""
            },
            share.memories,
            share.tables,
            share.instances,
            left.memories,
            left.tables,
            left.instances,
            capacity.memories,
            capacity.tables,
            capacity.instances,
            capacity.instances,
        )
    }
}

impl std::error::Error for PoolShareError {}

/// The shares of every module with a live version. Cheap to clone; clones share.
#[derive(Clone)]
pub struct PoolShares {
    ledger: Arc<Mutex<Ledger>>,
}

struct Ledger {
    /// `None`: the on-demand allocator, nothing to share.
    capacity: Option<Slots>,
    modules: HashMap<String, ModuleShare>,
    next_id: u64,
}

#[derive(Default)]
struct ModuleShare {
    /// The module's `maxConcurrentCalls` (every version shares them).
    calls: u32,
    /// The need of each live version.
    versions: BTreeMap<u64, CallNeed>,
    /// The versions whose `describe` is reserved on top of the calls.
    describing: BTreeSet<u64>,
}

impl ModuleShare {
    fn reserved(&self) -> Slots {
        let need = self
            .versions
            .values()
            .fold(CallNeed::default(), |a, b| a.max(*b));
        self.describing
            .iter()
            .filter_map(|id| self.versions.get(id))
            .fold(Slots::for_calls(need, self.calls), |sum, need| {
                sum.plus(Slots::for_calls(*need, 1))
            })
    }
}

impl Ledger {
    fn reserved_by_others(&self, module: &str) -> Slots {
        self.modules
            .iter()
            .filter(|(name, _)| name.as_str() != module)
            .fold(Slots::default(), |sum, (_, share)| {
                sum.plus(share.reserved())
            })
    }
}

impl PoolShares {
    /// The shares of the pool `allocator` has (none to share on demand).
    pub fn new(allocator: Allocator) -> PoolShares {
        PoolShares::with_capacity(match allocator {
            Allocator::Pooling { instances } => Some(Slots::pool(instances)),
            Allocator::OnDemand { .. } => None,
        })
    }

    pub fn with_capacity(capacity: Option<Slots>) -> PoolShares {
        PoolShares {
            ledger: Arc::new(Mutex::new(Ledger {
                capacity,
                modules: HashMap::new(),
                next_id: 0,
            })),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a new version of `module` (`calls` its `maxConcurrentCalls`, `need`
    /// what one call takes), its `describe` included, if that fits beside the other
    /// modules' shares. The share lasts until the returned value is dropped.
    pub fn reserve(
        &self,
        module: &str,
        calls: u32,
        need: CallNeed,
    ) -> Result<VersionShare, PoolShareError> {
        let mut ledger = self.ledger();
        let id = ledger.next_id;
        let current = ledger.modules.get(module);
        let describe_on_top = current.is_some_and(|share| !share.versions.is_empty());
        let mut share = ModuleShare {
            calls: current.map_or(calls, |share| share.calls.max(calls)),
            versions: current
                .map(|share| share.versions.clone())
                .unwrap_or_default(),
            describing: current
                .map(|share| share.describing.clone())
                .unwrap_or_default(),
        };
        share.versions.insert(id, need);
        if describe_on_top {
            share.describing.insert(id);
        }
        if let Some(capacity) = ledger.capacity {
            let left = capacity.minus(ledger.reserved_by_others(module));
            let wanted = share.reserved();
            if !wanted.fits_in(left) {
                return Err(PoolShareError {
                    module: module.to_string(),
                    need,
                    calls,
                    share: wanted,
                    left,
                    capacity,
                    describe_on_top,
                });
            }
        }
        ledger.next_id += 1;
        ledger.modules.insert(module.to_string(), share);
        Ok(VersionShare {
            ledger: self.ledger.clone(),
            module: module.to_string(),
            id,
            need,
        })
    }

    /// The slots every module reserves now.
    pub fn reserved(&self) -> Slots {
        self.ledger().reserved_by_others("")
    }
}

/// One live version's part of its module's share; dropped when the version can have no
/// more calls (out of service, and its last call's thread returned).
pub struct VersionShare {
    ledger: Arc<Mutex<Ledger>>,
    module: String,
    id: u64,
    need: CallNeed,
}

impl fmt::Debug for VersionShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionShare")
            .field("module", &self.module)
            .field("need", &self.need)
            .finish_non_exhaustive()
    }
}

impl VersionShare {
    /// What one call of the version may create: its store's limits.
    pub fn need(&self) -> CallNeed {
        self.need
    }

    /// The version's `describe` answered: the slots reserved for it on top of the
    /// module's calls go back to the pool.
    pub fn described(&self) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = ledger.modules.get_mut(&self.module) {
            share.describing.remove(&self.id);
        }
    }
}

impl Drop for VersionShare {
    fn drop(&mut self) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = ledger.modules.get_mut(&self.module) {
            share.versions.remove(&self.id);
            share.describing.remove(&self.id);
            if share.versions.is_empty() {
                ledger.modules.remove(&self.module);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUST: CallNeed = CallNeed {
        memories: 1,
        tables: 2,
    };

    fn pool(instances: u32) -> PoolShares {
        PoolShares::with_capacity(Some(Slots::pool(instances)))
    }

    #[test]
    fn the_default_pool_has_512_memories_and_512_tables() {
        assert_eq!(
            Slots::pool(128),
            Slots {
                instances: 128,
                memories: 512,
                tables: 512
            }
        );
    }

    #[test]
    fn a_share_is_one_call_s_need_times_max_concurrent_calls() {
        let shares = pool(128);
        let _hostpath = shares.reserve("hostpath", 8, RUST).unwrap();
        assert_eq!(
            shares.reserved(),
            Slots {
                instances: 8,
                memories: 8,
                tables: 16
            }
        );
    }

    #[test]
    fn the_pentest_s_module_is_refused_and_the_others_keep_their_share() {
        let shares = pool(128);
        let _hostpath = shares.reserve("hostpath", 8, RUST).unwrap();
        // 100 tables in each of three core modules, 8 calls: 2400 of 512 table slots.
        let hog = CallNeed {
            memories: 3,
            tables: 300,
        };
        let error = shares.reserve("hog", 8, hog).unwrap_err();
        assert_eq!(error.share.tables, 2400);
        assert_eq!(error.left.tables, 512 - 16);
        assert_eq!(error.left.memories, 512 - 8);
        assert_eq!(error.left.instances, 120);
        assert!(!error.describe_on_top);
        let message = error.to_string();
        for part in [
            "300 tables x 8 calls",
            "modules.hog.limits.maxConcurrentCalls",
            "--max-guest-instances 128",
            "only 504 memories, 496 tables and 120 instances are left",
        ] {
            assert!(message.contains(part), "{part:?} missing in: {message}");
        }
        // Nothing was reserved for it.
        assert_eq!(shares.reserved().tables, 16);
        // At one call it fits: 300 of the 496 left.
        let _hog = shares.reserve("hog", 1, hog).unwrap();
        assert_eq!(shares.reserved().tables, 316);
    }

    #[test]
    fn instances_are_reserved_one_per_call() {
        let shares = pool(16);
        let _a = shares.reserve("a", 8, CallNeed::default()).unwrap();
        let _b = shares.reserve("b", 8, CallNeed::default()).unwrap();
        let error = shares.reserve("c", 1, CallNeed::default()).unwrap_err();
        assert_eq!(error.left.instances, 0);
    }

    #[test]
    fn a_pool_exactly_full_fits() {
        let shares = pool(4);
        let need = CallNeed {
            memories: 4,
            tables: 4,
        };
        let _all = shares.reserve("all", 4, need).unwrap();
        assert_eq!(shares.reserved(), Slots::pool(4));
    }

    #[test]
    fn the_first_version_s_describe_runs_within_the_share() {
        // No other version of the module is live, so none of its calls can run while
        // it is validated: one call's slots are enough.
        let shares = pool(1);
        let only = shares.reserve("only", 1, RUST).unwrap();
        only.described();
        assert_eq!(shares.reserved(), Slots::for_calls(RUST, 1));
    }

    #[test]
    fn a_new_version_reserves_its_describe_on_top_and_the_larger_need_while_the_old_lives() {
        let shares = pool(128);
        let old = shares.reserve("m", 8, RUST).unwrap();
        old.described();
        let bigger = CallNeed {
            memories: 2,
            tables: 5,
        };
        let new = shares.reserve("m", 8, bigger).unwrap();
        // The old version's 8 calls may still run beside the new version's describe.
        assert_eq!(
            shares.reserved(),
            Slots::for_calls(bigger, 8).plus(Slots::for_calls(bigger, 1))
        );
        new.described();
        assert_eq!(shares.reserved(), Slots::for_calls(bigger, 8));
        // The old version's last call ended: only the new need counts. A smaller new
        // need would have kept the old, larger one while the old version lived.
        drop(old);
        assert_eq!(shares.reserved(), Slots::for_calls(bigger, 8));
        let smaller = shares.reserve("m", 8, RUST).unwrap();
        smaller.described();
        assert_eq!(shares.reserved(), Slots::for_calls(bigger, 8));
        drop(new);
        assert_eq!(shares.reserved(), Slots::for_calls(RUST, 8));
        drop(smaller);
        assert_eq!(shares.reserved(), Slots::default());
    }

    #[test]
    fn a_new_version_that_does_not_fit_leaves_the_old_share_as_it_was() {
        let shares = pool(4);
        let old = shares.reserve("m", 2, RUST).unwrap();
        old.described();
        let huge = CallNeed {
            memories: 1,
            tables: 9,
        };
        // 3 calls (2 + its describe) x 9 tables = 27 of 16.
        let error = shares.reserve("m", 2, huge).unwrap_err();
        assert!(error.describe_on_top);
        assert_eq!(error.share.tables, 27);
        assert!(error.to_string().contains("validate it"), "{error}");
        assert_eq!(shares.reserved(), Slots::for_calls(RUST, 2));
    }

    #[test]
    fn a_refused_describe_gives_its_slots_back() {
        let shares = pool(128);
        let failed = shares.reserve("m", 8, RUST).unwrap();
        drop(failed);
        assert_eq!(shares.reserved(), Slots::default());
    }

    #[test]
    fn the_on_demand_allocator_has_nothing_to_share() {
        let shares = PoolShares::new(Allocator::OnDemand {
            pool_unavailable: false,
        });
        let huge = CallNeed {
            memories: 64,
            tables: 256,
        };
        let _a = shares.reserve("a", 1024, huge).unwrap();
        let _b = shares.reserve("b", 1024, huge).unwrap();
    }
}
