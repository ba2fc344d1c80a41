//! The release (deploy/release.sh, docs/release.md), installed as a user would, from its
//! artifacts alone: a local registry (crane's, disk-backed) receives what the script
//! pushes; the test then checks the artifacts as docs/release.md tells a user to (the
//! checksums, the cosign signatures, a tampered file refused), the image index (both
//! platforms, the arm64 binary an aarch64 ELF with its loader and libraries in the
//! image, run under qemu's AArch64 user-mode emulation), the SBOM, the modules as wasm OCI artifacts, and the chart pulled from the
//! registry (its image and modules named by digest, in the registry, with the release's
//! public key), and runs the chart's Deployment, at its defaults, from the image pulled
//! from the registry as kubelet would: the host pulls the modules from the registry,
//! checks their signatures against the release's key, serves the released bytes, and a
//! claim is Bound and its volume deleted. No source toolchain is on that path: the
//! binary is the image's, the modules are the registry's. The script's arm64 cross build
//! is cold on a first run (CI's release step, before the tests, warms it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use sha2::Digest as _;
use wasm_provisioner_tests::cluster::{
    TestContext, admin_kubeconfig, random_suffix, repo_root, service_account_token, wait_for,
};
use wasm_provisioner_tests::install::{
    apply, of_kind, one, parse_documents, read_image, run, run_expecting_failure, tool,
};
use wasm_provisioner_tests::kubelet::{Cluster, Pod, PodSpec};
use wasm_provisioner_tests::registry::Registry;

const WAIT: Duration = Duration::from_secs(90);

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    serde_json::from_slice(&std::fs::read(path).with_context(|| format!("reading {path:?}"))?)
        .with_context(|| format!("parsing {path:?}"))
}

/// `e_machine` of an ELF file: 62 x86-64, 183 AArch64.
fn elf_machine(path: &Path) -> anyhow::Result<u16> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path:?}"))?;
    ensure!(
        bytes.len() > 20 && bytes.starts_with(b"\x7fELF") && bytes[4] == 2 && bytes[5] == 1,
        "{path:?} is not a 64-bit little-endian ELF file"
    );
    Ok(u16::from_le_bytes([bytes[18], bytes[19]]))
}

/// Every file the release wrote is in SHA256SUMS with its hash, and nothing else is.
fn check_checksums(out: &Path) -> anyhow::Result<usize> {
    let sums = std::fs::read_to_string(out.join("SHA256SUMS"))?;
    let mut listed = BTreeMap::new();
    for line in sums.lines() {
        let (hash, name) = line
            .split_once("  ")
            .with_context(|| format!("SHA256SUMS line {line:?} is not `HASH  NAME`"))?;
        let actual = sha256_hex(&std::fs::read(out.join(name))?);
        ensure!(
            actual == hash,
            "{name}: SHA256SUMS says {hash}, the file is {actual}"
        );
        listed.insert(name.to_string(), hash.to_string());
    }
    let mut files = Vec::new();
    let mut dirs = vec![out.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path.strip_prefix(out)?.display().to_string());
            }
        }
    }
    for file in &files {
        ensure!(
            listed.contains_key(file) || file == "SHA256SUMS" || file == "SHA256SUMS.sig",
            "{file} is in the release but not in SHA256SUMS"
        );
    }
    Ok(listed.len())
}

