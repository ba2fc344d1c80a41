//! The `wasm-provisioner` binary: parse the command line, run it.

fn main() -> std::process::ExitCode {
    wasm_provisioner::cli::main()
}
