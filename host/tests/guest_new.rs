//! `wasm-provisioner guest new`: a project of each language, made in a temporary
//! directory outside the clone, builds **against the packaged SDK** and passes its own
//! `test.sh` (which runs the module in the offline runner of this very binary,
//! `validate-class` and the bounded delete included), and its component is a contract
//! 0.2 plugin exporting `provisioner` and `class-validator`.
//!
//! The SDKs are packaged first, as their registries would ship them
//! (`guests/package-sdks.sh`): the Rust project depends on the `.crate` from `cargo
//! package`, unpacked; the Python project installs the wheel; the JavaScript project
//! `npm ci`s the `npm pack` tarball. Each project names its package with `--sdk-path`
//! (the registries have no network here). The Python project reuses the componentize-py
//! venv `guests/build.sh` installed from the same pin (`COMPONENTIZE_PY_VENV`; the SDK
//! goes to the project's `.deps`, not into that venv); the JavaScript one runs `npm ci`
//! from npm's cache, which `guests/build.sh` filled. A missing toolchain fails the test.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// Makes the project, runs its `test.sh`, checks its component; returns the project
/// directory, removed when the returned guard drops.
fn scaffold_and_test(
    lang: &str,
    extra: &[&str],
    env: &[(&str, PathBuf)],
) -> (tempfile::TempDir, PathBuf) {
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
        stdout.contains("validate-class accepts test/class.yaml and refuses a typo")
            && stdout.contains("delete removed"),
        "{lang}: {stdout}"
    );
    (outside, dir)
}

/// The three SDK packages, made once per test run by `guests/package-sdks.sh` into a
/// directory of this run (the target directory may be shared by several clones);
/// directories of runs over an hour old are removed.
fn packages() -> &'static Path {
    static PACKAGES: OnceLock<PathBuf> = OnceLock::new();
    PACKAGES.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() > 3600));
            if stale
                && entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("sdk-packages-")
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let out = tempfile::Builder::new()
            .prefix("sdk-packages-")
            .tempdir_in(tmp)
            .unwrap()
            .keep();
        let output = Command::new("bash")
            .arg(repo().join("guests/package-sdks.sh"))
            .arg(&out)
            .env_remove("RUSTFLAGS")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "guests/package-sdks.sh failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    })
}

fn package(name: &str) -> PathBuf {
    let path = packages().join(name);
    assert!(path.exists(), "guests/package-sdks.sh made no {name}");
    path
}

#[test]
fn a_new_rust_guest_builds_against_the_packaged_crate() {
    let krate = package("wasm-provisioner-sdk-0.1.0");
    let (_project, dir) = scaffold_and_test(
        "rust",
        &["--sdk-path", krate.to_str().unwrap()],
        // Shared between runs: the SDK and wit-bindgen compile once.
        &[("CARGO_TARGET_DIR", cache().join("guest-new-target"))],
    );
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!(
            "wasm-provisioner-sdk = {{ version = \"0.1.0\", path = \"{}\" }}",
            krate.display()
        )),
        "{cargo}"
    );
    // The crate holds its contract (no path outside it): the build used it.
    assert!(krate.join("wit/provisioner.wit").is_file());
    let lock = std::fs::read_to_string(dir.join("Cargo.lock")).unwrap();
    assert!(
        lock.contains("name = \"wasm-provisioner-sdk\"\nversion = \"0.1.0\"\n"),
        "{lock}"
    );
}

#[test]
fn a_new_python_guest_builds_against_the_packaged_wheel() {
    let wheel = package("wasm_provisioner_sdk-0.1.0-py3-none-any.whl");
    let (_project, dir) = scaffold_and_test(
        "python",
        &["--sdk-path", wheel.to_str().unwrap()],
        &[(
            "COMPONENTIZE_PY_VENV",
            installed("componentize-py-", "guests/python/requirements.txt"),
        )],
    );
    // The SDK came from the wheel, into the project's .deps, not from the clone.
    assert!(
        dir.join(".deps/wasm_provisioner_sdk-0.1.0.dist-info")
            .is_dir(),
        "the wheel was not installed into .deps"
    );
    assert!(dir.join(".deps/wasm_provisioner_world.py").is_file());
    assert!(
        !dir.join("sdk").exists(),
        "no copy of the SDK in the project"
    );
}

#[test]
fn a_new_javascript_guest_builds_against_the_packed_tarball() {
    let tarball = package("wasm-provisioner-sdk-0.1.0.tgz");
    let (_project, dir) = scaffold_and_test("js", &["--sdk-path", tarball.to_str().unwrap()], &[]);
    let installed = dir.join("node_modules/wasm-provisioner-sdk");
    assert!(
        !installed.is_symlink() && installed.join("componentize.mjs").is_file(),
        "npm ci did not install the tarball into node_modules"
    );
    let package: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(installed.join("package.json")).unwrap())
            .unwrap();
    assert_eq!(package["version"], "0.1.0");
    assert!(
        !dir.join("sdk").exists(),
        "no copy of the SDK in the project"
    );
}

/// The Python SDK's own unit tests (quantities, bounded deletes), natively.
#[test]
fn the_python_sdk_unit_tests_pass() {
    let output = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(repo().join("guests/python/sdk/tests"))
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        report.contains("OK") && !report.contains("Ran 0 tests"),
        "{report}"
    );
}

/// The JavaScript SDK's own unit tests (quantities, the delete budget), in Node.
#[test]
fn the_javascript_sdk_unit_tests_pass() {
    let output = Command::new("node")
        .arg("--test")
        .arg(repo().join("guests/js/sdk/test/sdk.test.mjs"))
        .output()
        .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}");
    assert!(
        report.contains("# fail 0") && !report.contains("# pass 0"),
        "{report}"
    );
}