/// The image layout: its index is the pushed one and holds linux/amd64 and linux/arm64,
/// each manifest's config saying the same platform.
fn check_layout(out: &Path, release: &Value, dir: &Path) -> anyhow::Result<()> {
    let version = release["version"].as_str().context("version")?;
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(out.join(format!("wasm-provisioner-image-{version}.oci.tar")))
        .arg("-C")
        .arg(&layout))?;
    let blob = |digest: &str| -> anyhow::Result<Value> {
        let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
        let path = layout.join("blobs/sha256").join(hex);
        let bytes =
            std::fs::read(&path).with_context(|| format!("the layout has no blob {digest}"))?;
        ensure!(
            sha256_hex(&bytes) == hex,
            "blob {digest} does not hash to its name"
        );
        Ok(serde_json::from_slice(&bytes)?)
    };
    let top = read_json(&layout.join("index.json"))?;
    let reference = release["image"]["reference"].as_str().context("image")?;
    let digest = reference.split_once('@').context("image by digest")?.1;
    let entry = top["manifests"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["digest"] == digest))
        .with_context(|| {
            format!("the layout's index.json does not name the pushed index {digest}: {top}")
        })?;
    ensure!(
        entry["mediaType"] == "application/vnd.oci.image.index.v1+json",
        "the layout's entry is not an OCI index: {entry}"
    );
    let index = blob(digest)?;
    let mut platforms = Vec::new();
    for manifest in index["manifests"].as_array().context("manifests")? {
        let platform = format!(
            "{}/{}",
            manifest["platform"]["os"].as_str().unwrap_or(""),
            manifest["platform"]["architecture"].as_str().unwrap_or("")
        );
        ensure!(
            release["image"]["platforms"][&platform] == manifest["digest"],
            "the index's {platform} is {}, release.json says {}",
            manifest["digest"],
            release["image"]["platforms"][&platform]
        );
        let image = blob(manifest["digest"].as_str().context("digest")?)?;
        let config = blob(image["config"]["digest"].as_str().context("config")?)?;
        ensure!(
            format!(
                "{}/{}",
                config["os"].as_str().unwrap_or(""),
                config["architecture"].as_str().unwrap_or("")
            ) == platform,
            "the {platform} manifest's config says {}/{}",
            config["os"],
            config["architecture"]
        );
        platforms.push(platform);
    }
    platforms.sort();
    ensure!(
        platforms == ["linux/amd64", "linux/arm64"],
        "the index holds {platforms:?}, not linux/amd64 and linux/arm64"
    );
    Ok(())
}

/// Pulls one platform's image from the registry as a tarball and unpacks its root
/// filesystem.
fn pull_platform(
    reference: &str,
    platform: &str,
    dir: &Path,
) -> anyhow::Result<(wasm_provisioner_tests::install::Image, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let tarball = dir.join("image.tar");
    run(Command::new(tool("crane"))
        .args(["pull", "--insecure", "--platform", platform, reference])
        .arg(&tarball))?;
    let mut image = read_image(&tarball, dir)?;
    // Pulled by digest, the tarball's tag is crane's placeholder; the reference it was
    // pulled by is the name a container runtime knows it by.
    image.tags.push(reference.to_string());
    let rootfs = dir.join("rootfs");
    wasm_provisioner_tests::install::unpack_rootfs(&image, &rootfs)?;
    Ok((image, rootfs))
}

/// The modules in the registry: wasm OCI artifacts whose one layer is the released file.
fn check_modules(out: &Path, release: &Value) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut modules = BTreeMap::new();
    for (name, reference) in release["modules"].as_object().context("modules")? {
        let reference = reference.as_str().context("a reference")?;
        let manifest: Value = serde_json::from_str(&run(Command::new(tool("crane")).args([
            "manifest",
            "--insecure",
            reference,
        ]))?)?;
        ensure!(
            manifest["config"]["mediaType"] == "application/vnd.wasm.config.v0+json",
            "{reference}: config {}",
            manifest["config"]
        );
        let layers = manifest["layers"].as_array().context("layers")?;
        ensure!(
            layers.len() == 1 && layers[0]["mediaType"] == "application/wasm",
            "{reference}: layers {layers:?}, not one application/wasm"
        );
        let released = std::fs::read(out.join("modules").join(format!("{name}.wasm")))?;
        ensure!(
            layers[0]["digest"] == format!("sha256:{}", sha256_hex(&released)),
            "{reference}: its layer {} is not modules/{name}.wasm",
            layers[0]["digest"]
        );
        // The bytes a user pulls, from the registry alone.
        let repository = reference.split_once('@').context("by digest")?.0;
        let output = Command::new(tool("crane"))
            .args(["blob", "--insecure"])
            .arg(format!(
                "{repository}@{}",
                layers[0]["digest"].as_str().unwrap_or("")
            ))
            .output()?;
        ensure!(
            output.status.success(),
            "crane blob {reference}: {output:?}"
        );
        ensure!(
            output.stdout == released,
            "{reference}: the pulled layer differs"
        );
        ensure!(
            output.stdout.starts_with(b"\0asm"),
            "{reference}: the layer is not WebAssembly"
        );
        modules.insert(format!("{name}.wasm"), output.stdout);
    }
    ensure!(
        modules.len() == 2,
        "release.json names {} modules, not 2",
        modules.len()
    );
    Ok(modules)
}

