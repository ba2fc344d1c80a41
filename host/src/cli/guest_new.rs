//! `wasm-provisioner guest new NAME --lang rust|python|js`: a buildable guest project
//! outside this repository.
//!
//! Every template (in `guests/templates/`, embedded in the binary) holds the contract
//! vendored at this host's version (`wit/provisioner.wit`, contract 0.2), a plugin that
//! makes one directory per volume, deletes it in bounded, resumable chunks and has the
//! optional capability `validate-class` (with `expand` commented out, to show how a
//! capability is added), `build.sh` (to `dist/NAME.wasm`), `test.sh` (builds, then runs
//! the module in the offline runner with a real granted directory), the classes and
//! claims the test uses, and a README.
//!
//! The SDK is a dependency on the versioned package, `wasm-provisioner-sdk` at this
//! host's version, from its registry: the crate (crates.io) in `Cargo.toml`, the wheel
//! (PyPI) in `requirements.txt`, the npm package in `package.json` and its lock, so an
//! upgrade is a version change. `--sdk-path` names a local SDK instead, for development
//! or without the registry: a crate directory (a clone's `guests/sdk`, or a `.crate`
//! unpacked), a wheel (`.whl`) or the Python SDK's source directory, an `npm pack`
//! tarball (`.tgz`); `guests/package-sdks.sh` makes all of them.

use std::path::{Path, PathBuf};

/// The name of the SDK package in every registry (crates.io, PyPI, npm); its version
/// is this host's.
pub const SDK_PACKAGE: &str = "wasm-provisioner-sdk";

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
    #[error("--sdk-path {path}: {problem}")]
    BadSdkPath { path: PathBuf, problem: String },
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
/// componentize-py, pinned: the new project's `build-requirements.txt`.
const PY_BUILD_REQUIREMENTS: &str = include_str!("../../../guests/python/requirements.txt");

const JS_APP: &str = include_str!("../../../guests/templates/js/app.js");
const JS_BUILD: &str = include_str!("../../../guests/templates/js/build.sh");
/// componentize-js and what it needs, pinned: the start of the new project's lock.
const JS_LOCK: &str = include_str!("../../../guests/js/package-lock.json");
/// The SDK's npm manifest: its peer dependencies and bin, for the lock's entry.
const JS_SDK_PACKAGE: &str = include_str!("../../../guests/js/sdk/package.json");

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
    let sdk = match sdk_path {
        Some(path) => Some(local_sdk(lang, path)?),
        None => None,
    };
    let (lang_name, main_file, test_what, extra, toolchain, native_test, howto) = match lang {
        Lang::Rust => (
            "Rust",
            "`src/lib.rs`",
            "runs the unit tests natively (`cargo test`), builds, then runs the module in the offline runner",
            "| `Cargo.toml` | the crate (a `cdylib`) and its dependency on the SDK crate `wasm-provisioner-sdk` |\n",
            "`build.sh` adds the `wasm32-wasip2` target with rustup if missing and runs `cargo \
             build --release --target wasm32-wasip2`. `cargo test` runs the plugin natively \
             (the SDK's `testing` builds requests)."
                .to_string(),
            "cargo test --quiet\n",
            "implement the trait (`Expander`, `CapacityReporter`, `ClassValidator`) and name \
             the capability in `export!` (`capabilities: [validate_class, expand]`).",
        ),
        Lang::Python => (
            "Python",
            "`src/app.py`",
            "builds, then runs the module in the offline runner",
            "| `requirements.txt` | what the plugin needs at run time, bundled into the component: the SDK `wasm-provisioner-sdk`, pinned |\n\
             | `build-requirements.txt` | the build's toolchain: componentize-py, pinned |\n",
            "`build.sh` installs componentize-py (pinned in `build-requirements.txt`) into \
             `.venv` on first use (`COMPONENTIZE_PY_VENV` names another venv), the plugin's \
             dependencies (`requirements.txt`) into `.deps` with `pip install --target` (again \
             when the file changes), writes the world the plugin is built for (`python -m \
             wasm_provisioner_world`, from the SDK: contract 0.2's `plugin` world plus an \
             export per capability method the plugin class defines) and runs \
             `componentize-py -d WORLD_DIR -w guest componentize -p src -p .deps app`. Python \
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
            "| `package.json`, `package-lock.json` | the SDK `wasm-provisioner-sdk` (with its build, `componentize.mjs`) and componentize-js, pinned |\n",
            "`build.sh` runs `npm ci` on first use and when the lock changes \
             (`NODE_MODULES_DIR` names a `node_modules` installed from the same lock, linked \
             instead) and `node node_modules/wasm-provisioner-sdk/componentize.mjs app.js \
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
    let sdk_dependency = rust_sdk_dependency(sdk.as_deref(), version);
    let sdk_howto = sdk_howto(lang, sdk.as_deref(), version);
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
            .replace("{{sdk_howto}}", &sdk_howto)
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
            (
                "requirements.txt",
                python_requirements(sdk.as_deref(), version),
                false,
            ),
            (
                "build-requirements.txt",
                PY_BUILD_REQUIREMENTS.to_string(),
                false,
            ),
            ("build.sh", fill(PY_BUILD), true),
            (
                ".gitignore",
                "/.venv/\n/.deps/\n/dist/\n__pycache__/\n".to_string(),
                false,
            ),
        ]),
        Lang::Js => {
            let spec = js_sdk_spec(sdk.as_deref(), version);
            files.extend([
                ("app.js", fill(JS_APP), false),
                ("package.json", js_package_json(name, &spec), false),
                (
                    "package-lock.json",
                    js_package_lock(name, &spec, version),
                    false,
                ),
                ("build.sh", fill(JS_BUILD), true),
                (".gitignore", "/node_modules\n/dist/\n".to_string(), false),
            ])
        }
    }
    Ok(files)
}

