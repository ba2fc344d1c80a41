//! `wasm-provisioner guest new NAME --lang rust|python|js`: a buildable guest project
//! outside this repository.
//!
//! Every template (in `guests/templates/`, embedded in the binary) holds the contract
//! vendored at this host's version (`wit/provisioner.wit`, contract 0.2), a plugin that
//! makes one directory per volume and has the optional capability `validate-class` (with
//! `expand` commented out, to show how a capability is added), `build.sh` (to
//! `dist/NAME.wasm`), `test.sh` (builds, then runs the module in the offline runner with
//! a real granted directory), the classes and claims the test uses, and a README. Python and JavaScript projects carry their SDK file and
//! the same pinned toolchain as this repository's guests (`guests/python/requirements.txt`,
//! `guests/js/package-lock.json`); a Rust project depends on the SDK crate by git tag of
//! this host's version, or by path with `--sdk-path` (development, or no network).

use std::path::{Path, PathBuf};

/// Where the Rust SDK is fetched from by a new Rust project (a git dependency pinned
/// to the tag of this host's version, `v<version>`).
pub const SDK_GIT_URL: &str = "https://github.com/wasm-provisioner/wasm-provisioner";

/// The language of a new guest project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// Why a project could not be made; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GuestNewError {
    #[error(
        "{name:?} is not a module name: use lowercase letters, digits and `-` (a DNS label, at most 63 characters, starting with a letter)"
    )]
    BadName { name: String },
    #[error("{dir} already exists and is not empty: choose another --dir or remove it")]
    NotEmpty { dir: PathBuf },
    #[error(
        "--sdk-path {path}: no Cargo.toml of the wasm-provisioner-sdk crate there (pass the repository's guests/sdk directory)"
    )]
    BadSdkPath { path: PathBuf },
    #[error(
        "--sdk-path is for --lang rust only (the Python and JavaScript SDKs are copied into the project)"
    )]
    SdkPathNotRust,
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

const WIT: &str = include_str!("../../../wit/0.2.0/provisioner.wit");
const README: &str = include_str!("../../../guests/templates/common/README.md");
const TEST_SH: &str = include_str!("../../../guests/templates/common/test.sh");
const TEST_CLASS: &str = include_str!("../../../guests/templates/common/test/class.yaml");
const TEST_CLASS_TYPO: &str = include_str!("../../../guests/templates/common/test/class-typo.yaml");
const TEST_CLAIM: &str = include_str!("../../../guests/templates/common/test/claim.yaml");
const TEST_CLAIM_TOO_BIG: &str =
    include_str!("../../../guests/templates/common/test/claim-too-big.yaml");

const RUST_CARGO: &str = include_str!("../../../guests/templates/rust/Cargo.toml");
const RUST_LIB: &str = include_str!("../../../guests/templates/rust/src/lib.rs");
const RUST_BUILD: &str = include_str!("../../../guests/templates/rust/build.sh");

const PY_APP: &str = include_str!("../../../guests/templates/python/src/app.py");
const PY_BUILD: &str = include_str!("../../../guests/templates/python/build.sh");
const PY_REQUIREMENTS: &str = include_str!("../../../guests/python/requirements.txt");
const PY_SDK: &str = include_str!("../../../guests/python/sdk/wasm_provisioner_sdk.py");
const PY_WORLD: &str = include_str!("../../../guests/python/sdk/wasm_provisioner_world.py");

const JS_APP: &str = include_str!("../../../guests/templates/js/app.js");
const JS_BUILD: &str = include_str!("../../../guests/templates/js/build.sh");
const JS_LOCK: &str = include_str!("../../../guests/js/package-lock.json");
const JS_COMPONENTIZE: &str = include_str!("../../../guests/js/componentize.mjs");
const JS_WORLD: &str = include_str!("../../../guests/js/world.wit");
const JS_SDK: &str = include_str!("../../../guests/js/sdk/wasm-provisioner-sdk.js");
/// The name of the package in `guests/js/package-lock.json`, replaced by the guest's.
const JS_LOCK_NAME: &str = "\"name\": \"wasm-provisioner-js-guests\"";

/// What `guest new` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
}

