//! Compiling a module in a child process, bounded in time and memory.
//!
//! Compile time and memory are not a security boundary in wasmtime: a small hostile
//! component (deeply nested blocks, a `br_table`, many locals) takes Cranelift minutes
//! and gigabytes. So the host compiles each module that misses the cache in a child:
//! its own binary run again with the hidden subcommand [`SUBCOMMAND`], the module's
//! bytes on the child's stdin, `Engine::precompile_component`'s output on its stdout.
//! The child limits itself first thing (before reading a byte): `RLIMIT_DATA` (its heap
//! and every private writable mapping; `RLIMIT_AS` would also count the address space
//! wasmtime and glibc reserve but never touch), `RLIMIT_CPU` as a backstop, and death
//! with its parent. Its priority is the host's: a lower one would stretch a legitimate
//! compile past the wall-clock timeout on a busy node, and refuse it. The parent kills it at the wall-clock
//! timeout. Its engine is built from the runtime engine's [`CodegenSettings`] without an
//! instance pool, so its code is what the runtime's engine would have compiled (the
//! parent deserialises it, which checks that too). A compile that hits a limit is the
//! version's fault, not the host's: the version is refused until its bytes change.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::engine::{CodegenSettings, compile_engine};

/// The hidden subcommand of the host binary that compiles one module.
pub const SUBCOMMAND: &str = "compile-module";

/// Default of `--compile-timeout`: the wall-clock time one module's compile may take.
/// Measured on 2 cores (busy with other builds): a 19 MB Python guest compiles in 8-13 s
/// in the release build and 17-30 s in the debug build, a 13 MB JavaScript guest in
/// 8-23 s (release) and 19-32 s (debug); a Rust guest in 0.1-0.3 s. Two compiles at
/// once share the cores, a 35 MB guest takes about twice as long, and a busy node gives
/// less: 120 s leaves about a fourfold margin over the slowest of those, and nothing but
/// the module itself waits for it.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(120);

/// Default of `--compile-memory-bytes`: the `RLIMIT_DATA` of a compile child. The
/// release build compiles the 19 MB Python and the 13 MB JavaScript guests under it
/// (peak RSS 331-378 MB; both also pass at 448 and 512 MiB, the debug build's
/// JavaScript compile needs more than 384 MiB). [`COMPILE_CHILDREN`] children at this
/// limit take 768 MiB, leaving 256 MiB of a 1 GiB pod to the host.
pub const DEFAULT_COMPILE_MEMORY_BYTES: u64 = 384 << 20;

/// Compile children running at once. Two: one hostile module compiling to its limits
/// never holds up another module's compile, and two children at their memory limit
/// plus the host fit a 1 GiB pod (a container whose memory limit is hit may be killed
/// whole); more would not compile faster on the two cores a host is typically given.
pub const COMPILE_CHILDREN: usize = 2;

/// Exit status of a child whose compile failed (the module is not valid): sysexits'
/// `EX_DATAERR`, never what clap or a panic exits with.
const EXIT_INVALID: u8 = 65;
/// Exit status of a child that could not set up (its limits, its engine): `EX_OSERR`.
const EXIT_SETUP: u8 = 71;
/// Exit status of a Rust program that panicked.
const RUST_PANIC_EXIT: i32 = 101;
/// Bytes of a child's stderr kept for the refusal message.
const STDERR_KEPT: usize = 2048;

/// How modules are compiled in a child process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompilerConfig {
    /// The host binary that has [`SUBCOMMAND`].
    pub binary: PathBuf,
    /// Wall-clock bound of one compile (`--compile-timeout`).
    pub timeout: Duration,
    /// `RLIMIT_DATA` of the child (`--compile-memory-bytes`).
    pub memory_bytes: u64,
}

impl CompilerConfig {
    /// Compiles with this very binary (`/proc/self/exe`, so a binary replaced on disk
    /// since the start does not matter).
    pub fn this_binary(timeout: Duration, memory_bytes: u64) -> Self {
        CompilerConfig {
            binary: PathBuf::from("/proc/self/exe"),
            timeout,
            memory_bytes,
        }
    }
}