/// Checks a `--sdk-path` for `lang` and makes it absolute: a crate directory (Rust), a
/// wheel or the SDK's source directory (Python), an `npm pack` tarball (JavaScript).
fn local_sdk(lang: Lang, path: &Path) -> Result<PathBuf, GuestNewError> {
    let bad = |problem: &str| GuestNewError::BadSdkPath {
        path: path.to_path_buf(),
        problem: problem.to_string(),
    };
    let absolute = std::path::absolute(path).map_err(|e| bad(&e.to_string()))?;
    let file_name = absolute
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let names_the_sdk = |file: &str, needle: &str| {
        std::fs::read_to_string(absolute.join(file)).is_ok_and(|text| text.contains(needle))
    };
    let ok = match lang {
        Lang::Rust => names_the_sdk("Cargo.toml", "name = \"wasm-provisioner-sdk\""),
        Lang::Python if absolute.is_dir() => {
            names_the_sdk("pyproject.toml", "name = \"wasm-provisioner-sdk\"")
        }
        Lang::Python => {
            file_name.starts_with("wasm_provisioner_sdk-") && file_name.ends_with(".whl")
        }
        Lang::Js => file_name.starts_with("wasm-provisioner-sdk-") && file_name.ends_with(".tgz"),
    };
    if !ok || !absolute.exists() {
        return Err(bad(match lang {
            Lang::Rust => {
                "no Cargo.toml of the wasm-provisioner-sdk crate there: pass a crate directory \
                 (a clone's guests/sdk, or a .crate unpacked by guests/package-sdks.sh)"
            }
            Lang::Python => {
                "not a wasm_provisioner_sdk-VERSION-py3-none-any.whl nor a directory with the \
                 pyproject.toml of wasm-provisioner-sdk: pass the wheel guests/package-sdks.sh \
                 builds, or a clone's guests/python/sdk"
            }
            Lang::Js => {
                "not a wasm-provisioner-sdk-VERSION.tgz: pass the tarball guests/package-sdks.sh \
                 makes (npm pack guests/js/sdk)"
            }
        }));
    }
    let text = absolute.to_str().ok_or_else(|| bad("not UTF-8"))?;
    if text
        .chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '#')
    {
        return Err(bad(
            "it holds a space, quote, backslash or `#`, which the package files cannot carry: move it",
        ));
    }
    Ok(absolute)
}

/// The `Cargo.toml` line of the SDK: the version from crates.io, or a local path with it.
fn rust_sdk_dependency(local: Option<&Path>, version: &str) -> String {
    match local {
        Some(path) => format!(
            "# Development form: a local SDK (`guest new --sdk-path`). The released form is\n\
             # {SDK_PACKAGE} = \"{version}\"\n\
             {SDK_PACKAGE} = {{ version = \"{version}\", path = \"{}\" }}",
            path.display()
        ),
        None => format!(
            "# The SDK at this host's version, from crates.io. Upgrade: change the version.\n\
             # A local SDK instead: {SDK_PACKAGE} = {{ version = \"{version}\", path = \"/path/to/guests/sdk\" }}\n\
             {SDK_PACKAGE} = \"{version}\""
        ),
    }
}

