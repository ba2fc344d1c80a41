//! The plugin runtime against real guests: every failure mode fails one call with a
//! clear error and the host keeps serving; limits, grants, the precompiled cache and
//! `moduleSHA256` pinning.

use std::path::Path;
use std::time::{Duration, Instant};

use wasm_provisioner_rules::types::{
    DeleteRequest, ProvisionError, ProvisionRequest, PublishedVolume, Volume, VolumeSource,
};
use wasm_provisioner_runtime::{
    CallError, Grants, LoadError, LoadOutcome, LoadedModule, ResolveError, Runtime, RuntimeConfig,
};
use wasm_provisioner_tests::guests::{self, load, runtime};

fn request(parameters: &[(&str, &str)]) -> ProvisionRequest {
    guests::provision_request(parameters)
}

fn delete_request(
    volume_name: &str,
    source: VolumeSource,
    parameters: &[(&str, &str)],
) -> DeleteRequest {
    DeleteRequest {
        volume: PublishedVolume {
            name: volume_name.into(),
            source,
            capacity_bytes: 1024 * 1024,
            labels: vec![],
            annotations: vec![],
            node_affinity: vec![],
            claim_namespace: Some("default".into()),
            claim_name: Some("data".into()),
        },
        class_name: "test".into(),
        class_parameters: parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        secret: None,
        context: Default::default(),
    }
}

/// A healthy call on a healthy module: proof the host keeps serving.
async fn assert_healthy(runtime: &Runtime) {
    let echo = match runtime.module("echo") {
        Some(echo) => echo,
        None => load(runtime, "echo", "test-echo").await,
    };
    let volume = echo
        .provision(&request(&[("version", "healthy")]))
        .await
        .expect("healthy call")
        .expect("echo provisions");
    assert!(
        volume
            .annotations
            .iter()
            .any(|(k, v)| k == "echo/version" && v == "healthy"),
        "{volume:?}"
    );
}

fn assert_names_target(error: &CallError, module: &LoadedModule, call: &str) {
    let message = error.to_string();
    assert!(message.contains(module.name()), "{message}");
    assert!(message.contains(module.version()), "{message}");
    assert!(message.contains(&format!("`{call}`")), "{message}");
}

#[tokio::test]
async fn healthy_guest_describes_itself_and_echoes() {
    let runtime = runtime("");
    let echo = load(&runtime, "echo", "test-echo").await;
    assert!(!echo.info().name.is_empty());
    assert_eq!(echo.sha256().len(), 64);
    assert!(echo.sha256().starts_with(echo.version()));
    assert!(echo.should_provision(&request(&[])).await.unwrap());
    assert_healthy(&runtime).await;
    let counters = runtime.metrics().module("echo");
    assert_eq!(counters.reloads_total, 1);
    assert_eq!(counters.refusals_total, 0);
}

#[tokio::test]
async fn guest_error_variants_are_answers_not_failures() {
    let runtime = runtime("");
    let echo = load(&runtime, "echo", "test-echo").await;
    let answer = echo
        .provision(&request(&[("outcome", "infeasible")]))
        .await
        .expect("the call itself succeeds");
    assert!(
        matches!(answer, Err(ProvisionError::Infeasible(_))),
        "{answer:?}"
    );
}

/// What the hostile `test-leftover` guest answered: (calls its instance saw, copies of
/// the sought text it found in its linear memory).
async fn leftover(module: &LoadedModule, parameters: &[(&str, &str)]) -> (usize, usize) {
    let answer = module
        .provision(&request(parameters))
        .await
        .expect("the call runs");
    let Err(ProvisionError::Failed(message)) = answer else {
        panic!("test-leftover always answers failed: {answer:?}");
    };
    let figures: Vec<usize> = message
        .trim_start_matches("leftover: calls ")
        .split(", found ")
        .map(|n| n.parse().unwrap_or_else(|_| panic!("{message}")))
        .collect();
    (figures[0], figures[1])
}

/// Each call gets a fresh instance: one tenant's claim data that a call wrote into its
/// statics and heap (or that arrived in its request) is not there for the next call,
/// though the pool gives the next call the same memory slot and keeps the pages written
/// resident (reset in place, not returned to the kernel; see `engine.rs`).
#[tokio::test]
async fn a_call_finds_nothing_an_earlier_call_left() {
    let runtime = runtime("");
    let module = load(&runtime, "leftover", "test-leftover").await;
    let secret = "tenant-a-claim-5f0c1e9d-secret";
    let reversed: String = secret.chars().rev().collect();
    // The scan works: a call whose own request holds the text finds it.
    let (calls, found) = leftover(&module, &[("plant", secret), ("seekReversed", &reversed)]).await;
    assert_eq!(calls, 1, "a fresh instance per call");
    assert!(found >= 1, "the scan finds the request's own copy: {found}");
    for round in 0..20 {
        let (calls, _) = leftover(&module, &[("plant", secret)]).await;
        assert_eq!(calls, 1, "round {round}: a fresh instance per call");
        let (calls, found) = leftover(&module, &[("seekReversed", &reversed)]).await;
        assert_eq!(calls, 1, "round {round}: a fresh instance per call");
        assert_eq!(
            found, 0,
            "round {round}: the call found {found} copies of what the call before it wrote"
        );
    }
}

