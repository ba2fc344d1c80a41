//! `wasm-provisioner guest new`: a project of each language, made in a temporary
//! directory outside the clone, builds and passes its own `test.sh` (which runs the
//! module in the offline runner of this very binary, `validate-class` included), and its
//! component is a contract 0.2 plugin exporting `provisioner` and `class-validator`.
//!
//! The Rust project uses the SDK by path (`--sdk-path`, the clone's `guests/sdk`): the
//! released form is a git dependency on a tag, and there is no network to GitHub here.
//! The Python and JavaScript projects reuse the toolchains `guests/build.sh` installed
//! from the same pins (`COMPONENTIZE_PY_VENV`, `NODE_MODULES_DIR`), so no test downloads
//! anything the build did not; a missing toolchain fails the test.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cache() -> PathBuf {
    std::env::var_os("WASM_PROVISIONER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/wasm-provisioner")
        })
}

/// The toolchain `guests/build.sh` installed for the pins in `file`: the directory
/// `<cache>/<prefix><first 16 hex digits of the file's sha256>`, as build.sh names it.
fn installed(prefix: &str, file: &str) -> PathBuf {
    use sha2::Digest as _;
    common::dist_dir();
    let pins = std::fs::read(repo().join(file)).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(&pins));
    let dir = cache().join(format!("{prefix}{}", &digest[..16]));
    assert!(
        dir.join(".installed").exists(),
        "guests/build.sh did not install {} (from {file})",
        dir.display()
    );
    dir
}

/// The contract's interfaces a new project's component exports: `provisioner` and the
/// template's capability `class-validator`, both of 0.2 (and componentize-py's own
/// `exports`, which is no contract interface).
const TEMPLATE_EXPORTS: [&str; 2] = [
    "wasm-provisioner:plugin/class-validator@0.2.0",
    "wasm-provisioner:plugin/provisioner@0.2.0",
];

fn scaffold_and_test(lang: &str, extra: &[&str], env: &[(&str, PathBuf)]) {
    let outside = tempfile::tempdir().unwrap();
    assert!(
        !outside.path().starts_with(repo().canonicalize().unwrap()),
        "the project must be outside the clone"
    );
    let dir = outside.path().join(format!("demo-{lang}"));
    let bin = env!("CARGO_BIN_EXE_wasm-provisioner");
    let name = format!("demo-{lang}");
    let output = Command::new(bin)
        .args(["guest", "new", &name, "--lang", lang, "--dir"])
        .arg(&dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "guest new failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for file in ["README.md", "build.sh", "test.sh", "wit/provisioner.wit"] {
        assert!(dir.join(file).is_file(), "{lang}: no {file}");
    }
    let wit = std::fs::read_to_string(dir.join("wit/provisioner.wit")).unwrap();
    assert!(
        wit.contains("package wasm-provisioner:plugin@0.2.0;"),
        "{lang}: the vendored contract is not 0.2"
    );
    let mut test = Command::new("bash");
    test.arg(dir.join("test.sh"))
        .env("WASM_PROVISIONER", bin)
        // The offline runner's compile cache, shared with guest_polyglot (one compile
        // per module version, kept between runs).
        .env(
            "WASM_PROVISIONER_CACHE_DIR",
            cache().join("offline-runner-cwasm"),
        )
        // This is the debug build of the host: its compile of a JavaScript guest needs
        // 512 MiB, above the default (sized for the release build, see
        // docs/security.md, "Compile cache").
        .env("WASM_PROVISIONER_COMPILE_MEMORY_BYTES", "536870912")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    for (key, value) in env {
        test.env(key, value);
    }
    let output = test.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all offline checks passed"),
        "{lang}: test.sh failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    let built = dir.join(format!("dist/{name}.wasm"));
    let exports: Vec<String> = common::component_exports(&built)
        .into_iter()
        .filter(|e| e.starts_with("wasm-provisioner:"))
        .collect();
    assert_eq!(exports, TEMPLATE_EXPORTS, "{lang}: the component's exports");
    assert!(
        stdout.contains("validate-class accepts test/class.yaml and refuses a typo"),
        "{lang}: {stdout}"
    );
}

#[test]
fn a_new_rust_guest_builds_and_passes_its_test_outside_the_clone() {
    let sdk = repo().join("guests/sdk");
    scaffold_and_test(
        "rust",
        &["--sdk-path", sdk.to_str().unwrap()],
        // Shared between runs: the SDK and wit-bindgen compile once.
        &[("CARGO_TARGET_DIR", cache().join("guest-new-target"))],
    );
}

#[test]
fn a_new_python_guest_builds_and_passes_its_test_outside_the_clone() {
    scaffold_and_test(
        "python",
        &[],
        &[(
            "COMPONENTIZE_PY_VENV",
            installed("componentize-py-", "guests/python/requirements.txt"),
        )],
    );
}

#[test]
fn a_new_javascript_guest_builds_and_passes_its_test_outside_the_clone() {
    scaffold_and_test(
        "js",
        &[],
        &[(
            "NODE_MODULES_DIR",
            installed("js-node-modules-", "guests/js/package-lock.json").join("node_modules"),
        )],
    );
}
