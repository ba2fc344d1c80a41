//! Errors of the plugin runtime: a failed call, a refused module version, a failed
//! lookup. Each says what happened, to which module version, and what to do.

use std::fmt;
use std::time::Duration;

/// An export of the world the host calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Call {
    Describe,
    ShouldProvision,
    Provision,
    ShouldDelete,
    Delete,
    Expand,
    GetCapacity,
    ValidateClass,
}

impl Call {
    /// The export's name in the WIT world.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Describe => "describe",
            Call::ShouldProvision => "should-provision",
            Call::Provision => "provision",
            Call::ShouldDelete => "should-delete",
            Call::Delete => "delete",
            Call::Expand => "expand",
            Call::GetCapacity => "get-capacity",
            Call::ValidateClass => "validate-class",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which call of which module version failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallTarget {
    pub module: String,
    /// The version: the first 12 hex digits of the module's sha256.
    pub version: String,
    pub call: Call,
}

impl fmt::Display for CallTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "call `{}` of module {} (version sha256:{})",
            self.call, self.module, self.version
        )
    }
}

/// Why a call into a guest did not produce an answer. The guest's own errors
/// (`provision-error`, `delete-error`) are answers, not `CallError`s.
///
/// Every variant fails that one call only: the instance is thrown away, the module keeps
/// serving other calls.
///
/// Serializable: in node-local mode a node's instance answers the leader with it.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum CallError {
    #[error("{target} trapped: {cause}")]
    Trap { target: CallTarget, cause: String },
    #[error(
        "{target} timed out after {}s and was stopped; if the backend is legitimately this slow, \
         raise modules.{}.limits.timeoutSeconds in the grants file",
        timeout.as_secs_f64(), target.module
    )]
    Timeout {
        target: CallTarget,
        timeout: Duration,
    },
    /// The call passed its timeout inside a system call of the host (a filesystem
    /// operation on a hung mount), which nothing can interrupt.
    #[error(
        "{target} timed out after {}s stuck in a filesystem operation of the host that has \
         not returned (a hung mount of one of modules.{}.directories?); the call keeps its \
         thread, its instance and one of the module's maxConcurrentCalls until the operation \
         returns: check that backend",
        timeout.as_secs_f64(), target.module
    )]
    Stuck {
        target: CallTarget,
        timeout: Duration,
    },
    #[error(
        "{target} ran out of memory: it asked for more than its {limit_bytes} bytes of memory \
         (all linear memories and tables together); raise modules.{}.limits.memoryBytes in the grants \
         file if that is legitimate",
        target.module
    )]
    MemoryExhausted {
        target: CallTarget,
        limit_bytes: u64,
    },
    #[error(
        "{target} refused: {max_concurrent_calls} calls of this module are already running \
         (modules.{}.limits.maxConcurrentCalls); retry later",
        target.module
    )]
    Busy {
        target: CallTarget,
        max_concurrent_calls: u32,
    },
    /// The host's instance pool (`--max-guest-instances`) had no slot left for the
    /// call. Each module reserves its share at load, so this is not the module's own
    /// limit but a host misconfiguration worth a Warning: the call did not start and is
    /// retried soon.
    #[error(
        "{target} refused: the host's instance pool is full ({cause}), although every \
         module in service reserved its share of it; raise --max-guest-instances, or lower \
         modules.{}.limits.maxConcurrentCalls or the other modules'; retried shortly",
        target.module
    )]
    InstancesFull { target: CallTarget, cause: String },
    #[error("{target} returned a malformed answer: {reason}")]
    MalformedAnswer { target: CallTarget, reason: String },
    #[error("{target} could not start: the sandbox could not be set up: {cause}")]
    Sandbox { target: CallTarget, cause: String },
    /// Node-local mode: the call is for another node, and that node's instance could not
    /// be reached or refused it. Nothing ran there, or its answer was lost: retried with
    /// back-off (the guest's calls are idempotent).
    #[error("{target} for node {node}: {cause}")]
    Unreachable {
        target: CallTarget,
        node: String,
        cause: String,
    },
}

