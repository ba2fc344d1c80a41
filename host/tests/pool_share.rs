//! The shared instance pool against a hostile module that defines many tables and
//! linear memories: every call of it takes that many slots of the pool
//! (`--max-guest-instances` x 4 tables and 4 memories). Run `maxConcurrentCalls` of
//! them at once and, without a bound on each module's share, the pool is full and every
//! other module's call fails as busy.
//!
//! The hostile component is a core module in WAT (on the skeleton `hostile_abi.rs`'s
//! modules share, `common::core_module`), wrapped into a `provisioner` component against
//! the repository's WIT (a Rust guest cannot define tables). The normal module is the
//! shipped `hostpath` guest.

mod common;

use std::time::Duration;

use wasm_provisioner_rules::types::ProvisionRequest;
use wasm_provisioner_runtime::pool::CallNeed;
use wasm_provisioner_runtime::{CallError, Grants, LoadError, Runtime, RuntimeConfig};

/// The hostile component: its main module implements the world (1 memory), and it
/// instantiates [`HOG_INSTANCES`] times a core module defining [`HOG_TABLES`] tables
/// and [`HOG_MEMORIES`] linear memories: 64 memories and 63 tables per call, the most
/// the pool allows one component (64 memories, 256 tables). With the default pool (128
/// instances: 512 memory slots) its 8 calls at once take every memory slot.
const HOG_INSTANCES: usize = 3;
const HOG_TABLES: usize = 21;
const HOG_MEMORIES: usize = 21;

/// The main module: implements the world; its `provision` spins until its timeout
/// (holding its instance, and so its slots, as long as it may).
fn main_module() -> String {
    common::core_module(
        "test-slot-hog",
        2,
        "  (func (export \"provision\") (param i32) (result i32) (loop $spin (br $spin)) unreachable)\n",
    )
}

/// The provisioner component of [`main_module`], plus [`HOG_INSTANCES`] instances of a
/// core module defining [`HOG_TABLES`] tables and [`HOG_MEMORIES`] memories, appended
/// as two more sections of the component (a core module section, then a core instance
/// section instantiating it: a component's sections may come in any order).
fn slot_hog() -> Vec<u8> {
    let mut component = common::wat_component(&main_module());
    let core_modules = sections(&component)
        .filter(|(id, _)| *id == CORE_MODULE_SECTION)
        .count();
    let mut hog = String::from("(module\n");
    for _ in 0..HOG_TABLES {
        hog.push_str("  (table 1 funcref)\n");
    }
    for _ in 0..HOG_MEMORIES {
        hog.push_str("  (memory 1)\n");
    }
    hog.push(')');
    let hog = wat::parse_str(&hog).expect("the hog module");
    append_section(&mut component, CORE_MODULE_SECTION, &hog);
    // A vector of instances, each `0x00 module-index args` with no arguments.
    let mut instances = Vec::new();
    leb128(HOG_INSTANCES as u32, &mut instances);
    for _ in 0..HOG_INSTANCES {
        instances.push(0x00);
        leb128(core_modules as u32, &mut instances);
        leb128(0, &mut instances);
    }
    append_section(&mut component, CORE_INSTANCE_SECTION, &instances);
    component
}

const CORE_MODULE_SECTION: u8 = 1;
const CORE_INSTANCE_SECTION: u8 = 2;