/// The port-forward command the install's NOTES print: a Service the chart renders, its
/// port, run in the background so the `curl` after it runs (a port-forward in the
/// foreground never returns), and valid shell.
fn check_notes(
    package: &Path,
    release: &str,
    namespace: &str,
    objects: &[Value],
) -> anyhow::Result<()> {
    let printed = run(Command::new(tool("helm"))
        .args(["install", release])
        .arg(package)
        .args(["--dry-run=client", "--namespace", namespace]))?;
    let notes = printed
        .split_once("NOTES:")
        .context("helm install --dry-run printed no NOTES")?
        .1;
    let line = notes
        .lines()
        .find(|l| l.contains("kubectl") && l.contains(" port-forward "))
        .with_context(|| format!("the NOTES have no port-forward command:\n{notes}"))?
        .trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "port-forward")
        .with_context(|| format!("no port-forward word in {line:?}"))?;
    let (target, ports) = (words[at + 1], words[at + 2]);
    let service = target
        .strip_prefix("svc/")
        .with_context(|| format!("the NOTES forward {target}, not the metrics Service"))?;
    let (local, remote) = ports.split_once(':').context("LOCAL:REMOTE")?;
    let rendered = of_kind(objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == service)
        .with_context(|| format!("the NOTES forward {target}, which the chart does not render"))?;
    ensure!(
        remote.parse::<u64>().ok() == rendered["spec"]["ports"][0]["port"].as_u64(),
        "the NOTES forward port {remote}, {service} serves {}",
        rendered["spec"]["ports"][0]["port"]
    );
    ensure!(
        line.contains(&format!("curl -s localhost:{local}/metrics"))
            && words[at + 3] == ">/dev/null"
            && words[at + 4] == "&",
        "the NOTES' port-forward must run in the background before the curl: {line}"
    );
    run(Command::new("bash").args(["-n", "-c", line]))
        .with_context(|| format!("the NOTES' command is not valid shell: {line}"))?;
    Ok(())
}

fn cosign(args: &[&str]) -> Command {
    let mut command = Command::new(tool("cosign"));
    command.args(args);
    command
}

#[tokio::test]
async fn an_install_from_the_release_artifacts_alone_binds_a_claim() {
    let ctx = TestContext::new("release").await.expect("a namespace");
    let dir = tempfile::Builder::new()
        .prefix("wasm-provisioner-release-")
        .tempdir()
        .unwrap();
    let result = release_scenario(&ctx, dir.path()).await;
    if let Err(error) = &result {
        let kept = dir.keep();
        panic!(
            "{error:?}\n(the test's files are kept in {})",
            kept.display()
        );
    }
    ctx.cleanup().await;
}