/// The new Python project's `requirements.txt`: the SDK wheel, pinned.
fn python_requirements(local: Option<&Path>, version: &str) -> String {
    let requirement = match local {
        Some(path) => format!(
            "# Development form: a local SDK (`guest new --sdk-path`). The released form is\n\
             # {SDK_PACKAGE}=={version}\n\
             {SDK_PACKAGE} @ file://{}",
            path.display()
        ),
        None => format!("{SDK_PACKAGE}=={version}"),
    };
    format!(
        "# What the plugin needs at run time, bundled into the component: build.sh installs\n\
         # it into .deps (pip install --target) and componentize-py reads it from there.\n\
         # The SDK at this host's version; upgrade by changing the pin, then build.sh.\n\
         {requirement}\n"
    )
}

/// The new JavaScript project's dependency on the SDK: the version, or the tarball.
fn js_sdk_spec(local: Option<&Path>, version: &str) -> String {
    match local {
        Some(path) => format!("file:{}", path.display()),
        None => version.to_string(),
    }
}

/// The README's section on the SDK: where it comes from and how to upgrade.
fn sdk_howto(lang: Lang, local: Option<&Path>, version: &str) -> String {
    let (file, declared, upgrade, development) = match lang {
        Lang::Rust => (
            "`Cargo.toml`",
            format!("the crate `{SDK_PACKAGE} = \"{version}\"` (crates.io)"),
            "change the version in `Cargo.toml` (`cargo update -p wasm-provisioner-sdk` picks \
             up a patch release of the same minor version), then `bash test.sh`",
            format!(
                "`{SDK_PACKAGE} = {{ version = \"{version}\", path = \"/path/to/guests/sdk\" }}` \
                 in `Cargo.toml`"
            ),
        ),
        Lang::Python => (
            "`requirements.txt`",
            format!("the wheel `{SDK_PACKAGE}=={version}` (PyPI)"),
            "change the pin in `requirements.txt`, then `bash test.sh` (build.sh reinstalls \
             `.deps` when the file changes)",
            format!(
                "`{SDK_PACKAGE} @ file:///path/to/wasm_provisioner_sdk-{version}-py3-none-any.whl` \
                 in `requirements.txt`"
            ),
        ),
        Lang::Js => (
            "`package.json` and `package-lock.json`",
            format!("the npm package `{SDK_PACKAGE}@{version}`"),
            "`npm install wasm-provisioner-sdk@NEW --save-exact` (updates both files; the new \
             SDK brings its build, `componentize.mjs`), then `bash test.sh`",
            format!(
                "`npm install --save-exact /path/to/{SDK_PACKAGE}-{version}.tgz` (package.json \
                 and the lock)"
            ),
        ),
    };
    let origin = match local {
        Some(path) => format!(
            "This project was made with `--sdk-path`: {file} names the local SDK `{}` \
             (development form); the released form is {declared}.",
            path.display()
        ),
        None => format!("{file} names {declared}, the SDK of the host this project was made with."),
    };
    format!(
        "{origin} The SDK's minor version follows the host's: an SDK 0.1.x plugin speaks \
         contract 0.2 (`wit/provisioner.wit`) and runs on every host that serves it. \
         Upgrade: {upgrade}. A local SDK (a clone's, during development): {development}, \
         or a new project with `wasm-provisioner guest new --sdk-path` (`guests/package-sdks.sh` \
         in the repository makes the packages)."
    )
}

fn js_package_json(name: &str, sdk_spec: &str) -> String {
    let lock: serde_json::Value =
        serde_json::from_str(JS_LOCK).expect("guests/js/package-lock.json is JSON");
    let mut dependencies = lock["packages"][""]["dependencies"].clone();
    dependencies[SDK_PACKAGE] = serde_json::Value::from(sdk_spec);
    let package = serde_json::json!({
        "name": name,
        "private": true,
        "type": "module",
        "dependencies": dependencies,
    });
    serde_json::to_string_pretty(&package).expect("JSON") + "\n"
}