#[tokio::test]
async fn trap_fails_one_call_and_the_host_keeps_serving() {
    let runtime = runtime("");
    let trap = load(&runtime, "trap", "test-trap").await;
    let error = trap.provision(&request(&[])).await.unwrap_err();
    assert!(matches!(error, CallError::Trap { .. }), "{error}");
    assert_eq!(error.metric_label(), "trap");
    assert_names_target(&error, &trap, "provision");
    // The same module keeps serving its other calls, in fresh instances.
    assert!(trap.should_provision(&request(&[])).await.unwrap());
    assert_healthy(&runtime).await;
    assert_eq!(
        runtime.metrics().module("trap").call_failures_total["trap"],
        1
    );
}

#[tokio::test]
async fn infinite_loop_times_out() {
    let runtime = runtime("modules: { spin: { limits: { timeoutSeconds: 1 } } }");
    let spin = load(&runtime, "spin", "test-spin").await;
    let started = Instant::now();
    let error = spin.provision(&request(&[])).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, CallError::Timeout { .. }), "{error}");
    assert_names_target(&error, &spin, "provision");
    assert!(error.to_string().contains("timeoutSeconds"), "{error}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_healthy(&runtime).await;
}

#[tokio::test]
async fn memory_bomb_is_stopped_at_the_budget() {
    let runtime = runtime("modules: { bomb: { limits: { memoryBytes: 33554432 } } }");
    let bomb = load(&runtime, "bomb", "test-memory-bomb").await;
    let error = bomb.provision(&request(&[])).await.unwrap_err();
    assert!(
        matches!(
            error,
            CallError::MemoryExhausted {
                limit_bytes: 33554432,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(error.metric_label(), "memory_exhausted");
    assert_names_target(&error, &bomb, "provision");
    assert_healthy(&runtime).await;
}

#[tokio::test]
async fn oversized_answer_is_refused() {
    let runtime = runtime("");
    let oversized = load(&runtime, "oversized", "test-oversized").await;
    let error = oversized.provision(&request(&[])).await.unwrap_err();
    assert!(
        matches!(error, CallError::MalformedAnswer { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("bytes"), "{error}");
    assert_names_target(&error, &oversized, "provision");
    assert_healthy(&runtime).await;
}

/// Starts a `provision` call of the `test-spin` guest (it spins until its deadline) and
/// returns once it is running.
async fn start_spinning(
    spin: &std::sync::Arc<LoadedModule>,
) -> tokio::task::JoinHandle<Result<Result<Volume, ProvisionError>, CallError>> {
    start_provision(spin, request(&[])).await
}

/// Starts a `provision` call of `module` and returns once it is running.
async fn start_provision(
    module: &std::sync::Arc<LoadedModule>,
    request: ProvisionRequest,
) -> tokio::task::JoinHandle<Result<Result<Volume, ProvisionError>, CallError>> {
    let running = tokio::spawn({
        let module = module.clone();
        async move { module.provision(&request).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while module.calls_in_flight() == 0 {
        assert!(Instant::now() < deadline, "the first call never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running
}

/// Waits, at most 5 s, until no call of `module` is in flight; `expected` says why
/// they should all have ended.
async fn wait_idle(module: &LoadedModule, expected: &str) {
    let since = Instant::now();
    while module.calls_in_flight() != 0 {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{} calls still in flight {:?} after {expected}",
            module.calls_in_flight(),
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn concurrency_limit_refuses_the_extra_call() {
    let runtime =
        runtime("modules: { spin: { limits: { timeoutSeconds: 2, maxConcurrentCalls: 1 } } }");
    let spin = load(&runtime, "spin", "test-spin").await;
    let running = start_spinning(&spin).await;
    let error = spin.should_provision(&request(&[])).await.unwrap_err();
    assert!(
        matches!(
            error,
            CallError::Busy {
                max_concurrent_calls: 1,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.is_transient());
    let first = running.await.unwrap().unwrap_err();
    assert!(matches!(first, CallError::Timeout { .. }), "{first}");
    // The permit is back: the module takes calls again.
    assert!(spin.should_provision(&request(&[])).await.unwrap());
}

/// The instance pool (`--max-guest-instances`) is shared by every module, each holding
/// its share (what one call needs times its `maxConcurrentCalls`) from its load on: a
/// module that does not fit beside the others is refused at load, with what it needs
/// and what to do, instead of its calls and the others' failing later for want of a
/// slot. Its share is back once the module is out of service, and the refused module
/// then loads.
#[tokio::test]
async fn a_module_that_does_not_fit_the_pool_beside_the_others_is_refused_at_load() {
    let grants = Grants::from_yaml(
        "modules: { spin: { limits: { timeoutSeconds: 2, maxConcurrentCalls: 1 } }, \
         hostpath: { limits: { maxConcurrentCalls: 1 } } }",
        "test grants",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        grants,
        max_guest_instances: 1,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let spin = load(&runtime, "spin", "test-spin").await;
    let error = runtime
        .load_file("hostpath", &guests::module("hostpath"))
        .await
        .unwrap_err();
    assert!(matches!(error, LoadError::PoolShare { .. }), "{error}");
    let message = error.to_string();
    for part in [
        "module hostpath",
        "x 1 calls",
        "only 3 memories",
        "0 instances are left",
        "--max-guest-instances 1",
        "modules.hostpath.limits.maxConcurrentCalls",
    ] {
        assert!(message.contains(part), "{part:?} missing in: {message}");
    }
    assert!(runtime.module("hostpath").is_none());
    // The module in service keeps its whole share: its call runs.
    let running = start_spinning(&spin).await;
    let first = running.await.unwrap().unwrap_err();
    assert!(matches!(first, CallError::Timeout { .. }), "{first}");
    // Out of service (its calls over), it gives its share back.
    drop(spin);
    runtime.remove("spin");
    let hostpath = load(&runtime, "hostpath", "hostpath").await;
    assert!(hostpath.should_provision(&request(&[])).await.unwrap());
}

#[tokio::test]
async fn describe_trap_is_refused_at_load() {
    let runtime = runtime("");
    let error = runtime
        .load_file("broken", &guests::module("test-describe-trap"))
        .await
        .unwrap_err();
    assert!(matches!(error, LoadError::Describe { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("module broken") && message.contains("describe"),
        "{message}"
    );
    assert!(runtime.module("broken").is_none());
    assert_eq!(runtime.metrics().module("broken").refusals_total, 1);
    assert_healthy(&runtime).await;
}

#[tokio::test]
async fn garbage_is_refused_at_load() {
    let runtime = runtime("");
    let error = runtime
        .load_bytes("garbage", b"\0asm not really".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(error, LoadError::Compile { .. }), "{error}");
    assert!(error.to_string().contains("module garbage"), "{error}");
}

#[tokio::test]
async fn same_bytes_load_once() {
    let runtime = runtime("");
    load(&runtime, "echo", "test-echo").await;
    let again = runtime
        .load_file("echo", &guests::module("test-echo"))
        .await
        .unwrap();
    assert_eq!(again, LoadOutcome::Unchanged);
    assert_eq!(runtime.metrics().module("echo").reloads_total, 1);
}

#[tokio::test]
async fn precompiled_cache_skips_the_second_compile() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        grants: Grants::none(),
        cache_dir: Some(cache.path().join("cwasm")),
        ..RuntimeConfig::default()
    };
    let first = Runtime::new(config.clone()).unwrap();
    load(&first, "echo", "test-echo").await;
    assert_eq!(
        (
            first.metrics().compiles_total(),
            first.metrics().cache_hits_total()
        ),
        (1, 0)
    );

    // A fresh runtime (a restart) with the same cache does not compile.
    let second = Runtime::new(config).unwrap();
    let echo = load(&second, "echo", "test-echo").await;
    assert_eq!(
        (
            second.metrics().compiles_total(),
            second.metrics().cache_hits_total()
        ),
        (0, 1)
    );
    assert!(echo.should_provision(&request(&[])).await.unwrap());
    assert_healthy(&second).await;

    // A corrupt entry is detected (wasmtime checks the header) and compiled again.
    // Entries are mapped while in use, so the corruption replaces the file (a new
    // inode) after the runtimes using it are gone, never rewrites it in place.
    drop((first, second, echo));
    for entry in std::fs::read_dir(cache.path().join("cwasm")).unwrap() {
        let path = entry.unwrap().path();
        let corrupt = path.with_extension("corrupt");
        std::fs::write(&corrupt, b"garbage").unwrap();
        std::fs::rename(&corrupt, &path).unwrap();
    }
    let third = Runtime::new(RuntimeConfig {
        grants: Grants::none(),
        cache_dir: Some(cache.path().join("cwasm")),
        ..RuntimeConfig::default()
    })
    .unwrap();
    load(&third, "echo", "test-echo").await;
    assert_eq!(third.metrics().compiles_total(), 1);
}

#[tokio::test]
async fn module_sha256_pin_is_checked() {
    let runtime = runtime("");
    let echo = load(&runtime, "echo", "test-echo").await;
    let sha = echo.sha256().to_string();
    assert!(runtime.resolve("echo", None).is_ok());
    assert!(runtime.resolve("echo", Some(&sha)).is_ok());
    assert!(
        runtime
            .resolve("echo", Some(&format!("sha256:{}", sha.to_uppercase())))
            .is_ok()
    );

    let wrong = "0".repeat(64);
    let error = runtime.resolve("echo", Some(&wrong)).unwrap_err();
    assert!(matches!(error, ResolveError::PinMismatch { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&wrong) && message.contains(&sha),
        "{message}"
    );
    assert!(message.contains("moduleSHA256"), "{message}");

    let error = runtime.resolve("echo", Some("abc")).unwrap_err();
    assert!(matches!(error, ResolveError::InvalidPin { .. }), "{error}");
    let error = runtime.resolve("missing", None).unwrap_err();
    assert!(error.to_string().contains("loaded: echo"), "{error}");
}

/// `moduleSHA256` spelled every way a pin bypass could try: only the 64 hex digits of
/// the version serving (any case, one optional lowercase `sha256:`, outer whitespace)
/// resolve; a prefix in capitals, a doubled prefix, 63 or 65 digits, inner whitespace,
/// non-ASCII look-alikes and a present-but-empty pin are refused as invalid, never read
/// as "no pin"; another module's digest and an earlier version's digest are mismatches.
#[tokio::test]
async fn a_pin_is_honoured_only_spelled_as_a_digest_of_the_version_serving() {
    let runtime = runtime("");
    let echo = load(&runtime, "echo", "test-echo").await;
    let sha = echo.sha256().to_string();
    let other = load(&runtime, "other", "test-slow").await;

    for pin in [
        sha.clone(),
        sha.to_uppercase(),
        format!("sha256:{sha}"),
        format!("sha256:{}", sha.to_uppercase()),
        format!(" \t{sha}\n"),
    ] {
        let resolved = runtime
            .resolve("echo", Some(&pin))
            .unwrap_or_else(|e| panic!("{pin:?} names the version serving: {e}"));
        assert_eq!(resolved.sha256(), sha, "{pin:?}");
    }
    for pin in [
        String::new(),
        "   ".into(),
        "sha256:".into(),
        format!("SHA256:{sha}"),
        format!("Sha256:{sha}"),
        format!("sha256:sha256:{sha}"),
        format!("sha256: {sha}"),
        sha[..63].to_string(),
        format!("{sha}0"),
        format!("{} {}", &sha[..32], &sha[32..]),
        format!("0x{}", &sha[2..]),
        // A fullwidth 'a' (U+FF41) instead of the first digit.
        format!("\u{ff41}{}", &sha[1..]),
    ] {
        let error = runtime
            .resolve("echo", Some(&pin))
            .err()
            .unwrap_or_else(|| panic!("{pin:?} was accepted as a pin"));
        assert!(
            matches!(error, ResolveError::InvalidPin { .. }),
            "{pin:?}: {error}"
        );
    }
    // Another module's digest.
    let Err(error) = runtime.resolve("echo", Some(other.sha256())) else {
        panic!("another module's digest was accepted");
    };
    assert!(matches!(error, ResolveError::PinMismatch { .. }), "{error}");

    // A reload between the pin check and the call: the module resolved runs the
    // pinned bytes, and the PV records that version; the earlier digest no longer
    // resolves.
    let resolved = runtime.resolve("echo", Some(&sha)).unwrap();
    drop(echo);
    runtime
        .load_file("echo", &guests::module("test-trap"))
        .await
        .expect("version 2 loads");
    assert_eq!(runtime.module("echo").unwrap().info().name, "test-trap");
    let request = request(&[("version", "pinned")]);
    assert!(resolved.should_provision(&request).await.unwrap());
    let volume = resolved
        .provision(&request)
        .await
        .expect("the pinned version runs, not the trapping one")
        .expect("echo provisions");
    assert!(
        volume
            .annotations
            .iter()
            .any(|(k, v)| k == "echo/version" && v == "pinned"),
        "{volume:?}"
    );
    assert_eq!(resolved.sha256(), sha);
    let Err(error) = runtime.resolve("echo", Some(&sha)) else {
        panic!("a previously served version's digest was accepted");
    };
    assert!(matches!(error, ResolveError::PinMismatch { .. }), "{error}");
}

#[tokio::test]
async fn escape_out_of_a_granted_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let granted = root.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(root.path().join("secret"), b"outside").unwrap();
    let runtime = runtime(&format!(
        "allow: {{ directories: [{root}] }}\n\
         modules: {{ escape: {{ directories: [{{ host: {granted}, guest: /volumes, mode: read-write }}] }} }}",
        root = root.path().display(),
        granted = granted.display(),
    ));
    let escape = load(&runtime, "escape", "test-escape").await;
    let answer = escape
        .provision(&request(&[]))
        .await
        .expect("the call succeeds");
    // The guest reports every attempt; all must have been refused.
    match answer {
        Err(ProvisionError::Failed(message)) => {
            assert!(message.contains("escape attempts refused"), "{message}")
        }
        other => panic!("the escape guest got out: {other:?}"),
    }
    assert_eq!(
        std::fs::read(root.path().join("secret")).unwrap(),
        b"outside"
    );
    assert_no_new_files_outside(root.path(), &granted);
    assert_healthy(&runtime).await;
}

fn assert_no_new_files_outside(root: &Path, granted: &Path) {
    for entry in std::fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        assert!(
            path == granted || path.ends_with("secret"),
            "the guest created {}",
            path.display()
        );
    }
}

/// A one-request HTTP server on 127.0.0.1: returns its address and a handle yielding
/// whether a request arrived.
async fn http_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<bool>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        match tokio::time::timeout(Duration::from_secs(10), listener.accept()).await {
            Ok(Ok((mut socket, _))) => {
                let mut buffer = vec![0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let body = "ok";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
                true
            }
            _ => false,
        }
    });
    (address, handle)
}

#[tokio::test]
async fn network_without_a_grant_is_refused() {
    let (address, server) = http_server().await;
    let runtime = runtime("");
    let network = load(&runtime, "network", "test-network").await;
    let url = format!("http://{address}/");
    let answer = network.provision(&request(&[("url", &url)])).await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "the request went through without a grant: {answer:?}"
    );
    server.abort();
    assert!(!server.await.unwrap_or(false), "the server saw a request");
    assert_healthy(&runtime).await;
}

#[tokio::test]
async fn network_with_a_grant_reaches_the_granted_host_only() {
    let (address, server) = http_server().await;
    let runtime = runtime(&format!(
        "allow: {{ httpHosts: [\"{address}\"] }}\n\
         modules: {{ network: {{ http: [{{ host: \"{address}\", scheme: http }}] }} }}"
    ));
    let network = load(&runtime, "network", "test-network").await;
    let answer = network
        .provision(&request(&[("url", &format!("http://{address}/"))]))
        .await;
    assert!(
        matches!(answer, Ok(Ok(_))),
        "the granted request failed: {answer:?}"
    );
    assert!(server.await.unwrap(), "the server saw no request");

    // Another port on the same host is not granted.
    let (other, other_server) = http_server().await;
    let answer = network
        .provision(&request(&[("url", &format!("http://{other}/"))]))
        .await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "an ungranted port was reached: {answer:?}"
    );
    other_server.abort();
    assert!(!other_server.await.unwrap_or(false));
}

/// A loopback HTTP server answering every connection (`200`, or `302` to `redirect`):
/// returns its address and the head of every request it saw.
async fn recording_server(
    bind: &str,
    redirect: Option<String>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let address = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buffer = vec![0u8; 8192];
            let read = socket.read(&mut buffer).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buffer[..read]).to_string();
            record.lock().unwrap().push(head);
            let response = match &redirect {
                Some(location) => format!(
                    "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                ),
                None => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                    .to_string(),
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (address, seen)
}

/// The status the `test-network` guest got, or its error.
async fn get(network: &LoadedModule, url: &str) -> Result<String, String> {
    match network.provision(&request(&[("url", url)])).await {
        Ok(Ok(volume)) => Ok(volume
            .annotations
            .iter()
            .find(|(k, _)| k == "test-network/status")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()),
        Ok(Err(error)) => Err(format!("{error:?}")),
        Err(error) => Err(error.to_string()),
    }
}

/// Spellings of a granted loopback authority (`127.0.0.1:PORT`, scheme http) that name
/// another host, port or scheme: decimal, hex and octal IPv4, IPv4-mapped IPv6,
/// `localhost`, `0.0.0.0`, the default port, https, another host behind `@` or `#`, an
/// authority of 60 000 characters, userinfo before the granted host. None reaches the
/// server or anywhere else; the trailing-dot variant of the granted host reaches the
/// granted server only; the
/// `Host` header the server sees is the granted authority (wasi:http forbids a guest's
/// own `host` header).
#[tokio::test]
async fn http_authority_spellings_reach_only_the_granted_server() {
    let (address, seen) = recording_server("127.0.0.1:0", None).await;
    let port = address.port();
    let runtime = runtime(&format!(
        "allow: {{ httpHosts: [\"{address}\"] }}\n\
         modules: {{ network: {{ http: [{{ host: \"{address}\", scheme: http }}] }} }}"
    ));
    let network = load(&runtime, "network", "test-network").await;

    let long = format!("{}.example:{port}", "a".repeat(60_000));
    for authority in [
        format!("2130706433:{port}"),
        format!("0x7f.1:{port}"),
        format!("0x7f000001:{port}"),
        format!("0177.0.0.1:{port}"),
        format!("127.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::ffff:7f00:1]:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
        format!("0.0.0.0:{port}"),
        format!("0:{port}"),
        "127.0.0.1".to_string(),
        format!("127.0.0.1:{port}@127.0.0.2:{port}"),
        format!("127.0.0.2:{port}#@127.0.0.1:{port}"),
        long,
    ] {
        let answer = get(&network, &format!("http://{authority}/")).await;
        assert!(answer.is_err(), "{authority:.80} was reached: {answer:?}");
    }
    let answer = get(&network, &format!("https://{address}/")).await;
    assert!(answer.is_err(), "https was reached: {answer:?}");
    // Userinfo: the connect would resolve `user:password@127.0.0.1` (the whole
    // authority), a name the guest chose and the destination check never saw; refused
    // as the grants file refuses it.
    for authority in [
        format!("user:password@127.0.0.1:{port}"),
        format!("169.254.169.254@127.0.0.1:{port}"),
    ] {
        let answer = get(&network, &format!("http://{authority}/")).await;
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.contains("HttpRequestDenied")),
            "{authority}: {answer:?}"
        );
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "the server saw a refused request: {:?}",
        seen.lock().unwrap()
    );

    // The granted authority itself and its trailing-dot spelling: only ever the granted
    // server, with the granted authority as its Host.
    for authority in [format!("127.0.0.1:{port}"), format!("127.0.0.1.:{port}")] {
        let before = seen.lock().unwrap().len();
        let answer = get(&network, &format!("http://{authority}/")).await;
        let after = seen.lock().unwrap().clone();
        match answer {
            Ok(status) => {
                assert_eq!(status, "200", "{authority}");
                assert_eq!(after.len(), before + 1, "{authority}");
                let head = after.last().unwrap().to_ascii_lowercase();
                assert!(
                    head.contains(&format!("\r\nhost: 127.0.0.1:{port}\r\n"))
                        || head.contains(&format!("\r\nhost: 127.0.0.1.:{port}\r\n")),
                    "{authority}: {head}"
                );
            }
            Err(_) => assert_eq!(after.len(), before, "{authority}"),
        }
    }
}

/// A granted name in other letter cases and with a trailing dot: the grant matches
/// (names are case-insensitive) and the request reaches the granted server; another
/// port of that name does not.
#[tokio::test]
async fn http_case_variants_of_a_granted_name_reach_only_it() {
    let (address, seen) = recording_server("127.0.0.1:0", None).await;
    let port = address.port();
    let runtime = runtime(&format!(
        "allow: {{ httpHosts: [\"localhost:{port}\"] }}\n\
         modules: {{ network: {{ http: [{{ host: \"LocalHost:{port}\", scheme: http }}] }} }}"
    ));
    let network = load(&runtime, "network", "test-network").await;
    for authority in [format!("LOCALHOST:{port}"), format!("localhost:{port}")] {
        let before = seen.lock().unwrap().len();
        let answer = get(&network, &format!("http://{authority}/")).await;
        assert_eq!(answer, Ok("200".to_string()), "{authority}");
        assert_eq!(seen.lock().unwrap().len(), before + 1, "{authority}");
    }
    // A trailing dot may not resolve here; if it does, it reaches the granted server.
    let before = seen.lock().unwrap().len();
    let answer = get(&network, &format!("http://LocalHost.:{port}/")).await;
    let reached = seen.lock().unwrap().len() - before;
    assert_eq!(reached, usize::from(answer.is_ok()), "{answer:?}");
    let answer = get(&network, &format!("http://LOCALHOST:{}/", port + 1)).await;
    assert!(
        answer
            .as_ref()
            .is_err_and(|e| e.contains("HttpRequestDenied")),
        "{answer:?}"
    );
}

/// A granted server answering `302 Found` to another loopback port: wasi:http hands the
/// guest the 302 and follows nothing, so the redirect target never sees a request.
#[tokio::test]
async fn http_redirects_are_not_followed() {
    let (target, target_seen) = recording_server("127.0.0.1:0", None).await;
    let (address, seen) =
        recording_server("127.0.0.1:0", Some(format!("http://{target}/stolen"))).await;
    let runtime = runtime(&format!(
        "allow: {{ httpHosts: [\"{address}\"] }}\n\
         modules: {{ network: {{ http: [{{ host: \"{address}\", scheme: http }}] }} }}"
    ));
    let network = load(&runtime, "network", "test-network").await;
    let answer = get(&network, &format!("http://{address}/")).await;
    assert_eq!(answer, Ok("302".to_string()));
    assert_eq!(seen.lock().unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        target_seen.lock().unwrap().is_empty(),
        "the redirect was followed: {:?}",
        target_seen.lock().unwrap()
    );
}

/// Grants of an unspecified address (`0.0.0.0`, `[::]`: connecting there reaches the
/// host's own loopback) are refused before any connection, so a server listening on
/// loopback at that port sees nothing.
#[tokio::test]
async fn granted_unspecified_addresses_are_refused_before_connecting() {
    let (v4, v4_seen) = recording_server("127.0.0.1:0", None).await;
    let v6 = tokio::net::TcpListener::bind("[::1]:0")
        .await
        .ok()
        .map(|l| {
            let port = l.local_addr().unwrap().port();
            drop(l);
            port
        });
    let mut hosts = vec![format!("0.0.0.0:{}", v4.port())];
    let mut v6_seen = None;
    if let Some(port) = v6 {
        let (_, seen) = recording_server(&format!("[::1]:{port}"), None).await;
        hosts.push(format!("[::]:{port}"));
        v6_seen = Some(seen);
    }
    let grants: Vec<String> = hosts
        .iter()
        .map(|h| format!("{{ host: \"{h}\", scheme: http }}"))
        .collect();
    let runtime = runtime(&format!(
        "allow: {{ httpHosts: [{}] }}\nmodules: {{ network: {{ http: [{}] }} }}",
        hosts
            .iter()
            .map(|h| format!("\"{h}\""))
            .collect::<Vec<_>>()
            .join(", "),
        grants.join(", ")
    ));
    let network = load(&runtime, "network", "test-network").await;
    for host in &hosts {
        let answer = get(&network, &format!("http://{host}/")).await;
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.contains("DestinationIpProhibited")),
            "{host}: {answer:?}"
        );
    }
    assert!(v4_seen.lock().unwrap().is_empty());
    if let Some(seen) = v6_seen {
        assert!(seen.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn delete_round_trip_on_echo() {
    let runtime = runtime("");
    let echo = load(&runtime, "echo", "test-echo").await;
    let request = delete_request(
        "pvc-1",
        VolumeSource::Json("{\"hostPath\":{\"path\":\"/x\"}}".into()),
        &[],
    );
    assert!(echo.should_delete(&request).await.unwrap());
    let answer = echo.delete(&request).await.unwrap();
    assert!(answer.is_ok(), "{answer:?}");
}

/// A new version is validated while the module is busy at its limit. Its
/// `describe` must not compete with the module's calls (it was refused as `busy`, and the
/// digest remembered as broken until the bytes changed).
#[tokio::test]
async fn a_new_version_is_validated_while_the_module_is_busy() {
    let runtime = runtime("modules: { slow: { limits: { maxConcurrentCalls: 1 } } }");
    let slow = load(&runtime, "slow", "test-slow").await;
    let busy = tokio::spawn(async move {
        slow.provision(&request(&[("sleepMillis", "3000")]))
            .await
            .map(|answer| answer.is_ok())
    });
    // Let the slow call take the module's only permit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let outcome = runtime
        .load_file("slow", &guests::module("test-echo"))
        .await
        .expect("the new version is put in service while the old one works");
    assert!(
        matches!(outcome, LoadOutcome::Replaced { .. }),
        "{outcome:?}"
    );
    assert_eq!(runtime.module("slow").unwrap().info().name, "test-echo");
    assert_eq!(
        busy.await.unwrap().ok(),
        Some(true),
        "the call in flight finishes"
    );
}

/// A hung filesystem never blocks the async workers, and a call hung in it times out:
/// each call runs on a blocking thread of its own, its WASI file operations inline. The
/// guest opens a FIFO in its grant (`outcomeFile`), which blocks in open(2) until a
/// writer comes, as an NFS operation hangs. On this test's single async thread, the hung
/// calls time out after their 1 s and another call goes through meanwhile. A watchdog
/// thread lets the stuck openers go after 15 s, so a regression fails with a message
/// instead of hanging.
#[tokio::test]
async fn a_hung_filesystem_does_not_block_the_async_workers() {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let granted = root.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    let fifo = granted.join("hang");
    let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0, "mkfifo");
    let runtime = runtime(&format!(
        "allow: {{ directories: [{root}] }}\n\
         modules: {{ echo: {{ directories: [{{ host: {granted}, guest: /hang, mode: read-only }}], limits: {{ timeoutSeconds: 1, maxConcurrentCalls: 16 }} }} }}",
        root = root.path().display(),
        granted = granted.display(),
    ));
    let echo = load(&runtime, "echo", "test-echo").await;
    // Opens the FIFO for writing without blocking (ENXIO while no reader waits): each
    // open releases every reader stuck in open(2), which then reads EOF.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (fifo, done) = (fifo.clone(), done.clone());
        std::thread::spawn(move || {
            let since = Instant::now();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if since.elapsed() > Duration::from_secs(15) {
                    drop(
                        std::fs::OpenOptions::new()
                            .write(true)
                            .custom_flags(libc::O_NONBLOCK)
                            .open(&fifo),
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let started = Instant::now();
    let hang = request(&[("outcomeFile", "/hang/hang")]);
    let hung = (0..4).map(|_| echo.provision(&hang));
    let other = async {
        // Let the hung calls reach open(2) first.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        let answer = echo.should_provision(&request(&[])).await;
        (answer, asked.elapsed(), started.elapsed())
    };
    let (hung, (answer, other_took, other_done)) =
        futures::future::join(futures::future::join_all(hung), other).await;
    let elapsed = started.elapsed();
    // Each hung call keeps its thread and its permit while it is stuck in open(2), and
    // counts as stuck (`wasm_provisioner_guest_calls_stuck`).
    let stuck = echo.calls_in_flight();
    let counted_stuck = runtime.metrics().module("echo").calls_stuck;
    // The threads still stuck in open(2) are let go, so the test leaves nothing behind.
    let fifo_writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo);
    drop(fifo_writer);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    watchdog.join().unwrap();

    assert!(answer.unwrap(), "the other call answered");
    assert!(
        other_took < Duration::from_millis(900) && other_done < Duration::from_secs(1),
        "the other call waited {other_took:?} (done {other_done:?} after the start): the hung calls blocked the async thread"
    );
    for (i, call) in hung.into_iter().enumerate() {
        let error = call.expect_err("a call hung in open(2) cannot answer");
        assert!(
            matches!(error, CallError::Stuck { .. })
                && error.to_string().contains(
                    "timed out after 1s stuck in a filesystem operation of the host that has not \
                     returned"
                ),
            "call {i}: {error}"
        );
        assert_eq!(error.metric_label(), "timeout");
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "the hung calls took {elapsed:?} to time out (limit 1 s)"
    );
    assert_eq!(stuck, 4, "the calls stuck in open(2) hold their permits");
    assert_eq!(
        counted_stuck, 4,
        "the calls stuck in open(2) are counted stuck"
    );
    wait_idle(&echo, "the FIFO let them go").await;
    assert_eq!(
        runtime.metrics().module("echo").calls_stuck,
        0,
        "a stuck call no longer counts once its thread returned"
    );
    assert_healthy(&runtime).await;
}

/// A call runs on a thread of its own, which dropping its future cannot stop: when its
/// waiter goes (the controller dropped it when leadership was lost, or the task was
/// aborted), the guest stops at its next epoch tick, and its permit and instance are
/// free again long before its own deadline.
#[tokio::test]
async fn an_abandoned_call_stops_at_the_next_epoch_tick() {
    let runtime =
        runtime("modules: { spin: { limits: { timeoutSeconds: 60, maxConcurrentCalls: 1 } } }");
    let spin = load(&runtime, "spin", "test-spin").await;
    let running = start_spinning(&spin).await;
    running.abort();
    wait_idle(&spin, "its waiter went (its deadline is 60 s)").await;
    assert!(spin.should_provision(&request(&[])).await.unwrap());
}

/// The same when the guest waits in a host call (a WASI sleep, as it would wait for an
/// HTTP answer), where no epoch tick reaches it: the call is dropped at once, not when
/// the sleep ends. Leadership fencing depends on it: a leader that lost its Lease must
/// not go on with backend work.
#[tokio::test]
async fn an_abandoned_call_waiting_in_the_host_stops_at_once() {
    let runtime =
        runtime("modules: { slow: { limits: { timeoutSeconds: 60, maxConcurrentCalls: 1 } } }");
    let slow = load(&runtime, "slow", "test-slow").await;
    let running = start_provision(&slow, request(&[("sleepMillis", "50000")])).await;
    // Let it reach its sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.abort();
    wait_idle(&slow, "its waiter went (its sleep is 50 s)").await;
}