/// The files of a new project: (relative path, contents, executable).
pub fn project_files(
    name: &str,
    lang: Lang,
    sdk_path: Option<&Path>,
) -> Result<Vec<(&'static str, String, bool)>, GuestNewError> {
    if !wasm_provisioner_runtime::is_valid_module_name(name)
        || !name.starts_with(|c: char| c.is_ascii_lowercase())
    {
        return Err(GuestNewError::BadName {
            name: name.to_string(),
        });
    }
    let version = env!("CARGO_PKG_VERSION");
    let wit_package = WIT
        .lines()
        .find_map(|l| l.strip_prefix("package "))
        .map(|p| p.trim_end_matches(';').to_string())
        .unwrap_or_default();
    let (lang_name, main_file, test_what, extra, toolchain, native_test, howto) = match lang {
        Lang::Rust => (
            "Rust",
            "`src/lib.rs`",
            "runs the unit tests natively (`cargo test`), builds, then runs the module in the offline runner",
            "| `Cargo.toml` | the crate (a `cdylib`) and its SDK dependency |\n",
            rust_toolchain_notes(version),
            "cargo test --quiet\n",
            "implement the trait (`Expander`, `CapacityReporter`, `ClassValidator`) and name \
             the capability in `export!` (`capabilities: [validate_class, expand]`).",
        ),
        Lang::Python => (
            "Python",
            "`src/app.py`",
            "builds, then runs the module in the offline runner",
            "| `sdk/wasm_provisioner_sdk.py` | the Python SDK, at the host's version |\n\
             | `sdk/wasm_provisioner_world.py` | writes the world the plugin is built for (its capabilities) |\n\
             | `requirements.txt` | componentize-py, pinned |\n",
            "`build.sh` installs componentize-py (pinned in `requirements.txt`) into `.venv` on \
             first use (`COMPONENTIZE_PY_VENV` names another venv), writes the world the plugin \
             is built for (`sdk/wasm_provisioner_world.py`: contract 0.2's `plugin` world plus \
             an export per capability method the plugin class defines) and runs \
             `componentize-py -d WORLD_DIR -w guest componentize -p src -p sdk app`. Python \
             3.10 or later. The component is ~19 MB: more than a ConfigMap holds (see Deploy)."
                .to_string(),
            "",
            "define the method (`expand`, `get_capacity`, `validate_class`) in the plugin class; \
             build.sh exports its interface.",
        ),
        Lang::Js => (
            "JavaScript",
            "`app.js`",
            "builds, then runs the module in the offline runner",
            "| `sdk/wasm-provisioner-sdk.js` | the JavaScript SDK, at the host's version |\n\
             | `componentize.mjs`, `world.wit` | the build through the componentize-js API; the world adds the WASI filesystem imports |\n\
             | `package.json`, `package-lock.json` | componentize-js, pinned |\n",
            "`build.sh` runs `npm ci` on first use (`NODE_MODULES_DIR` names a `node_modules` \
             installed from the same lock, linked instead) and `node componentize.mjs app.js \
             dist/NAME.wasm wit`, which loads `app.js` in Node once (the host's imports \
             stubbed) to see which capability exports it defines and builds for a world \
             exporting exactly those. Node 20.6 or later. The component is ~13 MB: more than a \
             ConfigMap holds (see Deploy)."
                .to_string(),
            "",
            "add the method (`expand`, `getCapacity`, `validateClass`) to the plugin; \
             `exportPlugin` and the build export its interface.",
        ),
    };
    let delivery = match lang {
        Lang::Rust => {
            "a ConfigMap holds it: `kubectl create configmap ... --from-file=dist/NAME.wasm`"
        }
        Lang::Python | Lang::Js => {
            "too big for a ConfigMap: an init container or image volume copying it into an \
             emptyDir, or a PVC; copy to a temporary name in the directory, then rename"
        }
    };
    let crate_name = name.replace('-', "_");
    let sdk_dependency = match sdk_path {
        Some(path) => {
            if lang != Lang::Rust {
                return Err(GuestNewError::SdkPathNotRust);
            }
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let manifest = std::fs::read_to_string(absolute.join("Cargo.toml")).unwrap_or_default();
            if !manifest.contains("name = \"wasm-provisioner-sdk\"") {
                return Err(GuestNewError::BadSdkPath {
                    path: path.to_path_buf(),
                });
            }
            format!(
                "# Development form: the SDK of a local clone. The released form is\n\
                 # wasm-provisioner-sdk = {{ git = \"{SDK_GIT_URL}\", tag = \"v{version}\" }}\n\
                 wasm-provisioner-sdk = {{ path = {:?} }}",
                absolute.display().to_string()
            )
        }
        None => format!(
            "# The SDK at this host's version. For development against a local clone:\n\
             # wasm-provisioner-sdk = {{ path = \"/path/to/wasm-provisioner/guests/sdk\" }}\n\
             wasm-provisioner-sdk = {{ git = \"{SDK_GIT_URL}\", tag = \"v{version}\" }}"
        ),
    };
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate_name}}", &crate_name)
            .replace("{{sdk_dependency}}", &sdk_dependency)
            .replace("{{native_test}}", native_test)
            .replace("{{lang}}", lang_name)
            .replace("{{host_version}}", version)
            .replace("{{main_file}}", main_file)
            .replace("{{wit_package}}", &wit_package)
            .replace("{{test_what}}", test_what)
            .replace("{{extra_files}}", extra)
            .replace("{{toolchain}}", &toolchain)
            .replace("{{delivery}}", delivery)
            .replace("{{capability_howto}}", howto)
    };
    let mut files = vec![
        ("README.md", fill(README), false),
        ("test.sh", fill(TEST_SH), true),
        ("test/class.yaml", fill(TEST_CLASS), false),
        ("test/class-typo.yaml", fill(TEST_CLASS_TYPO), false),
        ("test/claim.yaml", fill(TEST_CLAIM), false),
        ("test/claim-too-big.yaml", fill(TEST_CLAIM_TOO_BIG), false),
        ("wit/provisioner.wit", WIT.to_string(), false),
    ];
    match lang {
        Lang::Rust => files.extend([
            ("Cargo.toml", fill(RUST_CARGO), false),
            ("src/lib.rs", fill(RUST_LIB), false),
            ("build.sh", fill(RUST_BUILD), true),
            (".gitignore", "/target/\n/dist/\n".to_string(), false),
        ]),
        Lang::Python => files.extend([
            ("src/app.py", fill(PY_APP), false),
            ("sdk/wasm_provisioner_sdk.py", PY_SDK.to_string(), false),
            ("sdk/wasm_provisioner_world.py", PY_WORLD.to_string(), false),
            ("requirements.txt", PY_REQUIREMENTS.to_string(), false),
            ("build.sh", fill(PY_BUILD), true),
            (
                ".gitignore",
                "/.venv/\n/dist/\n__pycache__/\n".to_string(),
                false,
            ),
        ]),
        Lang::Js => files.extend([
            ("app.js", fill(JS_APP), false),
            ("sdk/wasm-provisioner-sdk.js", JS_SDK.to_string(), false),
            ("componentize.mjs", JS_COMPONENTIZE.to_string(), false),
            ("world.wit", JS_WORLD.to_string(), false),
            ("package.json", js_package_json(name), false),
            (
                "package-lock.json",
                JS_LOCK.replace(JS_LOCK_NAME, &format!("\"name\": \"{name}\"")),
                false,
            ),
            ("build.sh", fill(JS_BUILD), true),
            (".gitignore", "/node_modules\n/dist/\n".to_string(), false),
        ]),
    }
    Ok(files)
}