async fn release_scenario(ctx: &TestContext, dir: &Path) -> anyhow::Result<()> {
    let registry = Registry::start()?;
    let registry_host = registry.host();
    let out = dir.join("release");
    let started = Instant::now();
    // The amd64 binary is the one the tests run (built by the same command as the
    // script would); the arm64 one is the script's cross build (warm after CI's release
    // step).
    run(Command::new("bash")
        .arg(repo_root().join("deploy/release.sh"))
        .arg(&out)
        .arg(&registry_host)
        .env(
            "WASM_PROVISIONER_BINARY_AMD64",
            wasm_provisioner_tests::host::binary(),
        ))?;
    eprintln!(
        "deploy/release.sh to {} in {:.0}s",
        registry_host,
        started.elapsed().as_secs_f64()
    );
    let release = read_json(&out.join("release.json"))?;
    let version = release["version"].as_str().context("version")?.to_string();
    let image = release["image"]["reference"]
        .as_str()
        .context("image")?
        .to_string();

    // The checksums and the signatures, as docs/release.md verifies them.
    let files = check_checksums(&out)?;
    ensure!(files >= 7, "SHA256SUMS lists {files} files");
    let key = out.join("cosign.pub");
    let key = key.to_str().unwrap();
    let sums = out.join("SHA256SUMS");
    let signature = out.join("SHA256SUMS.sig");
    let verify_blob = |file: &Path| {
        cosign(&[
            "verify-blob",
            "--key",
            key,
            "--insecure-ignore-tlog=true",
            "--signature",
            signature.to_str().unwrap(),
            file.to_str().unwrap(),
        ])
    };
    run(&mut verify_blob(&sums))?;
    let tampered = dir.join("SHA256SUMS.tampered");
    std::fs::write(
        &tampered,
        std::fs::read_to_string(&sums)?.replacen('0', "1", 1),
    )?;
    run_expecting_failure(&mut verify_blob(&tampered))
        .context("a tampered SHA256SUMS must fail its signature")?;
    let chart_ref = format!(
        "{}/charts/wasm-provisioner@{}",
        registry_host,
        release["chart"]["digest"]
            .as_str()
            .context("chart digest")?
    );
    let mut signed = vec![image.clone(), chart_ref];
    for module in release["modules"].as_object().context("modules")?.values() {
        signed.push(module.as_str().context("module")?.to_string());
    }
    for reference in &signed {
        run(&mut cosign(&[
            "verify",
            "--key",
            key,
            "--insecure-ignore-tlog=true",
            "--allow-insecure-registry",
            "--allow-http-registry",
            reference,
        ]))
        .with_context(|| format!("the signature of {reference}"))?;
    }
    eprintln!(
        "{files} files match SHA256SUMS; its signature and {} signatures in the registry verify",
        signed.len()
    );

    // The image: an index of both platforms, in the layout file and in the registry.
    check_layout(&out, &release, dir)?;
    let (_, arm64_root) = pull_platform(&image, "linux/arm64", &dir.join("arm64"))?;
    let binary = arm64_root.join("wasm-provisioner");
    ensure!(
        elf_machine(&binary)? == 183,
        "the arm64 image's /wasm-provisioner is not an AArch64 binary (e_machine {})",
        elf_machine(&binary)?
    );
    for needed in [
        "lib/ld-linux-aarch64.so.1",
        "lib/aarch64-linux-gnu/libc.so.6",
        "lib/aarch64-linux-gnu/libgcc_s.so.1",
    ] {
        let path = arm64_root.join(needed);
        ensure!(path.is_file(), "the arm64 image has no /{needed}");
        ensure!(
            elf_machine(&path)? == 183,
            "the arm64 image's /{needed} is not AArch64"
        );
    }
    // And it runs: under qemu's user-mode AArch64 emulation, with the image's own root
    // as the sysroot (its loader and libraries, nothing of this machine's).
    let qemu = "qemu-aarch64-static";
    let answer = run(Command::new(qemu)
        .arg("-L")
        .arg(&arm64_root)
        .arg(&binary)
        .arg("--version"))
    .with_context(|| {
        format!(
            "running the arm64 binary under {qemu} (Debian's qemu-user-static; .ci/run installs it: apt-get install qemu-user-static)"
        )
    })?;
    ensure!(
        answer.trim() == format!("wasm-provisioner {version}"),
        "the arm64 binary under {qemu} answered {answer:?} to --version"
    );

    // The SBOMs, one per platform: CycloneDX, of the host, naming what it links.
    for platform in ["linux/amd64", "linux/arm64"] {
        let file = release["image"]["sboms"][platform]
            .as_str()
            .with_context(|| format!("release.json names no {platform} SBOM"))?;
        let sbom = read_json(&out.join(file))?;
        ensure!(sbom["bomFormat"] == "CycloneDX", "{file} is not CycloneDX");
        ensure!(
            sbom["metadata"]["component"]["name"] == "wasm-provisioner"
                && sbom["metadata"]["component"]["version"] == version.as_str(),
            "{file} describes {}",
            sbom["metadata"]["component"]
        );
        let components: Vec<&str> = sbom["components"]
            .as_array()
            .context("components")?
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        // And attached to its platform's manifest in the registry.
        let manifest = release["image"]["platforms"][platform]
            .as_str()
            .context("platform digest")?;
        let referrers = run(Command::new(tool("oras"))
            .args(["discover", "--plain-http", "--format", "json"])
            .arg(format!("{registry_host}/wasm-provisioner@{manifest}")))?;
        ensure!(
            referrers.contains("application/vnd.cyclonedx+json"),
            "no SBOM is attached to the {platform} image in the registry: {referrers}"
        );
        for linked in ["wasmtime", "kube-client", "tokio", "rustls"] {
            ensure!(
                components.contains(&linked),
                "{file} does not list {linked} among {} components",
                components.len()
            );
        }
    }

    // The modules: wasm OCI artifacts, the released bytes.
    let modules = check_modules(&out, &release)?;
    let hostpath_sha256 = sha256_hex(modules.get("hostpath.wasm").context("hostpath")?);

    // The chart, from the registry: image and modules by digest, nothing built in.
    let package = out.join(release["chart"]["package"].as_str().context("package")?);
    let listing = run(Command::new("tar").arg("-tzf").arg(&package))?;
    for file in [
        "values.schema.json",
        "README.md",
        "templates/networkpolicy.yaml",
    ] {
        ensure!(
            listing
                .lines()
                .any(|l| l == format!("wasm-provisioner/{file}")),
            "the chart package has no {file}"
        );
    }
    ensure!(
        !listing.contains(".wasm"),
        "the chart package holds modules: {listing}"
    );
    let release_name = format!("wp-{}", random_suffix());
    let pulled = parse_documents(&run(Command::new(tool("helm"))
        .args(["template", &release_name])
        .arg(format!("oci://{}/charts/wasm-provisioner", registry_host))
        .args([
            "--version",
            &version,
            "--plain-http",
            "--namespace",
            &ctx.namespace,
        ])
        .arg(format!(
            "--kube-version={}",
            wasm_provisioner_tests::cluster::pinned_kubernetes_version()
        )))?)?;
    let deployment = one(&pulled, "Deployment");
    ensure!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image.as_str(),
        "the released chart runs {}, not the released image {image}",
        deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    let grants_map = of_kind(&pulled, "ConfigMap")
        .into_iter()
        .find(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .ends_with("-grants")
        })
        .context("a grants ConfigMap")?;
    let grants: Value = serde_yaml::from_str(
        grants_map["data"]["grants.yaml"]
            .as_str()
            .context("grants.yaml")?,
    )?;
    for (name, reference) in release["modules"].as_object().context("modules")? {
        ensure!(
            grants["modules"][name]["source"]["oci"] == *reference,
            "the released chart's grants name {} for {name}, not {reference}",
            grants["modules"][name]["source"]
        );
    }
    for (name, _) in release["modules"].as_object().context("modules")? {
        ensure!(
            grants["modules"][name]["source"]["signatures"]["allOf"][0]["publicKey"]
                == "/etc/wasm-provisioner/keys/release.pub",
            "the released chart does not verify {name} against the release's key: {}",
            grants["modules"][name]["source"]
        );
    }
    let keys = of_kind(&pulled, "ConfigMap")
        .into_iter()
        .find(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .ends_with("-keys")
        })
        .context("the released chart has no signature keys ConfigMap")?;
    ensure!(
        keys["data"]["release.pub"].as_str().map(str::trim)
            == Some(std::fs::read_to_string(out.join("cosign.pub"))?.trim()),
        "the released chart's key is not the release's cosign.pub"
    );
    ensure!(
        grants["registries"][0]["host"] == registry_host.as_str(),
        "the released chart's grants have no entry for the registry: {}",
        grants["registries"]
    );
    eprintln!(
        "the chart from oci://{}/charts names the image and both modules by digest",
        registry_host
    );
    check_notes(&package, &release_name, &ctx.namespace, &pulled)?;

    // Run it: the image from the registry, as kubelet would run it; the chart from its
    // package, at its defaults but for names (the modules pulled by digest from the
    // registry and verified against the release's key, as the released values say).
    let client = &ctx.client;
    let provisioner = format!("{}.release.wasm-provisioner.dev", ctx.namespace);
    let class = format!("wasm-hostpath-{}", ctx.namespace);
    let metrics_port = wasm_provisioner_tests::host::free_port();
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "provisionerName": provisioner,
            "metricsPort": metrics_port,
            "storageClasses": [{ "name": class, "module": "hostpath",
                "volumeBindingMode": "WaitForFirstConsumer",
                "parameters": { "nodePath": "/var/lib/wasm-provisioner/hostpath",
                                "pvType": "local", "onDelete": "delete" } }],
        }))?,
    )?;
    let objects = parse_documents(&run(Command::new(tool("helm"))
        .args(["template", &release_name])
        .arg(&package)
        .args(["--namespace", &ctx.namespace, "-f"])
        .arg(&values)
        .arg(format!(
            "--kube-version={}",
            wasm_provisioner_tests::cluster::pinned_kubernetes_version()
        )))?)?;
    for object in &objects {
        apply(client, object, false).await?;
    }
    let node = format!("node-{}", ctx.namespace);
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": node, "labels": { "kubernetes.io/hostname": node } },
            }))?,
        )
        .await?;
    let outcome = run_released(ctx, dir, &image, &objects, &class, &node, &hostpath_sha256).await;
    for object in &objects {
        if object["metadata"]["namespace"].is_null() {
            let name = object["metadata"]["name"].as_str().unwrap_or("");
            match object["kind"].as_str() {
                Some("StorageClass") => {
                    let _ = Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone())
                        .delete(name, &DeleteParams::default())
                        .await;
                }
                Some("ClusterRole") => {
                    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
                        .delete(name, &DeleteParams::default())
                        .await;
                }
                Some("ClusterRoleBinding") => {
                    let _ =
                        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
                            .delete(name, &DeleteParams::default())
                            .await;
                }
                _ => {}
            }
        }
    }
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    drop(registry);
    outcome
}

