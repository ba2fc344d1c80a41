//! The `wasm-provisioner` binary: parse the command line, run it.

fn main() -> std::process::ExitCode {
    cap_malloc_arenas();
    wasm_provisioner::cli::main()
}

/// glibc's malloc gives threads that allocate at once arenas of their own, up to eight
/// per core; tokio's workers, the blocking pool and wasmtime's compile threads each end
/// up with one, and memory freed in one arena is not reused by another, so the host's
/// RSS kept creeping up over a long churn of claims (issue 10.8: +10% over 3000
/// create/delete cycles with a bounded Event cache; +6% and flat at the end with two
/// arenas). Two arenas, as `MALLOC_ARENA_MAX=2` would set; an explicit
/// `MALLOC_ARENA_MAX` in the environment still wins.
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a malloc tunable; called first thing in main, before
        // any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