fn rust_toolchain_notes(version: &str) -> String {
    format!(
        "`build.sh` adds the `wasm32-wasip2` target with rustup if missing and runs `cargo \
         build --release --target wasm32-wasip2`. The SDK comes from git, the tag \
         `v{version}` of {SDK_GIT_URL}; to build against a local clone instead, switch \
         `Cargo.toml` to the path form it shows (`guest new --sdk-path DIR` writes that \
         form). `cargo test` runs the plugin natively (the SDK's `testing` builds requests)."
    )
}

fn js_package_json(name: &str) -> String {
    let lock: serde_json::Value =
        serde_json::from_str(JS_LOCK).expect("guests/js/package-lock.json is JSON");
    let dependencies = lock["packages"][""]["dependencies"].clone();
    let package = serde_json::json!({
        "name": name,
        "private": true,
        "type": "module",
        "dependencies": dependencies,
    });
    serde_json::to_string_pretty(&package).expect("JSON") + "\n"
}

/// Writes a new project into `dir` (which must not exist, or be empty).
pub fn create(
    name: &str,
    lang: Lang,
    dir: &Path,
    sdk_path: Option<&Path>,
) -> Result<Created, GuestNewError> {
    let files = project_files(name, lang, sdk_path)?;
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(GuestNewError::NotEmpty {
            dir: dir.to_path_buf(),
        });
    }
    let mut written = Vec::new();
    for (relative, contents, executable) in files {
        let path = dir.join(relative);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, contents)?;
            if executable {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            }
            Ok(())
        };
        write().map_err(|source| GuestNewError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(Created {
        dir: dir.to_path_buf(),
        files: written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_placeholder_is_filled() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for (path, contents, _) in project_files("my-guest", lang, None).unwrap() {
                assert!(
                    !contents.contains("{{name}}") && !contents.contains("{{sdk_dependency}}"),
                    "{lang:?} {path}: an unfilled placeholder"
                );
                if path != "wit/provisioner.wit" && path != "package-lock.json" {
                    let rest: Vec<&str> = contents.matches("{{").collect();
                    // Rust format strings escape braces as `{{`; templates use none of them.
                    assert!(rest.is_empty(), "{lang:?} {path}: {rest:?}");
                }
            }
        }
    }

    #[test]
    fn new_projects_are_contract_0_2_with_their_build_tools() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let files = project_files("g", lang, None).unwrap();
            let file = |name: &str| files.iter().find(|f| f.0 == name).map(|f| &f.1);
            assert!(
                file("wit/provisioner.wit")
                    .unwrap()
                    .contains("package wasm-provisioner:plugin@0.2.0;"),
                "{lang:?}"
            );
            assert!(file("test/class-typo.yaml").is_some(), "{lang:?}");
            let readme = file("README.md").unwrap();
            assert!(
                readme.contains("wasm-provisioner:plugin@0.2.0")
                    && readme.contains("## Capabilities"),
                "{lang:?}: {readme}"
            );
        }
        let files = project_files("g", Lang::Python, None).unwrap();
        assert!(files.iter().any(|f| f.0 == "sdk/wasm_provisioner_world.py"));
        let files = project_files("g", Lang::Js, None).unwrap();
        let world = &files.iter().find(|f| f.0 == "world.wit").unwrap().1;
        assert!(world.contains("include wasm-provisioner:plugin/plugin@0.2.0;"));
    }

    #[test]
    fn the_rust_template_depends_on_the_sdk_by_tag_or_by_path() {
        let files = project_files("g", Lang::Rust, None).unwrap();
        let cargo = &files.iter().find(|f| f.0 == "Cargo.toml").unwrap().1;
        assert!(
            cargo.contains(&format!("tag = \"v{}\" }}\n", env!("CARGO_PKG_VERSION"))),
            "{cargo}"
        );
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/sdk");
        let files = project_files("g", Lang::Rust, Some(&sdk)).unwrap();
        let cargo = &files.iter().find(|f| f.0 == "Cargo.toml").unwrap().1;
        assert!(
            cargo.contains("wasm-provisioner-sdk = { path = "),
            "{cargo}"
        );
    }

    #[test]
    fn bad_input_is_refused_with_what_to_do() {
        let error = project_files("My_Guest", Lang::Rust, None).unwrap_err();
        assert!(error.to_string().contains("not a module name"), "{error}");
        let error = project_files("g", Lang::Rust, Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(error.to_string().contains("guests/sdk"), "{error}");
        let error = project_files("g", Lang::Python, Some(Path::new("/x"))).unwrap_err();
        assert!(error.to_string().contains("--lang rust only"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), "").unwrap();
        let error = create("g", Lang::Js, dir.path(), None).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }

    #[test]
    fn the_js_package_json_pins_what_the_lock_pins() {
        let package: serde_json::Value = serde_json::from_str(&js_package_json("g")).unwrap();
        assert_eq!(package["name"], "g");
        assert_eq!(
            package["dependencies"]["@bytecodealliance/componentize-js"],
            "0.23.0"
        );
    }
}
