//! Modules compiled in a child process of the host binary (`compile`): the
//! child's code is what the runtime's engine accepts (pooled and on-demand engines,
//! straight from the child and through the cache), and a compile bomb is stopped at the
//! child's memory limit or its timeout, refused once and not compiled again, while
//! another module loads beside it.

use std::time::{Duration, Instant};

use wasm_provisioner_runtime::compile::DEFAULT_COMPILE_MEMORY_BYTES;
use wasm_provisioner_runtime::{
    CompilerConfig, LoadError, LoadOutcome, ResolveError, Runtime, RuntimeConfig,
};
use wasm_provisioner_tests::{bomb, guests, host};

fn compiler(timeout: Duration, memory_bytes: u64) -> CompilerConfig {
    CompilerConfig {
        binary: host::binary(),
        timeout,
        memory_bytes,
    }
}

fn runtime(compiler: CompilerConfig, cache_dir: Option<std::path::PathBuf>) -> Runtime {
    Runtime::new(RuntimeConfig {
        cache_dir,
        compiler: Some(compiler),
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

#[tokio::test]
async fn a_module_compiled_in_the_child_runs_and_is_cached() {
    // 128: the pooling allocator's engine; 0: the on-demand one (other tunables).
    for max_guest_instances in [128, 0] {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let config = RuntimeConfig {
            cache_dir: Some(cache.clone()),
            compiler: Some(compiler(
                Duration::from_secs(120),
                DEFAULT_COMPILE_MEMORY_BYTES,
            )),
            max_guest_instances,
            ..RuntimeConfig::default()
        };
        let first = Runtime::new(config.clone()).unwrap();
        let outcome = first
            .load_file("echo", &guests::module("test-echo"))
            .await
            .unwrap_or_else(|e| panic!("instances {max_guest_instances}: {e}"));
        assert!(matches!(outcome, LoadOutcome::Loaded { .. }), "{outcome:?}");
        // `describe` ran in the sandbox: the child's code is the engine's.
        assert!(!first.module("echo").unwrap().info().name.is_empty());
        assert_eq!(first.metrics().compiles_total(), 1);
        assert_eq!(first.metrics().cache_misses_total(), 1);

        let second = Runtime::new(config).unwrap();
        second
            .load_file("echo", &guests::module("test-echo"))
            .await
            .unwrap();
        assert_eq!(
            second.metrics().cache_hits_total(),
            1,
            "the child's output was cached"
        );
        assert_eq!(second.metrics().compiles_total(), 0);
    }
}

#[tokio::test]
async fn an_invalid_module_is_refused_as_without_the_child() {
    let runtime = runtime(compiler(Duration::from_secs(60), 256 << 20), None);
    let error = runtime
        .load_bytes("garbage", b"\0asm not really".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(error, LoadError::Compile { .. }), "{error}");
}

#[tokio::test]
async fn a_compile_bomb_is_stopped_at_the_memory_limit_and_refused_once() {
    let runtime = runtime(compiler(Duration::from_secs(300), 128 << 20), None);
    let started = Instant::now();
    let error = runtime
        .load_bytes("bomb", bomb::default_bomb())
        .await
        .unwrap_err();
    assert_eq!(error.compile_limit(), Some("memory"), "{error}");
    assert!(
        error.to_string().contains("--compile-memory-bytes"),
        "{error}"
    );
    println!("bomb stopped at 128 MiB after {:?}", started.elapsed());

    // The same bytes again (the next scan): not compiled again.
    let again = runtime
        .load_bytes("bomb", bomb::default_bomb())
        .await
        .unwrap();
    assert_eq!(again, LoadOutcome::Unchanged);
    let counters = runtime.metrics().module("bomb");
    assert_eq!(counters.refusals_total, 1);
    assert_eq!(
        counters.compile_limit_refusals_total.get("memory"),
        Some(&1)
    );
    assert_eq!(runtime.metrics().compiles_total(), 0);
    // A claim of it is told why.
    let resolved = runtime.resolve("bomb", None).unwrap_err();
    assert!(
        matches!(resolved, ResolveError::Refused { .. })
            && resolved.to_string().contains("--compile-memory-bytes"),
        "{resolved}"
    );
}

#[tokio::test]
async fn a_compile_bomb_is_stopped_at_the_timeout_while_another_module_loads() {
    // Long enough that echo's compile (about a second alone) ends first on a machine
    // busy with other tests: on CI's two cores, 5 s was once not.
    let timeout = Duration::from_secs(15);
    let runtime = runtime(compiler(timeout, 4 << 30), None);
    let started = Instant::now();
    let bomb = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.load_bytes("bomb", bomb::default_bomb()).await })
    };
    // While it compiles, it is loading, not missing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resolved = runtime.resolve("bomb", None).unwrap_err();
    assert!(resolved.is_loading(), "{resolved}");
    // Another module loads beside it, without waiting for it.
    runtime
        .load_file("echo", &guests::module("test-echo"))
        .await
        .unwrap();
    assert!(
        !bomb.is_finished(),
        "echo was in service only after the bomb's compile ended ({:?})",
        started.elapsed()
    );
    let error = bomb.await.unwrap().unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error.compile_limit(), Some("timeout"), "{error}");
    assert!(error.to_string().contains("--compile-timeout"), "{error}");
    assert!(
        elapsed < timeout + Duration::from_secs(5),
        "stopped only after {elapsed:?}"
    );
    assert_eq!(
        runtime
            .metrics()
            .module("bomb")
            .compile_limit_refusals_total
            .get("timeout"),
        Some(&1)
    );
    assert!(!runtime.resolve("bomb", None).unwrap_err().is_loading());
}
