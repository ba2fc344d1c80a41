fn main() {
    eprintln!("wasm-provisioner: not implemented yet");
    std::process::exit(2);
}
