//! The host under a process address-space limit (`ulimit -v`): the instance pool (about
//! 2 TiB of address space at the default 128 instances) cannot be reserved, so the
//! engine runs with the on-demand allocator, whose memories reserve only what a grant
//! allows, and still runs many calls at once.
//!
//! One test in its own binary: it limits this whole test process.

use std::time::{Duration, Instant};

use wasm_provisioner_runtime::engine::Allocator;
use wasm_provisioner_runtime::{Grants, Runtime, RuntimeConfig};
use wasm_provisioner_tests::guests::{self, load};

/// 8 GiB: room for 32 calls of 128 MiB memories (4 GiB), not for 32 of the 4 GiB
/// reservations each memory would otherwise take, nor for the pool.
const LIMIT: libc::rlim_t = 8 << 30;
const CALLS: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_at_once_under_an_address_space_limit() {
    let limit = libc::rlimit {
        rlim_cur: LIMIT,
        rlim_max: LIMIT,
    };
    // SAFETY: plain system call on a valid struct; this binary holds only this test.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());

    let grants = Grants::from_yaml(
        "modules: { slow: { limits: { maxConcurrentCalls: 64, timeoutSeconds: 30 } } }",
        "test grants",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        grants,
        ..RuntimeConfig::default()
    })
    .expect("the host starts under the limit");
    assert_eq!(
        runtime.allocator(),
        Allocator::OnDemand {
            pool_unavailable: true
        }
    );
    // Operators see it in the metrics (and its alert), not only in the log.
    let metrics = wasm_provisioner::metrics::Metrics::new();
    metrics.register_runtime(runtime.clone());
    let text = metrics.render();
    for line in [
        "wasm_provisioner_instance_pool_slots 0",
        "wasm_provisioner_instance_pool_unavailable 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    let slow = load(&runtime, "slow", "test-slow").await;

    // Each call sleeps a second inside the guest, so all of them hold their instance
    // (and its memory) at the same time.
    let started = Instant::now();
    let calls = (0..CALLS).map(|_| {
        let slow = slow.clone();
        async move {
            slow.provision(&guests::provision_request(&[("sleepMillis", "1000")]))
                .await
        }
    });
    let answers = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    for (i, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap_or_else(|error| panic!("call {i}: {error}"));
        assert!(answer.is_ok(), "call {i}: {answer:?}");
    }
    assert!(
        elapsed < Duration::from_secs(10),
        "{CALLS} one-second calls took {elapsed:?}: they did not run at once"
    );
}
