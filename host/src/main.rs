//! The `wasm-provisioner` binary: parse the command line, run it.

fn main() -> std::process::ExitCode {
    tune_malloc();
    wasm_provisioner::cli::main()
}

/// Two glibc malloc tunables, set first thing in `main`, before any other thread exists;
/// the environment's own setting of either still wins.
///
/// - Two arenas, as `MALLOC_ARENA_MAX=2` would set. glibc gives threads that allocate at
///   once arenas of their own, up to eight per core; tokio's workers, the blocking pool
///   and wasmtime's compile threads each ended up with one, and memory freed in one
///   arena is not reused by another, so the host's RSS kept creeping up over a long
///   churn of claims (the chaos suite's bound: +10% over 3000 create/delete cycles with a bounded
///   Event cache; +6% and flat at the end with two arenas).
/// - No fastbins, as `GLIBC_TUNABLES=glibc.malloc.mxfast=0` would set. With them, a
///   free that leaves a free chunk of 64 KiB or more once merged with its neighbours (a
///   watch event's buffer, or any chunk next to the top of the heap) first consolidates
///   every fastbin of the arena: `free` and `malloc_consolidate` were about a tenth of
///   the host's CPU in a storm of claims. Small allocations still go through the
///   per-thread cache (tcache), the fast path fastbins once were. Measured in
///   interleaved runs of 500 claims on 2026-12-06: 3-7% less CPU per volume, the same
///   peak RSS (`bench/results/load-history.md`).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        // SAFETY: mallopt only sets a malloc tunable; called first thing in main, before
        // any other thread exists.
        unsafe {
            if std::env::var_os("MALLOC_ARENA_MAX").is_none()
                && !tunables.contains("glibc.malloc.arena_max")
            {
                libc::mallopt(libc::M_ARENA_MAX, 2);
            }
            if !tunables.contains("glibc.malloc.mxfast") {
                libc::mallopt(libc::M_MXFAST, 0);
            }
        }
    }
}