async fn run_released(
    ctx: &TestContext,
    dir: &Path,
    image: &str,
    objects: &[Value],
    class: &str,
    node: &str,
    hostpath_sha256: &str,
) -> anyhow::Result<()> {
    let client = &ctx.client;
    let (amd64, _) = pull_platform(image, "linux/amd64", &dir.join("amd64"))?;
    ensure!(
        amd64.config_blob["architecture"] == "amd64",
        "the amd64 pull is {}",
        amd64.config_blob["architecture"]
    );
    let deployment = one(objects, "Deployment");
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .context("serviceAccountName")?;
    let token = service_account_token(client, &ctx.namespace, account).await?;
    let cluster = Cluster::from_kubeconfig(&admin_kubeconfig())?;
    let pod_dir = dir.join("pod");
    std::fs::create_dir_all(&pod_dir)?;
    let mut pod = Pod::start(
        client,
        PodSpec {
            workload: deployment,
            image: &amd64,
            cluster: &cluster,
            token: Some(&token),
            dir: &pod_dir,
            pod_name: &format!(
                "{}-0",
                deployment["metadata"]["name"].as_str().unwrap_or("wp")
            ),
            node_name: node,
            host_path_subdirs: &["hostpath", "nfs"],
            network: None,
        },
    )
    .await?;
    let outcome = bind_and_delete(ctx, &mut pod, class, node, hostpath_sha256).await;
    let status = pod.terminate(Duration::from_secs(30))?;
    outcome.with_context(|| format!("the container's log:\n{}", pod.log_text()))?;
    ensure!(
        status.success(),
        "SIGTERM should stop the host cleanly, it exited {status}; log:\n{}",
        pod.log_text()
    );
    Ok(())
}