impl CallError {
    /// A stable label for metrics and Event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CallError::Trap { .. } => "trap",
            CallError::Timeout { .. } | CallError::Stuck { .. } => "timeout",
            CallError::MemoryExhausted { .. } => "memory_exhausted",
            CallError::Busy { .. } => "busy",
            CallError::InstancesFull { .. } => "pool_full",
            CallError::MalformedAnswer { .. } => "malformed_answer",
            CallError::Sandbox { .. } => "sandbox",
            CallError::Unreachable { .. } => "node_unreachable",
        }
    }

    /// The call that failed.
    pub fn target(&self) -> &CallTarget {
        match self {
            CallError::Trap { target, .. }
            | CallError::Timeout { target, .. }
            | CallError::Stuck { target, .. }
            | CallError::MemoryExhausted { target, .. }
            | CallError::Busy { target, .. }
            | CallError::InstancesFull { target, .. }
            | CallError::MalformedAnswer { target, .. }
            | CallError::Sandbox { target, .. }
            | CallError::Unreachable { target, .. } => target,
        }
    }

    /// Whether retrying soon may succeed (a busy module, a full pool, a timeout)
    /// rather than fail the same way again.
    pub fn is_transient(&self) -> bool {
        self.is_busy()
            || self.is_pool_full()
            || matches!(
                self,
                CallError::Timeout { .. } | CallError::Stuck { .. } | CallError::Unreachable { .. }
            )
    }

    /// Whether the call did not start because its module already runs its
    /// `maxConcurrentCalls`: not a failed attempt; the caller retries shortly without
    /// an Event.
    pub fn is_busy(&self) -> bool {
        matches!(self, CallError::Busy { .. })
    }

    /// Whether the call did not start because the host's instance pool was full: not a
    /// failed attempt either, but a Warning Event, since the admin must act.
    pub fn is_pool_full(&self) -> bool {
        matches!(self, CallError::InstancesFull { .. })
    }
}

/// Why a module version was not put in service. The previous version, if any, keeps
/// serving.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("module {module}: cannot read {path}: {cause}")]
    Read {
        module: String,
        path: String,
        cause: String,
    },
    #[error(
        "module {module}: {path} is {size} bytes, more than the {max} bytes a module may have; \
         raise --max-module-bytes if it is legitimate"
    )]
    TooLarge {
        module: String,
        path: String,
        size: u64,
        max: u64,
    },
    #[error(
        "module {module} (version sha256:{version}) refused: not a valid WebAssembly component for this host: {cause}"
    )]
    Compile {
        module: String,
        version: String,
        cause: String,
    },
    /// The compile child hit its time or memory limit, crashed, or could not run.
    #[error("module {module} (version sha256:{version}) refused: {failure}")]
    CompileChild {
        module: String,
        version: String,
        failure: super::compile::CompileFailure,
    },
    #[error(
        "module {module} (version sha256:{version}) refused: it does not implement the \
         wasm-provisioner:plugin provisioner world, or imports what the host does not provide: {cause}"
    )]
    World {
        module: String,
        version: String,
        cause: String,
    },
    #[error(
        "module {module} (version sha256:{version}) refused: its `describe` call failed: {error}"
    )]
    Describe {
        module: String,
        version: String,
        error: Box<CallError>,
    },
    #[error(
        "module {module}: {name:?} is not a valid module name (lowercase letters, digits and '-', at most 63 characters)"
    )]
    InvalidName { module: String, name: String },
    /// The host's [`crate::VersionGate`] held the version back (it refuses a class the
    /// version in service accepts).
    #[error("module {module} (version sha256:{version}) held back: {reason}")]
    HeldBack {
        module: String,
        version: String,
        reason: String,
    },
    /// Its OCI source could not be pulled, or what was pulled is not to be run (not a
    /// wasm artifact, too large, bytes not matching their digest, signatures missing or
    /// not by the keys the grants file names).
    #[error("module {module}: {reference} refused: {cause}")]
    Pull {
        module: String,
        reference: String,
        /// The `wasm_provisioner_module_pulls_total` outcome.
        outcome: &'static str,
        cause: String,
    },
    #[error("module {module} (version sha256:{version}) refused: {error}")]
    PoolShare {
        module: String,
        version: String,
        error: Box<super::pool::PoolShareError>,
    },
}

impl LoadError {
    /// The metric label of this error: one per kind, bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "read",
            LoadError::TooLarge { .. } => "too_large",
            LoadError::Compile { .. } => "compile",
            LoadError::CompileChild { .. } => "compile_child",
            LoadError::World { .. } => "world",
            LoadError::Describe { .. } => "describe",
            LoadError::InvalidName { .. } => "invalid_name",
            LoadError::PoolShare { .. } => "pool_share",
            LoadError::HeldBack { .. } => "held_back",
            LoadError::Pull { .. } => "pull",
        }
    }
}