fn leb128(mut value: u32, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn read_leb128(bytes: &[u8], at: &mut usize) -> usize {
    let (mut value, mut shift) = (0usize, 0);
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// The top-level sections of a component binary: (id, contents).
fn sections(component: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut at = 8; // magic and version
    std::iter::from_fn(move || {
        if at >= component.len() {
            return None;
        }
        let id = component[at];
        at += 1;
        let size = read_leb128(component, &mut at);
        let contents = &component[at..at + size];
        at += size;
        Some((id, contents))
    })
}

fn append_section(component: &mut Vec<u8>, id: u8, contents: &[u8]) {
    component.push(id);
    leb128(contents.len() as u32, component);
    component.extend_from_slice(contents);
}

fn runtime(grants_yaml: &str) -> Runtime {
    Runtime::new(RuntimeConfig {
        grants: Grants::from_yaml(grants_yaml, "test grants").expect("valid grants"),
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

fn hostpath() -> Vec<u8> {
    std::fs::read(common::dist_dir().join("hostpath.wasm")).expect("guests/dist/hostpath.wasm")
}

fn request() -> ProvisionRequest {
    common::provision_request("pool")
}

/// Starts `calls` spinning `provision` calls of module `name` and waits until they
/// hold their instances (a call takes its slots a moment after it starts).
async fn spin(
    runtime: &Runtime,
    name: &str,
    calls: usize,
) -> Vec<tokio::task::JoinHandle<Result<(), CallError>>> {
    let module = runtime.module(name).expect("in service");
    let spinning = (0..calls)
        .map(|_| {
            let module = module.clone();
            tokio::spawn(async move { module.provision(&request()).await.map(|_| ()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    spinning
}

/// Six of its calls at the default `maxConcurrentCalls` 8 would fill the default pool:
/// the module is refused at load, with what it needs, what is left and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_needing_more_than_its_share_of_the_pool_is_refused_at_load() {
    let runtime = runtime("{}");
    runtime
        .load_bytes("hostpath", hostpath())
        .await
        .expect("hostpath loads");
    let error = match runtime.load_bytes("hog", slot_hog()).await {
        Ok(outcome) => panic!("the slot hog was put in service ({outcome:?})"),
        Err(error) => error,
    };
    assert!(matches!(error, LoadError::PoolShare { .. }), "{error}");
    let message = error.to_string();
    for part in [
        "module hog",
        "tables",
        "memories",
        " x 8 calls",
        "left",
        "--max-guest-instances",
        "modules.hog.limits.maxConcurrentCalls",
    ] {
        assert!(message.contains(part), "{part:?} missing in: {message}");
    }
    assert!(runtime.module("hog").is_none());
    assert_eq!(runtime.metrics().module("hog").refusals_total, 1);
}

/// The pentest: a module loaded before the hostile one keeps its calls while the
/// hostile one runs as many calls as it may. Before each module's share of the pool was
/// bounded, six spinning calls took every table slot and hostpath's call failed as
/// busy (retried every 5 s without an Event: silent starvation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_module_cannot_starve_another_module_of_pool_slots() {
    let runtime = runtime("modules: { hog: { limits: { timeoutSeconds: 3 } } }");
    runtime
        .load_bytes("hostpath", hostpath())
        .await
        .expect("hostpath loads");
    let spinning = match runtime.load_bytes("hog", slot_hog()).await {
        Ok(_) => spin(&runtime, "hog", 8).await,
        // Refused at load: it holds nothing.
        Err(_) => Vec::new(),
    };
    let hostpath = runtime.module("hostpath").expect("in service");
    for call in 0..4 {
        match hostpath.should_provision(&request()).await {
            Ok(_) => {}
            Err(error) => panic!("hostpath's call {call} failed while the hog ran: {error}"),
        }
    }
    for call in spinning {
        let _ = call.await;
    }
}

/// A module within its share runs all its calls; its extra calls are refused by its
/// own `maxConcurrentCalls` (busy, silent, as before), never another module's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_at_its_share_runs_its_calls_and_leaves_the_rest_of_the_pool() {
    let runtime =
        runtime("modules: { hog: { limits: { timeoutSeconds: 2, maxConcurrentCalls: 2 } } }");
    runtime
        .load_bytes("hostpath", hostpath())
        .await
        .expect("hostpath loads");
    runtime
        .load_bytes("hog", slot_hog())
        .await
        .unwrap_or_else(|e| panic!("two calls of the hog fit the pool: {e}"));
    let hog = runtime.module("hog").expect("in service");
    let need = hog.call_need();
    assert!(
        need.tables >= (HOG_INSTANCES * HOG_TABLES) as u32
            && need.memories > (HOG_INSTANCES * HOG_MEMORIES) as u32,
        "{need:?}"
    );
    let spinning = spin(&runtime, "hog", 2).await;
    let extra = hog.provision(&request()).await.unwrap_err();
    assert!(
        matches!(extra, CallError::Busy { .. }) && extra.metric_label() == "busy",
        "{extra}"
    );
    let hostpath = runtime.module("hostpath").expect("in service");
    for _ in 0..4 {
        hostpath
            .should_provision(&request())
            .await
            .expect("hostpath's call while the hog holds its share");
    }
    for call in spinning {
        let timed_out = call.await.unwrap().unwrap_err();
        assert!(
            matches!(timed_out, CallError::Timeout { .. }),
            "{timed_out}"
        );
    }
}

/// What the shipped guests need per call, printed for the README, and proof that their
/// stores' limits (exactly that need) let them instantiate: each one's `describe` runs
/// at load. All of them at their default 8 calls fit the default pool together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_guests_fit_the_default_pool_together() {
    let runtime = runtime("{}");
    for (name, file) in [
        ("hostpath", "hostpath.wasm"),
        ("nfs-subdir", "nfs-subdir.wasm"),
        ("quota-dir", "quota-dir.wasm"),
        ("quota-dir-js", "quota-dir-js.wasm"),
    ] {
        let bytes = std::fs::read(common::dist_dir().join(file)).expect(file);
        runtime
            .load_bytes(name, bytes)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let need = runtime.module(name).expect("in service").call_need();
        eprintln!(
            "{name}: {} memories, {} tables per call",
            need.memories, need.tables
        );
        assert!(need.memories >= 1, "{name}: {need:?}");
        assert!(need != CallNeed::default(), "{name}");
    }
    // A call runs under those limits too.
    let hostpath = runtime.module("hostpath").unwrap();
    hostpath
        .should_provision(&request())
        .await
        .expect("hostpath");
}