async fn bind_and_delete(
    ctx: &TestContext,
    pod: &mut Pod,
    class: &str,
    node: &str,
    hostpath_sha256: &str,
) -> anyhow::Result<()> {
    pod.wait_probe("readinessProbe", WAIT)?;
    // The module was pulled from the registry (its signature checked on the way), and
    // the released bytes serve.
    let port = pod.probe_port("readinessProbe")?;
    let serving = format!("sha256=\"{hostpath_sha256}\"");
    wait_for("the released hostpath module in service", WAIT, || async {
        let (_, metrics) = pod.get(port, "/metrics")?;
        let served = metrics.lines().any(|l| {
            l.starts_with("wasm_provisioner_module_version_info{")
                && l.contains("module=\"hostpath\"")
                && l.contains(&serving)
                && l.ends_with(" 1")
        });
        Ok(served.then_some(metrics))
    })
    .await
    .map(|metrics| {
        for line in metrics
            .lines()
            .filter(|l| l.starts_with("wasm_provisioner_module_pulls_total"))
        {
            eprintln!("{line}");
        }
    })?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": { "name": "released",
                              "annotations": { "volume.kubernetes.io/selected-node": node } },
                "spec": { "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                          "resources": { "requests": { "storage": "1Mi" } } },
            }))?,
        )
        .await?;
    let volume = wait_for("claim released Bound", WAIT, || async {
        let claim = claims.get("released").await?;
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        Ok(bound
            .then(|| claim.spec.and_then(|s| s.volume_name))
            .flatten())
    })
    .await?;
    let made = pod
        .volumes
        .get("data")
        .context("a data volume")?
        .dir
        .join("hostpath")
        .join(&volume);
    ensure!(made.is_dir(), "{} was not made", made.display());
    eprintln!("claim released Bound to {volume}, made by the released image and module");
    claims.delete("released", &DeleteParams::default()).await?;
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    wait_for(&format!("PV {volume} deleted"), WAIT, || async {
        Ok(volumes.get_opt(&volume).await?.is_none().then_some(()))
    })
    .await?;
    ensure!(!made.exists(), "{} outlived its volume", made.display());
    Ok(())
}