impl LoadError {
    /// The module the failed load was for.
    pub fn module(&self) -> &str {
        match self {
            LoadError::Read { module, .. }
            | LoadError::TooLarge { module, .. }
            | LoadError::Compile { module, .. }
            | LoadError::CompileChild { module, .. }
            | LoadError::World { module, .. }
            | LoadError::Describe { module, .. }
            | LoadError::InvalidName { module, .. }
            | LoadError::HeldBack { module, .. }
            | LoadError::Pull { module, .. }
            | LoadError::PoolShare { module, .. } => module,
        }
    }

    /// The refused version (sha256 prefix), when the bytes were read.
    pub fn version(&self) -> Option<&str> {
        match self {
            LoadError::Compile { version, .. }
            | LoadError::CompileChild { version, .. }
            | LoadError::World { version, .. }
            | LoadError::Describe { version, .. }
            | LoadError::HeldBack { version, .. }
            | LoadError::PoolShare { version, .. } => Some(version),
            _ => None,
        }
    }
}

impl LoadError {
    /// The compile limit the version hit (`timeout`, `memory`), if that is why it was
    /// refused.
    pub fn compile_limit(&self) -> Option<&'static str> {
        match self {
            LoadError::CompileChild { failure, .. } => failure.limit(),
            _ => None,
        }
    }
}

/// Why a module could not be found for a class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "module {module} is not loaded (loaded: {}); put {module}.wasm in the modules directory, \
         or fix the class's `module` parameter",
        if loaded.is_empty() { "none".to_string() } else { loaded.join(", ") }
    )]
    NotLoaded { module: String, loaded: Vec<String> },
    /// The module's file is there but its first version is still being loaded
    /// (compiled, checked): not a failure; the claim waits.
    #[error(
        "module {module} is still loading (being compiled and checked); the claim waits for it"
    )]
    Loading { module: String },
    /// The module's file is there but its version was refused, and no earlier version
    /// serves.
    #[error(
        "module {module} is not in service: {refusal}; fix the module (its file, or its OCI \
         artifact and signatures), or the limit the refusal names"
    )]
    Refused { module: String, refusal: String },
    #[error(
        "module {module} is pinned to sha256:{pinned} by the class's moduleSHA256 parameter, but the \
         version serving is sha256:{current}; deploy the pinned version or update moduleSHA256 to {current}"
    )]
    PinMismatch {
        module: String,
        pinned: String,
        current: String,
    },
    #[error(
        "the class's moduleSHA256 {pinned:?} for module {module} is not a sha256 digest (64 hex digits, optionally prefixed with sha256:)"
    )]
    InvalidPin { module: String, pinned: String },
    #[error(
        "the class parameter {key:?} of module {module} looks like a misspelled moduleSHA256; \
         the class is not provisioned until it is spelled moduleSHA256 (or removed)"
    )]
    MisspelledPin { module: String, key: String },
}

impl ResolveError {
    /// The metric label of this error: one per kind, bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ResolveError::NotLoaded { .. } => "module_not_loaded",
            ResolveError::Loading { .. } => "module_loading",
            ResolveError::Refused { .. } => "module_refused",
            ResolveError::PinMismatch { .. } => "pin_mismatch",
            ResolveError::InvalidPin { .. } => "invalid_pin",
            ResolveError::MisspelledPin { .. } => "misspelled_pin",
        }
    }
}

impl ResolveError {
    /// Whether the module is still being loaded: the caller waits, without counting a
    /// failure.
    pub fn is_loading(&self) -> bool {
        matches!(self, ResolveError::Loading { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> CallTarget {
        CallTarget {
            module: "hostpath".into(),
            version: "1a2b3c4d5e6f".into(),
            call: Call::Provision,
        }
    }

    /// A call refused because the shared pool is full is not the module's own
    /// `maxConcurrentCalls`: it has a label of its own and is not a silent busy retry.
    #[test]
    fn a_pool_full_refusal_has_its_own_label_and_is_not_busy() {
        let full = CallError::InstancesFull {
            target: target(),
            cause: "maximum concurrent limit of 512 for tables reached".into(),
        };
        assert_eq!(full.metric_label(), "pool_full");
        assert!(!full.is_busy());
        assert!(full.is_transient());
        let message = full.to_string();
        for part in [
            "module hostpath",
            "--max-guest-instances",
            "maxConcurrentCalls",
        ] {
            assert!(message.contains(part), "{part:?} missing in: {message}");
        }
        let busy = CallError::Busy {
            target: target(),
            max_concurrent_calls: 8,
        };
        assert_eq!(busy.metric_label(), "busy");
        assert!(busy.is_busy() && busy.is_transient());
    }
}
