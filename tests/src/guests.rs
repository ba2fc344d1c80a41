//! PLACEHOLDER (to be replaced wholesale by the guests engineer): built guest components.
use std::path::{Path, PathBuf};

pub fn dist_dir() -> &'static Path {
    panic!("tests/src/guests.rs is still a placeholder: guests are not built yet")
}

pub fn module(name: &str) -> PathBuf {
    dist_dir().join(format!("{name}.wasm"))
}

pub fn copy_module(name: &str, dir: &Path, as_name: &str) {
    std::fs::copy(module(name), dir.join(format!("{as_name}.wasm"))).expect("copy module");
}