/// The repository's lock of componentize-js with the project's name and an entry for
/// the SDK (`resolved` from the registry or the tarball; `npm ci` installs exactly it).
fn js_package_lock(name: &str, sdk_spec: &str, version: &str) -> String {
    let mut lock: serde_json::Value =
        serde_json::from_str(JS_LOCK).expect("guests/js/package-lock.json is JSON");
    let sdk: serde_json::Value =
        serde_json::from_str(JS_SDK_PACKAGE).expect("guests/js/sdk/package.json is JSON");
    lock["name"] = name.into();
    let root = &mut lock["packages"][""];
    root["name"] = name.into();
    if let Some(root) = root.as_object_mut() {
        root.remove("license");
    }
    root["dependencies"][SDK_PACKAGE] = sdk_spec.into();
    let resolved = match sdk_spec.strip_prefix("file:") {
        Some(_) => sdk_spec.to_string(),
        None => format!("https://registry.npmjs.org/{SDK_PACKAGE}/-/{SDK_PACKAGE}-{version}.tgz"),
    };
    lock["packages"][format!("node_modules/{SDK_PACKAGE}")] = serde_json::json!({
        "version": version,
        "resolved": resolved,
        "license": sdk["license"],
        "bin": sdk["bin"],
        "engines": sdk["engines"],
        "peerDependencies": sdk["peerDependencies"],
    });
    serde_json::to_string_pretty(&lock).expect("JSON") + "\n"
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
                    && readme.contains("## Capabilities")
                    && readme.contains("## The SDK: a versioned package")
                    && readme.contains("Upgrade: "),
                "{lang:?}: {readme}"
            );
            // No copy of an SDK in the project: it is a dependency.
            assert!(
                !files.iter().any(|f| f.0.starts_with("sdk/")
                    || f.0 == "componentize.mjs"
                    || f.0 == "world.wit"),
                "{lang:?}"
            );
        }
        let files = project_files("g", Lang::Python, None).unwrap();
        let build = &files
            .iter()
            .find(|f| f.0 == "build-requirements.txt")
            .unwrap()
            .1;
        assert!(build.contains("componentize-py=="), "{build}");
    }

    /// Every SDK package is at the host's version, so `guest new` names packages that
    /// exist together.
    #[test]
    fn the_sdk_packages_are_at_the_hosts_version() {
        let version = env!("CARGO_PKG_VERSION");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let guests = std::fs::read_to_string(repo.join("guests/Cargo.toml")).unwrap();
        assert!(
            guests.contains(&format!("\nversion = \"{version}\"\n")),
            "guests/Cargo.toml"
        );
        let pyproject =
            std::fs::read_to_string(repo.join("guests/python/sdk/pyproject.toml")).unwrap();
        assert!(
            pyproject.contains(&format!("\nversion = \"{version}\"\n")),
            "pyproject.toml"
        );
        let npm: serde_json::Value = serde_json::from_str(JS_SDK_PACKAGE).unwrap();
        assert_eq!(npm["version"], version);
        assert_eq!(npm["name"], SDK_PACKAGE);
    }

    #[test]
    fn new_projects_depend_on_the_versioned_sdk_package() {
        let version = env!("CARGO_PKG_VERSION");
        let file = |lang, name: &str| {
            let files = project_files("g", lang, None).unwrap();
            files.into_iter().find(|f| f.0 == name).unwrap().1
        };
        let cargo = file(Lang::Rust, "Cargo.toml");
        assert!(
            cargo.contains(&format!("\nwasm-provisioner-sdk = \"{version}\"\n")),
            "{cargo}"
        );
        assert!(
            !cargo.contains("git =") && !cargo.contains("\nwasm-provisioner-sdk = {"),
            "{cargo}"
        );
        let requirements = file(Lang::Python, "requirements.txt");
        assert!(
            requirements.contains(&format!("\nwasm-provisioner-sdk=={version}\n")),
            "{requirements}"
        );
        let package: serde_json::Value =
            serde_json::from_str(&file(Lang::Js, "package.json")).unwrap();
        assert_eq!(package["dependencies"]["wasm-provisioner-sdk"], version);
        let lock: serde_json::Value =
            serde_json::from_str(&file(Lang::Js, "package-lock.json")).unwrap();
        assert_eq!(lock["name"], "g");
        assert_eq!(
            lock["packages"][""]["dependencies"],
            package["dependencies"]
        );
        let entry = &lock["packages"]["node_modules/wasm-provisioner-sdk"];
        assert_eq!(entry["version"], version);
        assert_eq!(
            entry["resolved"],
            format!(
                "https://registry.npmjs.org/wasm-provisioner-sdk/-/wasm-provisioner-sdk-{version}.tgz"
            )
        );
        assert_eq!(
            entry["peerDependencies"]["@bytecodealliance/componentize-js"],
            package["dependencies"]["@bytecodealliance/componentize-js"],
            "the SDK's build and the project pin the same componentize-js"
        );
        let app = file(Lang::Js, "app.js");
        assert!(app.contains("from 'wasm-provisioner-sdk';"), "{app}");
    }

    #[test]
    fn sdk_path_names_a_local_package_of_each_language() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests");
        let file = |lang, path: &Path, name: &str| {
            let files = project_files("g", lang, Some(path)).unwrap();
            files.into_iter().find(|f| f.0 == name).unwrap().1
        };
        let cargo = file(Lang::Rust, &repo.join("sdk"), "Cargo.toml");
        assert!(
            cargo.contains("wasm-provisioner-sdk = { version = \"0.1.0\", path = \"/"),
            "{cargo}"
        );
        let requirements = file(Lang::Python, &repo.join("python/sdk"), "requirements.txt");
        assert!(
            requirements.contains("\nwasm-provisioner-sdk @ file:///"),
            "{requirements}"
        );
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir
            .path()
            .join("wasm_provisioner_sdk-0.1.0-py3-none-any.whl");
        let tarball = dir.path().join("wasm-provisioner-sdk-0.1.0.tgz");
        std::fs::write(&wheel, "").unwrap();
        std::fs::write(&tarball, "").unwrap();
        let requirements = file(Lang::Python, &wheel, "requirements.txt");
        assert!(
            requirements.contains(&format!(
                "wasm-provisioner-sdk @ file://{}\n",
                wheel.display()
            )),
            "{requirements}"
        );
        let package: serde_json::Value =
            serde_json::from_str(&file(Lang::Js, &tarball, "package.json")).unwrap();
        let spec = format!("file:{}", tarball.display());
        assert_eq!(
            package["dependencies"]["wasm-provisioner-sdk"],
            spec.as_str()
        );
        let lock: serde_json::Value =
            serde_json::from_str(&file(Lang::Js, &tarball, "package-lock.json")).unwrap();
        assert_eq!(
            lock["packages"]["node_modules/wasm-provisioner-sdk"]["resolved"],
            spec.as_str()
        );
        let readme = file(Lang::Js, &tarball, "README.md");
        assert!(readme.contains("made with `--sdk-path`"), "{readme}");
    }

    #[test]
    fn bad_input_is_refused_with_what_to_do() {
        let error = project_files("My_Guest", Lang::Rust, None).unwrap_err();
        assert!(error.to_string().contains("not a module name"), "{error}");
        let error = project_files("g", Lang::Rust, Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(error.to_string().contains("guests/sdk"), "{error}");
        let error = project_files("g", Lang::Python, Some(Path::new("/x.tgz"))).unwrap_err();
        assert!(error.to_string().contains(".whl"), "{error}");
        let error = project_files("g", Lang::Js, Some(Path::new("/x.whl"))).unwrap_err();
        assert!(error.to_string().contains("npm pack"), "{error}");
        let missing = Path::new("/nonexistent/wasm-provisioner-sdk-0.1.0.tgz");
        let error = project_files("g", Lang::Js, Some(missing)).unwrap_err();
        assert!(
            error.to_string().contains("--sdk-path /nonexistent"),
            "{error}"
        );
        let dir = tempfile::tempdir().unwrap();
        let spaced = dir.path().join("a b");
        std::fs::create_dir(&spaced).unwrap();
        std::fs::write(spaced.join("Cargo.toml"), "name = \"wasm-provisioner-sdk\"").unwrap();
        let error = project_files("g", Lang::Rust, Some(&spaced)).unwrap_err();
        assert!(error.to_string().contains("move it"), "{error}");
        std::fs::write(dir.path().join("x"), "").unwrap();
        let error = create("g", Lang::Js, dir.path(), None).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }
}
