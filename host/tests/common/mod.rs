//! What the host's integration tests share: the built guest components, and WAT
//! modules made into components.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The directory of built guest components: `guests/build.sh` (a no-op when warm)
/// builds them and prints it on its last line.
pub fn dist_dir() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("running guests/build.sh");
        assert!(
            output.status.success(),
            "guests/build.sh failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        PathBuf::from(
            stdout
                .trim()
                .lines()
                .last()
                .expect("build.sh prints the dist directory"),
        )
    })
}

/// Wraps a WAT core module into a `provisioner` component, against the repository's
/// WIT (the same world the host's bindings come from).
pub fn wat_component(wat: &str) -> Vec<u8> {
    let mut module = wat::parse_str(wat).unwrap_or_else(|e| panic!("invalid WAT: {e}\n{wat}"));
    let mut resolve = wit_parser::Resolve::default();
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let (package, _) = resolve
        .push_dir(&wit)
        .unwrap_or_else(|e| panic!("cannot read {}: {e:#}", wit.display()));
    let world = resolve
        .select_world(&[package], Some("provisioner"))
        .expect("the provisioner world");
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .expect("component metadata");
    wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .unwrap_or_else(|e| panic!("the WAT module does not implement the world: {e:#}"))
}
