//! Hostile guests that a Rust guest cannot express: attacks on the host's
//! memory through the WebAssembly machinery itself, not through linear memory.
//!
//! - **Table bomb**: a 1 KB module grows funcref tables by a million elements
//!   each. Each element is host heap (8 bytes in wasmtime 48), not linear memory; the
//!   `memoryBytes` budget must count it.
//! - **Alias bomb**: `provision` answers a volume whose labels are many list
//!   entries all pointing at the same 1 MiB string in linear memory. The guest spends a
//!   few MiB; lifting the answer into host `String`s costs the host 2 MiB per entry,
//!   before the size check after the call could refuse it.
//!
//! - **State carrier**: a module that leaves marks in its instance (a global, memory,
//!   its memory image) to find them in the next call, whose pooled slots it reuses.
//!
//! Each hostile component is a core module written in WAT, implementing the
//! `provisioner` world's exports by hand at the canonical-ABI level (on the skeleton
//! `common::core_module`, which `pool_share.rs`'s slot hog uses too), and wrapped into
//! a component with `wit-component` against the repository's `wit/` (the same world the
//! host links). Rust guests (wit-bindgen) can neither grow tables nor alias list
//! elements, which is why these are not crates under `guests/testing/`.
//!
//! The tests measure the peak RSS of this process around one call (`VmHWM`, reset
//! through `/proc/self/clear_refs`), one test at a time.

mod common;

use std::sync::Arc;

use wasm_provisioner_rules::types::ProvisionRequest;
use wasm_provisioner_runtime::{CallError, Grants, LoadedModule, Runtime, RuntimeConfig};

const MIB: u64 = 1024 * 1024;

/// Tables the table bomb grows, by a million elements each: 128 MB of host heap at
/// wasmtime's 8 bytes per funcref (the 256 tables of the attack as first reproduced were 2 GB).
const BOMB_TABLES: usize = 16;
/// Label entries of the alias bomb, each key and value the same 1 MiB string: 100 MiB
/// lifted, under wasmtime's default 128 MiB hostcall fuel, so without a tighter bound
/// the whole answer is copied into the host before the size check refuses it.
const ALIASED_LABELS: usize = 50;