/// Why a compile in the child produced no code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileFailure {
    /// Not a valid component (the same error an in-process compile gives).
    #[error("{0}")]
    Invalid(String),
    #[error(
        "its compile did not finish within {}s and was stopped; if the module is legitimately \
         this slow to compile, raise --compile-timeout",
        timeout.as_secs_f64()
    )]
    TimedOut { timeout: Duration },
    #[error(
        "its compile needed more than the {limit_bytes} bytes of memory a compile may use and \
         was stopped ({detail}); if the module is legitimately this large, raise \
         --compile-memory-bytes"
    )]
    OutOfMemory { limit_bytes: u64, detail: String },
    /// The child ended another way (a crash of the compiler).
    #[error("its compile crashed ({status}): {stderr}")]
    Crashed { status: String, stderr: String },
    /// The child could not be started or fed: the host's problem, not the module's.
    #[error("the compile child could not run: {0}")]
    Child(String),
}

impl CompileFailure {
    /// Whether the failure is the host's (the child could not run), so the next scan
    /// may try again; every other failure is the version's and repeats.
    pub fn is_transient(&self) -> bool {
        matches!(self, CompileFailure::Child(_))
    }

    /// The limit hit, for metrics: `timeout`, `memory`, or `None`.
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            CompileFailure::TimedOut { .. } => Some("timeout"),
            CompileFailure::OutOfMemory { .. } => Some("memory"),
            _ => None,
        }
    }
}

/// Compiles `bytes` in a child process; returns `Engine::precompile_component`'s output.
/// The child is killed when the timeout passes, or when the returned future is dropped.
pub async fn compile_in_child(
    config: &CompilerConfig,
    settings: CodegenSettings,
    bytes: Vec<u8>,
) -> Result<Vec<u8>, CompileFailure> {
    let started = Instant::now();
    let mut command = tokio::process::Command::new(&config.binary);
    command
        .arg(SUBCOMMAND)
        .arg(format!("--memory-bytes={}", config.memory_bytes))
        // The parent's wall-clock timeout is the bound; CPU time (every compile thread
        // together) is a backstop should the parent be gone.
        .arg(format!(
            "--cpu-seconds={}",
            config.timeout.as_secs().saturating_mul(4).max(1) + 1
        ))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let CodegenSettings::OnDemand { memory_reservation } = settings {
        command.arg(format!(
            "--on-demand-memory-reservation={memory_reservation}"
        ));
    }
    let mut child = command
        .spawn()
        .map_err(|e| CompileFailure::Child(format!("{}: {e}", config.binary.display())))?;
    let pid = child.id();
    tracing::debug!(pid, bytes = bytes.len(), "compile child started");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let feed = async move {
        // A child that died early closes the pipe: its status says why.
        let _ = stdin.write_all(&bytes).await;
        drop(stdin);
    };
    let output = async move {
        let mut native = Vec::new();
        stdout.read_to_end(&mut native).await.map(|_| native)
    };
    let errors = async move {
        let mut text = Vec::new();
        let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut text).await;
        // Whatever else it writes is drained, so the child never blocks on the pipe.
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        text
    };
    let run = async { tokio::join!(feed, output, errors, child.wait()) };
    let (_, native, stderr, status) = match tokio::time::timeout(config.timeout, run).await {
        Ok(done) => done,
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            tracing::debug!(pid, "compile child killed at the timeout");
            return Err(CompileFailure::TimedOut {
                timeout: config.timeout,
            });
        }
    };
    let status = status.map_err(|e| CompileFailure::Child(format!("waiting for it: {e}")))?;
    let stderr = tail(&stderr);
    tracing::debug!(pid, %status, elapsed = ?started.elapsed(), "compile child ended");
    match status.code() {
        Some(0) => native.map_err(|e| CompileFailure::Child(format!("reading its output: {e}"))),
        // An allocation the compiler could not make is reported as an error, not an abort.
        Some(code) if code == i32::from(EXIT_INVALID) && !out_of_memory(&stderr) => {
            Err(CompileFailure::Invalid(stderr))
        }
        _ => Err(classify(status, stderr, config)),
    }
}

