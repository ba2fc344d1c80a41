//! The install artefacts under `deploy/` as an admin uses them: the pinned tools
//! (`deploy/tools.sh`: helm, kustomize, crane), rendering the Helm chart and the kustomize
//! base, the image tarball (`deploy/image/build.sh`), and applying rendered objects to the
//! API server (server-side apply, for real or as a dry run).
//!
//! A missing or failing tool is a test failure with the tool's own output, never a skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::Value;

use crate::cluster::repo_root;

/// The field manager of every apply the tests make.
pub const FIELD_MANAGER: &str = "wasm-provisioner-install-test";

/// Runs a command and returns its stdout; a failure names the command and shows stderr.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !output.status.success() {
        bail!(
            "{shown} failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Like [`run`], but a failure is returned as its stderr (for tests of error messages).
pub fn run_expecting_failure(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if output.status.success() {
        bail!(
            "{shown} succeeded but should have failed; its output:\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The path of a pinned tool (`crane`, `helm`, `kustomize`, `oras`), built by `deploy/tools.sh` on
/// first use and cached outside the repository.
/// Built once per test process (tests run in parallel threads).
pub fn tool(name: &str) -> PathBuf {
    static TOOLS: std::sync::Mutex<BTreeMap<String, PathBuf>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut tools = TOOLS.lock().unwrap_or_else(|e| e.into_inner());
    tools
        .entry(name.to_string())
        .or_insert_with(|| build_tool(name))
        .clone()
}

fn build_tool(name: &str) -> PathBuf {
    let script = repo_root().join("deploy/tools.sh");
    let out = run(Command::new("bash").arg(&script).arg(name))
        .unwrap_or_else(|error| panic!("building the pinned {name} failed: {error:#}"));
    let path = PathBuf::from(out.trim());
    assert!(
        path.is_file(),
        "deploy/tools.sh {name} printed {path:?}, which is not a file"
    );
    path
}

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("deploy/helm/wasm-provisioner")
}

/// Fills `deploy/modules/` (and so the chart's `modules/`, a link to it) with the built
/// bundled guests, as `bash deploy/modules.sh` does for an admin.
/// Runs once per test process.
pub fn prepare_modules() -> PathBuf {
    static MODULES: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODULES
        .get_or_init(|| {
            let out = run(Command::new("bash").arg(repo_root().join("deploy/modules.sh")))
                .unwrap_or_else(|error| panic!("deploy/modules.sh failed: {error:#}"));
            PathBuf::from(out.trim().lines().last().unwrap_or_default())
        })
        .clone()
}

/// `helm template RELEASE deploy/helm/wasm-provisioner -n NAMESPACE ARGS...`, with the
/// test control plane's Kubernetes version, parsed into objects.
pub fn helm_template(release: &str, namespace: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let text = run(&mut helm_template_command(release, namespace, args))?;
    parse_documents(&text)
}

/// The `helm template` command (for tests that expect it to fail).
pub fn helm_template_command(release: &str, namespace: &str, args: &[&str]) -> Command {
    let mut command = Command::new(tool("helm"));
    command
        .arg("template")
        .arg(release)
        .arg(chart_dir())
        .args(["--namespace", namespace])
        .arg(format!(
            "--kube-version={}",
            crate::cluster::pinned_kubernetes_version()
        ))
        .args(args);
    command
}

/// `kustomize build DIR` (relative to the repository root), parsed into objects.
pub fn kustomize_build(dir: &str) -> anyhow::Result<Vec<Value>> {
    let text = run(Command::new(tool("kustomize"))
        .arg("build")
        .arg(repo_root().join(dir)))?;
    parse_documents(&text)
}

/// Every non-empty document of a multi-document YAML stream.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)
            .context("a rendered document is not valid YAML")?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// The objects of `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The one object of `kind` (panics if there is not exactly one).
pub fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}

/// `kind/namespace/name` of an object, for messages.
pub fn describe(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Server-side apply of `object` (`dry_run`: validated, admitted and defaulted by the API
/// server, stored nowhere: `kubectl apply --server-side --dry-run=server`). Returns the
/// object as the server would store it.
pub async fn apply(client: &Client, object: &Value, dry_run: bool) -> anyhow::Result<Value> {
    let api_version = object["apiVersion"]
        .as_str()
        .with_context(|| format!("{} has no apiVersion", describe(object)))?;
    let kind = object["kind"]
        .as_str()
        .with_context(|| format!("an object has no kind: {object}"))?;
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
    let name = object["metadata"]["name"]
        .as_str()
        .with_context(|| format!("{} has no name", describe(object)))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = object["metadata"]["namespace"].as_str().with_context(|| {
                format!("{} is namespaced but has no namespace", describe(object))
            })?;
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    if dry_run {
        params = params.dry_run();
    }
    let applied = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .with_context(|| {
            format!(
                "the API server refused {}{}",
                describe(object),
                if dry_run {
                    " (server-side dry run)"
                } else {
                    ""
                }
            )
        })?;
    Ok(serde_json::to_value(applied)?)
}

/// What the image tarball says about itself.
#[derive(Debug)]
pub struct Image {
    pub tarball: PathBuf,
    /// `RepoTags` of the tarball's manifest.
    pub tags: Vec<String>,
    /// The image config (`config` of the config blob: User, Entrypoint, Cmd, Labels...).
    pub config: Value,
    /// The whole config blob (os, architecture, rootfs...).
    pub config_blob: Value,
    /// The layer tarballs, in order, extracted next to the image.
    pub layers: Vec<PathBuf>,
}

/// Builds the image tarball from `binary` with `deploy/image/build.sh` into `dir`, and
/// reads its manifest and config.
pub fn build_image(binary: &Path, dir: &Path) -> anyhow::Result<Image> {
    let tarball = dir.join("wasm-provisioner-image.tar");
    run(Command::new("bash")
        .arg(repo_root().join("deploy/image/build.sh"))
        .arg(binary)
        .arg(&tarball))?;
    read_image(&tarball, dir)
}

/// Reads an image tarball (`docker save`'s layout, as deploy/image/build.sh and `crane
/// pull` write it): unpacks it into `dir/image` and reads its manifest and config.
pub fn read_image(tarball: &Path, dir: &Path) -> anyhow::Result<Image> {
    let tarball = tarball.to_path_buf();
    let unpacked = dir.join("image");
    std::fs::create_dir_all(&unpacked)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked))?;
    let manifest: Value = serde_json::from_slice(&std::fs::read(unpacked.join("manifest.json"))?)?;
    let entry = &manifest[0];
    let config_blob: Value = serde_json::from_slice(&std::fs::read(
        unpacked.join(entry["Config"].as_str().context("manifest has no Config")?),
    )?)?;
    Ok(Image {
        tarball,
        tags: entry["RepoTags"]
            .as_array()
            .map(|tags| {
                tags.iter()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        config: config_blob["config"].clone(),
        layers: entry["Layers"]
            .as_array()
            .context("manifest has no Layers")?
            .iter()
            .filter_map(|l| l.as_str().map(|l| unpacked.join(l)))
            .collect(),
        config_blob,
    })
}

/// Unpacks the image's layers, in order, into `rootfs` (what a container runtime does
/// before it starts a container).
pub fn unpack_rootfs(image: &Image, rootfs: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(rootfs)?;
    for layer in &image.layers {
        run(Command::new("tar")
            .arg("-xzf")
            .arg(layer)
            .arg("-C")
            .arg(rootfs)
            .arg("--numeric-owner"))?;
    }
    Ok(())
}

/// `objects` (a render of the install, in namespace `from`) moved into a test's
/// `namespace`, so that runs side by side never meet: every object of `from`, and every
/// subject of `from`, in `namespace`; every cluster-scoped object (ClusterRoles, their
/// bindings, classes, the CSIDriver) renamed with the suffix `-NAMESPACE`, the roleRefs
/// following, and owned by the Namespace object `namespace_uid` so the garbage collector
/// removes it with the namespace should the test fail before it does.
pub fn into_namespace(
    objects: &[Value],
    from: &str,
    namespace: &str,
    namespace_uid: &str,
) -> Vec<Value> {
    let owner = serde_json::json!([{
        "apiVersion": "v1", "kind": "Namespace", "name": namespace, "uid": namespace_uid,
    }]);
    let renamed =
        |name: &Value| Value::String(format!("{}-{namespace}", name.as_str().unwrap_or("")));
    objects
        .iter()
        .filter(|object| object["kind"] != "Namespace")
        .map(|object| {
            let mut object = object.clone();
            let metadata = &mut object["metadata"];
            match metadata["namespace"].as_str() {
                Some(n) if n == from => metadata["namespace"] = Value::String(namespace.into()),
                Some(_) => {}
                None => {
                    metadata["name"] = renamed(&metadata["name"]);
                    metadata["ownerReferences"] = owner.clone();
                }
            }
            // (`get_mut`: indexing a missing key mutably would add it, as null.)
            if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
                for subject in subjects {
                    if subject["namespace"] == from {
                        subject["namespace"] = Value::String(namespace.into());
                    }
                }
            }
            if object["roleRef"]["kind"] == "ClusterRole" {
                object["roleRef"]["name"] = renamed(&object["roleRef"]["name"]);
            }
            object
        })
        .collect()
}