/// RSS tests measure the whole process: one at a time.
static RSS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `provision` grows [`BOMB_TABLES`] tables by a million elements each (initialised, so
/// the host really writes them), then traps; a refused growth (`table.grow` answering
/// -1) traps at once.
fn table_bomb() -> String {
    let mut extra = String::from("  (func $target)\n  (elem declare func $target)\n");
    for t in 0..BOMB_TABLES {
        extra.push_str(&format!("  (table $t{t} 0 funcref)\n"));
    }
    extra.push_str("  (func (export \"provision\") (param i32) (result i32)\n");
    for t in 0..BOMB_TABLES {
        extra.push_str(&format!(
            "    (if (i32.eq (table.grow $t{t} (ref.func $target) (i32.const 1000000)) (i32.const -1)) (then unreachable))\n"
        ));
    }
    extra.push_str("    unreachable)\n");
    common::core_module("test-table-bomb", 2, &extra)
}

/// `provision` answers `result<volume, provision-error>` = ok, a hostPath volume whose
/// `labels` has [`ALIASED_LABELS`] entries, every key and value the same 1 MiB string of
/// NULs (valid UTF-8) at 1 MiB in linear memory. Layout (canonical ABI): the result at
/// 256 (discriminant 0: ok), its volume at 264: capacity u64 @+0, source variant @+8
/// (host-path = 0, path @+12, path-type none @+20; the variant is 60 bytes, its largest
/// case iscsi), node-affinity @+68, labels @+76, annotations @+84, mount-options @+92,
/// volume-mode @+100. The label entries (16 bytes each) at 8192.
fn alias_bomb() -> String {
    let entries: String = (0..ALIASED_LABELS)
        .map(|i| {
            let at = 8192 + 16 * i;
            format!(
                "    (i32.store (i32.const {at}) (i32.const 1048576))\n\
                 \x20   (i32.store (i32.const {}) (i32.const 1048576))\n\
                 \x20   (i32.store (i32.const {}) (i32.const 1048576))\n\
                 \x20   (i32.store (i32.const {}) (i32.const 1048576))\n",
                at + 4,
                at + 8,
                at + 12
            )
        })
        .collect();
    let extra = format!(
        r#"  (data (i32.const 200) "/aliased")
  (func (export "provision") (param i32) (result i32)
    (i64.store (i32.const 264) (i64.const 1048576))
    (i32.store8 (i32.const 272) (i32.const 0))
    (i32.store (i32.const 276) (i32.const 200))
    (i32.store (i32.const 280) (i32.const 8))
    (i32.store (i32.const 340) (i32.const 8192))
    (i32.store (i32.const 344) (i32.const {ALIASED_LABELS}))
{entries}    (i32.const 256))
"#
    );
    // 3 MiB: the request area, the entries and the 1 MiB string from 1 MiB.
    common::core_module("test-alias-bomb", 48, &extra)
}

/// `should-provision` answers yes only in a pristine instance, then leaves its mark in
/// each kind of state an instance has: a mutable global, a byte of linear memory
/// outside the data segments (60000) and a byte of the memory image (16, the first
/// letter of the module's name, `t`). A later call seeing any of it answers no.
fn state_carrier() -> String {
    let should_provision =
        r#"(func (export "should-provision") (param i32) (result i32) (i32.const 1))"#;
    let carrier = r#"(global $calls (mut i32) (i32.const 0))
  (func (export "should-provision") (param i32) (result i32)
    (local $pristine i32)
    (local.set $pristine
      (i32.and
        (i32.and (i32.eqz (global.get $calls)) (i32.eqz (i32.load8_u (i32.const 60000))))
        (i32.eq (i32.load8_u (i32.const 16)) (i32.const 116))))
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (i32.store8 (i32.const 60000) (i32.const 1))
    (i32.store8 (i32.const 16) (i32.const 88))
    (local.get $pristine))"#;
    let module = common::core_module(
        "test-fresh",
        2,
        "  (func (export \"provision\") (param i32) (result i32) unreachable)\n",
    );
    assert!(module.contains(should_provision));
    module.replace(should_provision, carrier)
}

async fn load(grants_yaml: &str, name: &str, wat: &str) -> (Runtime, Arc<LoadedModule>) {
    let grants = Grants::from_yaml(grants_yaml, "test grants").expect("valid grants");
    let runtime = Runtime::new(RuntimeConfig {
        grants,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    runtime
        .load_bytes(name, common::wat_component(wat))
        .await
        .unwrap_or_else(|e| panic!("loading {name}: {e}"));
    let module = runtime.module(name).expect("in service");
    (runtime, module)
}

fn request() -> ProvisionRequest {
    common::provision_request("hostile")
}

/// A `/proc/self/status` field in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// How much the peak RSS of this process grew while `work` ran.
async fn peak_growth<T>(work: impl std::future::Future<Output = T>) -> (T, u64) {
    // Writing 5 resets the peak (VmHWM) to the current RSS.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let before = status_bytes("VmRSS");
    let result = work.await;
    let peak = status_bytes("VmHWM");
    (result, peak.saturating_sub(before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_bomb_is_charged_to_the_memory_budget() {
    let _one_at_a_time = RSS.lock().await;
    let (_runtime, module) = load(
        "modules:\n  bomb:\n    limits: { memoryBytes: 1048576 }\n",
        "bomb",
        &table_bomb(),
    )
    .await;
    let (answer, growth) = peak_growth(module.provision(&request())).await;
    eprintln!("table bomb: peak RSS grew by {growth} bytes; {answer:?}");
    let error = answer.expect_err("growing tables past the budget must fail the call");
    assert_eq!(
        error.metric_label(),
        "memory_exhausted",
        "tables must count against memoryBytes: {error}"
    );
    let message = error.to_string();
    for part in ["module bomb", "`provision`", "1048576 bytes", "tables"] {
        assert!(message.contains(part), "{part:?} missing in: {message}");
    }
    let tables_bytes = BOMB_TABLES as u64 * 1_000_000 * 8;
    assert!(
        growth < 32 * MIB,
        "the call grew the host's peak RSS by {growth} bytes (the tables would be {tables_bytes})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliased_answer_is_stopped_while_lifting() {
    let _one_at_a_time = RSS.lock().await;
    let (_runtime, module) = load("{}", "alias", &alias_bomb()).await;
    let (answer, growth) = peak_growth(module.provision(&request())).await;
    eprintln!("alias bomb: peak RSS grew by {growth} bytes; {answer:?}");
    let error = answer.expect_err("an answer of 100 MiB must be refused");
    assert!(
        matches!(error, CallError::MalformedAnswer { .. }),
        "expected malformed_answer, got {}: {error}",
        error.metric_label()
    );
    let message = error.to_string();
    let bound = wasm_provisioner_runtime::limits::MAX_LIFT_BYTES.to_string();
    for part in [
        "module alias",
        "`provision`",
        "version sha256:",
        bound.as_str(),
    ] {
        assert!(message.contains(part), "{part:?} missing in: {message}");
    }
    let lifted = ALIASED_LABELS as u64 * 2 * MIB;
    assert!(
        growth < 32 * MIB,
        "lifting the answer grew the host's peak RSS by {growth} bytes (the whole answer is {lifted})"
    );
}

/// Every call runs in a fresh instance: with the pooling allocator a call reuses the
/// memory, table and stack slots of an earlier one (one slot here, so every call takes
/// the same; one call at a time, so the module fits), and nothing it left there may be
/// visible: globals re-initialised, memory zeroed, the memory image restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_never_sees_what_an_earlier_call_left_in_its_instance() {
    let _one_at_a_time = RSS.lock().await;
    let grants = Grants::from_yaml(
        "modules: { fresh: { limits: { maxConcurrentCalls: 1 } } }",
        "test grants",
    )
    .expect("valid grants");
    let runtime = Runtime::new(RuntimeConfig {
        grants,
        max_guest_instances: 1,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    runtime
        .load_bytes("fresh", common::wat_component(&state_carrier()))
        .await
        .unwrap_or_else(|e| panic!("loading the state carrier: {e}"));
    let module = runtime.module("fresh").expect("in service");
    for call in 0..20 {
        assert!(
            module.should_provision(&request()).await.unwrap(),
            "call {call} saw state an earlier call left in its instance"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_modules_are_otherwise_valid() {
    // Both load (describe answers) and serve: the failures above are the attacks, not
    // broken modules.
    let _one_at_a_time = RSS.lock().await;
    let (_runtime, module) = load("{}", "bomb", &table_bomb()).await;
    assert_eq!(module.info().name, "test-table-bomb");
    let (_runtime, module) = load("{}", "alias", &alias_bomb()).await;
    assert_eq!(module.info().name, "test-alias-bomb");
    assert!(module.should_provision(&request()).await.unwrap());
}