/// A child that ended without compiling: out of memory, out of CPU time, or a crash.
fn classify(status: ExitStatus, stderr: String, config: &CompilerConfig) -> CompileFailure {
    use std::os::unix::process::ExitStatusExt as _;
    let signal = status.signal();
    if signal == Some(libc::SIGXCPU) {
        return CompileFailure::TimedOut {
            timeout: config.timeout,
        };
    }
    if out_of_memory(&stderr) {
        return CompileFailure::OutOfMemory {
            limit_bytes: config.memory_bytes,
            detail: stderr,
        };
    }
    // Not killed by this process (that is the timeout above): the kernel's OOM killer,
    // when the pod's memory is full.
    if signal == Some(libc::SIGKILL) {
        return CompileFailure::OutOfMemory {
            limit_bytes: config.memory_bytes,
            detail: "killed by SIGKILL, most likely by the kernel's out-of-memory killer".into(),
        };
    }
    match signal {
        // The compiler crashed on this module: a signal (a stack overflow aborts), or a
        // panic (Rust's exit status 101).
        Some(_) => CompileFailure::Crashed {
            status: status.to_string(),
            stderr,
        },
        None if status.code() == Some(RUST_PANIC_EXIT) => CompileFailure::Crashed {
            status: status.to_string(),
            stderr,
        },
        // Its own setup failed, or it is not a binary that has the subcommand (a host
        // binary replaced by another version): the host's problem, tried again.
        None => CompileFailure::Child(format!("{status}: {stderr}")),
    }
}

/// Whether the child's stderr says it ran out of memory: Rust's allocation failure
/// (which aborts), or an `ENOMEM` from a mapping wasmtime or Cranelift asked for.
fn out_of_memory(stderr: &str) -> bool {
    [
        "memory allocation of",
        "Cannot allocate memory",
        "out of memory",
    ]
    .iter()
    .any(|needle| stderr.contains(needle))
}

/// The last [`STDERR_KEPT`] bytes of the child's stderr, trimmed, one line.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let start = text.len().saturating_sub(STDERR_KEPT);
    let start = (start..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].replace('\n', "; ")
}

/// Arguments of the hidden compile subcommand (set by the parent, never by hand).
#[derive(Debug, Clone, Args)]
pub struct CompileChildArgs {
    /// RLIMIT_DATA of this process, in bytes.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_CHILD_MEMORY_BYTES")]
    pub memory_bytes: u64,
    /// RLIMIT_CPU of this process, in seconds.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_CHILD_CPU_SECONDS")]
    pub cpu_seconds: u64,
    /// The runtime engine uses the on-demand allocator with this memory reservation
    /// (absent: the pooling allocator's settings).
    #[arg(
        long,
        env = "WASM_PROVISIONER_COMPILE_CHILD_ON_DEMAND_MEMORY_RESERVATION"
    )]
    pub on_demand_memory_reservation: Option<u64>,
}

/// The child's side: limit itself, read the module from stdin, write the compiled
/// component to stdout.
pub fn child_main(args: &CompileChildArgs) -> ExitCode {
    if let Err(error) = limit_self(args) {
        eprintln!("cannot set the compile child's limits: {error}");
        return ExitCode::from(EXIT_SETUP);
    }
    let mut bytes = Vec::new();
    if let Err(error) = std::io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("cannot read the module from stdin: {error}");
        return ExitCode::from(EXIT_SETUP);
    }
    let settings = match args.on_demand_memory_reservation {
        Some(memory_reservation) => CodegenSettings::OnDemand { memory_reservation },
        None => CodegenSettings::Pooled,
    };
    let engine = match compile_engine(settings) {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("cannot build the compile engine: {error:#}");
            return ExitCode::from(EXIT_SETUP);
        }
    };
    let native = match engine.precompile_component(&bytes) {
        Ok(native) => native,
        Err(error) => {
            eprintln!("{error:#}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    drop(bytes);
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(&native).and_then(|()| stdout.flush()) {
        eprintln!("cannot write the compiled component: {error}");
        return ExitCode::from(EXIT_SETUP);
    }
    ExitCode::SUCCESS
}

/// The child's limits, set before it reads a byte of the module.
fn limit_self(args: &CompileChildArgs) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, Signal, setrlimit};
    // Dies with the host: a compile nobody waits for must not go on. (The signal comes
    // when the thread that spawned the child ends: an async worker, which lives as long
    // as the host's runtime.)
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    setrlimit(
        Resource::Data,
        Rlimit {
            current: Some(args.memory_bytes),
            maximum: Some(args.memory_bytes),
        },
    )?;
    setrlimit(
        Resource::Cpu,
        Rlimit {
            current: Some(args.cpu_seconds),
            maximum: Some(args.cpu_seconds + 5),
        },
    )?;
    Ok(())
}
