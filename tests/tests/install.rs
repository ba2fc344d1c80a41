//! The production install, proven against the real API server (docs/install.md): the Helm chart
//! (`helm lint`, `helm template` with default and non-default values, in either mode), the
//! kustomize base and its overlays (node-local mode's among them), every rendered object
//! applied with a server-side dry run, the chart's RBAC against `deploy/rbac.yaml` and
//! node-local mode's against the overlay's, node-local mode's pod against deployment
//! mode's, the image tarball's metadata against the Deployment,
//! the Deployment run from the image as kubelet would run it (provision, hot reload,
//! probes) with the dashboard's and alerts' metrics checked on that host's `/metrics`,
//! and node-local mode's DaemonSet run the same way, one pod per node, each in a network
//! namespace of its own (enrolment, a volume made and deleted on each claim's node).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use sha2::Digest as _;
use wasm_provisioner::nodes::enroll::ANNOTATION_ADDRESS;
use wasm_provisioner_tests::cluster::{
    TestContext, admin_client, admin_kubeconfig, random_suffix, repo_root, service_account_token,
    wait_for,
};
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::install::{
    apply, build_image, describe, helm_template, helm_template_command, kustomize_build, of_kind,
    one, prepare_modules, run, run_expecting_failure, tool,
};
use wasm_provisioner_tests::kubelet::{Cluster, Network, Pod, PodSpec};
use wasm_provisioner_tests::promql;

const WAIT: Duration = Duration::from_secs(90);

/// The CustomResourceDefinitions of the prometheus-operator kinds the chart can render,
/// created (schema-less) when the cluster lacks them, so the server can still check the
/// objects' group, version, kind, scope and metadata.
async fn ensure_monitoring_crds(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (plural, kind) in [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    ] {
        let name = format!("{plural}.monitoring.coreos.com");
        if crds.get_opt(&name).await?.is_some() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": name },
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": { "plural": plural, "kind": kind, "singular": kind.to_lowercase() },
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": true
                    } }
                }]
            }
        }))?;
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
        wait_for(&format!("CRD {name} established"), WAIT, || async {
            let crd = crds.get(&name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// Creates the Namespaces the objects live in (for real: a dry run creates nothing, and
/// namespaced objects need their namespace), then applies every object with a
/// server-side dry run. Returns the objects as the server would store them, and the
/// namespaces it created (for the caller to delete; existing ones are left alone).
async fn dry_run_all(
    client: &Client,
    objects: &[Value],
) -> anyhow::Result<(Vec<Value>, Vec<String>)> {
    ensure_monitoring_crds(client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let wanted: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str().map(String::from))
        .chain(
            of_kind(objects, "Namespace")
                .iter()
                .filter_map(|o| o["metadata"]["name"].as_str().map(String::from)),
        )
        .collect();
    let mut created = Vec::new();
    for namespace in wanted {
        if namespaces.get_opt(&namespace).await?.is_none() {
            let object = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            namespaces.create(&PostParams::default(), &object).await?;
            created.push(namespace);
        }
    }
    let mut applied = Vec::new();
    for object in objects {
        applied.push(apply(client, object, true).await?);
    }
    Ok((applied, created))
}

/// Values files that exercise what the defaults do not.
fn non_default_values(dir: &Path) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    let sets = [
        (
            "existing ConfigMap, one replica without leader election, custom grants and classes, monitoring",
            json!({
                "provisionerName": "example.com/fast",
                "replicaCount": 1,
                "leaderElection": { "enabled": false },
                "modules": { "source": "configMap", "configMap": { "name": "my-modules" } },
                "grants": { "allow": { "directories": ["/srv/volumes"] },
                            "modules": { "mine": { "directories": [
                                { "host": "/srv/volumes/mine", "guest": "/volumes", "mode": "read-write" }] } } },
                "dataDir": { "path": "/srv/volumes" },
                "storageClasses": [{ "name": "fast", "module": "mine", "default": true,
                    "moduleSHA256": "0".repeat(64),
                    "allowedTopologies": [{ "matchLabelExpressions": [
                        { "key": "kubernetes.io/hostname", "values": ["node-1"] }] }],
                    "parameters": { "size": "10" } }],
                "metrics": { "serviceMonitor": { "enabled": true, "labels": { "release": "prom" } },
                             "prometheusRule": { "enabled": true } },
                "image": { "repository": "registry.example.com/wasm-provisioner", "digest":
                    format!("sha256:{}", "a".repeat(64)) },
                "extraArgs": ["--failed-provision-threshold=30"],
                "extraEnv": [{ "name": "WASM_PROVISIONER_LOG", "value": "debug" }],
                "resources": { "requests": { "cpu": "1", "memory": "1Gi" } },
                "nodeSelector": { "kubernetes.io/os": "linux" },
                "tolerations": [{ "key": "storage", "operator": "Exists" }],
            }),
        ),
        (
            "modules from an init container",
            json!({
                "modules": { "source": "initContainer",
                             "initContainer": { "image": "registry.example.com/modules:1" } },
                "podDisruptionBudget": { "enabled": false },
                "metrics": { "service": { "enabled": false } },
                "dataDir": { "enabled": false },
                "storageClasses": [],
            }),
        ),
        (
            "modules from an image volume",
            json!({
                "modules": { "source": "image",
                             "image": { "reference": "registry.example.com/modules:1", "subPath": "modules" } },
            }),
        ),
        (
            "node-local mode, its own port and node-gone policy, a class that binds at once",
            json!({
                "mode": "node-local",
                "nodeLocal": { "port": 9444, "nodeGonePolicy": "remove", "nodeGoneGrace": "30m" },
                "storageClasses": [
                    { "name": "local", "module": "hostpath",
                      "parameters": { "nodePath": "/var/lib/wasm-provisioner/hostpath" } },
                    { "name": "shared", "module": "nfs-subdir", "volumeBindingMode": "Immediate",
                      "parameters": { "server": "nfs.example.com", "share": "/exports" } }],
                "extraArgs": ["--capacity-poll-interval=30s"],
            }),
        ),
    ];
    let mut files = Vec::new();
    for (index, (what, values)) in sets.into_iter().enumerate() {
        let path = dir.join(format!("values-{index}.yaml"));
        std::fs::write(&path, serde_yaml::to_string(&values)?)?;
        files.push((what.to_string(), path));
    }
    Ok(files)
}

#[test]
fn helm_lint_passes_with_default_and_non_default_values() {
    prepare_modules();
    let helm = tool("helm");
    let chart = repo_root().join("deploy/helm/wasm-provisioner");
    run(std::process::Command::new(&helm)
        .arg("lint")
        .arg("--strict")
        .arg(&chart))
    .unwrap_or_else(|e| panic!("{e:#}"));
    let dir = tempfile::tempdir().unwrap();
    for (what, values) in non_default_values(dir.path()).unwrap() {
        run(std::process::Command::new(&helm)
            .arg("lint")
            .arg("--strict")
            .arg(&chart)
            .arg("-f")
            .arg(&values))
        .unwrap_or_else(|e| panic!("helm lint with {what}: {e:#}"));
    }
}

#[tokio::test]
async fn every_object_the_chart_renders_is_accepted_by_the_api_server() {
    prepare_modules();
    let ctx = TestContext::new("chart-dry-run")
        .await
        .expect("a namespace");
    let release = format!("wp-{}", random_suffix());
    let dir = tempfile::tempdir().unwrap();
    let mut renders = vec![
        ("default values".to_string(), vec![]),
        (
            "mode node-local".to_string(),
            vec!["--set".to_string(), "mode=node-local".to_string()],
        ),
    ];
    for (what, path) in non_default_values(dir.path()).unwrap() {
        renders.push((what, vec!["-f".to_string(), path.display().to_string()]));
    }
    for (what, args) in renders {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let objects = helm_template(&release, &ctx.namespace, &args)
            .unwrap_or_else(|e| panic!("helm template with {what}: {e:#}"));
        let (applied, _) = dry_run_all(&ctx.client, &objects)
            .await
            .unwrap_or_else(|e| panic!("with {what}: {e:#}"));
        // The server kept what it was given: nothing dropped as unknown (an image volume
        // behind a disabled feature gate would be).
        let node_local = workload(&objects)["kind"] == "DaemonSet";
        let kind = if node_local {
            "DaemonSet"
        } else {
            "Deployment"
        };
        let stored = applied
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("with {what}: the server returned no {kind}"));
        let volumes = stored["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        let modules = volumes
            .iter()
            .find(|v| v["name"] == "modules")
            .expect("a modules volume");
        assert!(
            ["configMap", "image", "emptyDir"]
                .iter()
                .any(|k| modules.get(*k).is_some()),
            "with {what}: the server stored a modules volume without a source: {modules}"
        );
        if node_local {
            let token = volumes
                .iter()
                .find(|v| v["name"] == "token")
                .expect("a token volume");
            assert_eq!(
                token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
                "wasm-provisioner",
                "with {what}: the server stored {token}"
            );
        }
        eprintln!(
            "helm template with {what}: {} objects accepted by a server-side dry run: {}",
            objects.len(),
            objects.iter().map(describe).collect::<Vec<_>>().join(", ")
        );
    }
    ctx.cleanup().await;
}

#[test]
fn bad_chart_values_fail_with_a_clear_message() {
    prepare_modules();
    let cases: [(&[&str], &str); 9] = [
        (
            &["--set", "modules.source=git"],
            "modules.source must be files, configMap, image or initContainer",
        ),
        (
            &["--set", "modules.source=configMap"],
            "set modules.configMap.name",
        ),
        (
            &["--set", "modules.source=image"],
            "set modules.image.reference",
        ),
        (
            &["--set", "leaderElection.enabled=false"],
            "replicaCount > 1 needs leaderElection.enabled",
        ),
        (
            &["--set", "storageClasses[0].name=x"],
            "class \"x\" has no module",
        ),
        (
            &["--set", "mode=daemonset"],
            "mode must be deployment or node-local, not \"daemonset\"",
        ),
        (
            &["--set", "mode=node-local,leaderElection.enabled=false"],
            "mode node-local needs leaderElection.enabled",
        ),
        (
            &["--set", "mode=node-local,nodeLocal.nodeGonePolicy=delete"],
            "nodeLocal.nodeGonePolicy must be keep or remove, not \"delete\"",
        ),
        (
            &["--set", "mode=node-local,provisionerName=example.com/fast"],
            "provisionerName must be a CSI driver name",
        ),
    ];
    for (args, expected) in cases {
        let stderr = run_expecting_failure(&mut helm_template_command("wp", "default", args))
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            stderr.contains(expected),
            "helm template {args:?}: expected {expected:?} in:\n{stderr}"
        );
    }
}

/// The kind, name, namespace and content of an RBAC object, without labels.
fn rbac_essence(object: &Value) -> Value {
    let mut essence = json!({
        "kind": object["kind"],
        "name": object["metadata"]["name"],
        "namespace": object["metadata"]["namespace"],
    });
    for key in ["rules", "subjects", "roleRef"] {
        if !object[key].is_null() {
            essence[key] = object[key].clone();
        }
    }
    essence
}

/// The essences of the RBAC objects among `objects`.
fn rbac_of(objects: &[Value]) -> BTreeSet<String> {
    let kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    objects
        .iter()
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
        .map(|o| rbac_essence(o).to_string())
        .collect()
}

#[test]
fn the_chart_grants_exactly_the_rbac_of_deploy_rbac_yaml() {
    prepare_modules();
    // One source of truth per file: the chart's files are links to deploy/rbac.yaml and
    // to node-local mode's deploy/node-local/rbac.yaml.
    for (file, target) in [
        ("rbac.yaml", "deploy/rbac.yaml"),
        ("node-local-rbac.yaml", "deploy/node-local/rbac.yaml"),
    ] {
        let link = repo_root()
            .join("deploy/helm/wasm-provisioner/files")
            .join(file);
        assert_eq!(
            std::fs::canonicalize(&link).unwrap(),
            std::fs::canonicalize(repo_root().join(target)).unwrap(),
            "{} must be a link to {target}",
            link.display()
        );
    }
    let file = std::fs::read_to_string(repo_root().join("deploy/rbac.yaml")).unwrap();
    let expected = rbac_of(&wasm_provisioner_tests::install::parse_documents(&file).unwrap());
    let rendered = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    let actual = rbac_of(&rendered);
    assert_eq!(
        actual, expected,
        "the chart's RBAC (release wasm-provisioner in namespace wasm-provisioner) differs from deploy/rbac.yaml"
    );
    // Another release and namespace: the same rules, its own names and subjects.
    let other = helm_template("other", "elsewhere", &[]).unwrap();
    let binding = one(&other, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["namespace"], "elsewhere");
    assert_eq!(binding["roleRef"]["name"], "other-wasm-provisioner");
    let role = one(&other, "ClusterRole");
    let original = wasm_provisioner_tests::install::parse_documents(&file).unwrap();
    assert_eq!(role["rules"], one(&original, "ClusterRole")["rules"]);

    // Node-local mode: the same plus deploy/node-local/rbac.yaml, which is what the
    // node-local overlay grants.
    let node_local_file =
        std::fs::read_to_string(repo_root().join("deploy/node-local/rbac.yaml")).unwrap();
    let added =
        rbac_of(&wasm_provisioner_tests::install::parse_documents(&node_local_file).unwrap());
    assert!(
        !added.is_empty() && added.is_disjoint(&expected),
        "deploy/node-local/rbac.yaml adds nothing to deploy/rbac.yaml"
    );
    let chart = rbac_of(
        &helm_template(
            "wasm-provisioner",
            "wasm-provisioner",
            &["--set", "mode=node-local"],
        )
        .unwrap(),
    );
    assert_eq!(
        chart,
        expected.union(&added).cloned().collect::<BTreeSet<_>>(),
        "the chart's RBAC in node-local mode is not deploy/rbac.yaml's and deploy/node-local/rbac.yaml's"
    );
    let overlay =
        rbac_of(&kustomize_build("deploy/node-local").unwrap_or_else(|e| panic!("{e:#}")));
    assert_eq!(
        chart, overlay,
        "the chart's RBAC in node-local mode differs from the node-local overlay's"
    );
    // Deployment mode grants none of it.
    assert!(actual.is_disjoint(&added));
}

#[test]
fn the_chart_s_default_grants_are_deploy_grants() {
    prepare_modules();
    let rendered = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    let grants = of_kind(&rendered, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "wasm-provisioner-grants")
        .expect("the grants ConfigMap");
    assert_eq!(
        grants["data"]["grants.yaml"].as_str().unwrap(),
        std::fs::read_to_string(repo_root().join("deploy/grants/grants.yaml")).unwrap()
    );
}

#[tokio::test]
async fn the_kustomize_base_and_overlay_are_accepted_by_the_api_server() {
    let modules = prepare_modules();
    let client = admin_client().await.unwrap();
    let base = kustomize_build("deploy").unwrap_or_else(|e| panic!("{e:#}"));
    let overlay =
        kustomize_build("examples/second-provisioner").unwrap_or_else(|e| panic!("{e:#}"));
    let node_local = kustomize_build("deploy/node-local").unwrap_or_else(|e| panic!("{e:#}"));

    // The modules ConfigMap holds the built guests, byte for byte, and keeps its name
    // (hot reload); the grants ConfigMap is deploy/grants/grants.yaml under a hashed name
    // the Deployment follows (a change rolls it).
    let config_maps = of_kind(&base, "ConfigMap");
    let modules_map = config_maps
        .iter()
        .find(|c| c["metadata"]["name"] == "wasm-provisioner-modules")
        .expect("the modules ConfigMap keeps its name");
    for module in ["hostpath", "nfs-subdir"] {
        // kustomize folds the base64 into lines.
        let folded = modules_map["binaryData"][format!("{module}.wasm")]
            .as_str()
            .unwrap_or_else(|| panic!("no {module}.wasm in binaryData"))
            .split_whitespace()
            .collect::<String>();
        let bytes: k8s_openapi::ByteString = serde_json::from_value(Value::String(folded))
            .unwrap_or_else(|e| panic!("{module}.wasm in binaryData: {e}"));
        assert_eq!(
            bytes.0,
            std::fs::read(modules.join(format!("{module}.wasm"))).unwrap()
        );
    }
    let grants = config_maps
        .iter()
        .find(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("wasm-provisioner-grants-")
        })
        .expect("the grants ConfigMap, with a hash suffix");
    assert_eq!(
        grants["data"]["grants.yaml"].as_str().unwrap(),
        std::fs::read_to_string(repo_root().join("deploy/grants/grants.yaml")).unwrap()
    );
    let deployment = one(&base, "Deployment");
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["configMap"]["name"] == grants["metadata"]["name"]),
        "the Deployment mounts the hashed grants ConfigMap: {volumes}"
    );

    // The overlay: its own namespace, names, provisioner name and subjects.
    let binding = one(&overlay, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"][0]["namespace"],
        "wasm-provisioner-second"
    );
    assert_eq!(binding["metadata"]["name"], "wasm-provisioner-second");
    let args = one(&overlay, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .clone();
    assert!(args.contains(&json!("--provisioner-name=second.wasm-provisioner.dev")));
    for class in of_kind(&overlay, "StorageClass") {
        assert_eq!(class["provisioner"], "second.wasm-provisioner.dev");
    }

    // Node-local mode: the base's ConfigMaps (the same names: the DaemonSet follows the
    // hashed grants), a DaemonSet and no Deployment (checked further by
    // `node_local_mode_renders_a_daemon_set_a_csi_driver_and_waiting_classes`).
    assert_eq!(
        of_kind(&node_local, "ConfigMap"),
        of_kind(&base, "ConfigMap"),
        "the node-local overlay's ConfigMaps differ from the base's"
    );
    let daemon_set = one(&node_local, "DaemonSet");
    assert!(
        daemon_set["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["configMap"]["name"] == grants["metadata"]["name"]),
        "the DaemonSet mounts the hashed grants ConfigMap"
    );
    assert!(of_kind(&node_local, "Deployment").is_empty());

    // One namespace may serve two builds (deploy/ and deploy/node-local/): the ones made
    // are deleted after every dry run, as a namespace being deleted takes no objects.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut made = Vec::new();
    let mut failure = None;
    for (what, objects) in [
        ("deploy/", &base),
        ("the overlay", &overlay),
        ("deploy/node-local/", &node_local),
    ] {
        match dry_run_all(&client, objects).await {
            Ok((_, created)) => made.extend(created),
            Err(error) => {
                failure = Some(format!("kustomize build {what}: {error:#}"));
                break;
            }
        }
    }
    for namespace in made {
        let _ = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
    }
    if let Some(failure) = failure {
        panic!("{failure}");
    }
}

#[test]
fn the_image_is_what_the_deployment_expects() {
    prepare_modules();
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(&wasm_provisioner_tests::host::binary(), dir.path())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let rendered = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    let deployment = one(&rendered, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        image
            .tags
            .contains(&container["image"].as_str().unwrap().to_string()),
        "the chart's image {} is not the tarball's {:?}",
        container["image"],
        image.tags
    );
    assert_eq!(image.config["User"], "65532:65532");
    assert_eq!(
        image.config["User"],
        format!(
            "{}:{}",
            pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
        )
    );
    assert_eq!(image.config["Entrypoint"], json!(["/wasm-provisioner"]));
    assert_eq!(image.config_blob["os"], "linux");
    assert_eq!(image.config_blob["architecture"], "amd64");
    let labels = &image.config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        "https://github.com/wasm-provisioner/wasm-provisioner"
    );
    // deploy/deployment.yaml names the same image.
    let raw: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/deployment.yaml")).unwrap(),
    )
    .unwrap();
    assert!(
        image.tags.contains(
            &raw["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap()
                .to_string()
        )
    );
    eprintln!(
        "image {:?}: {} bytes",
        image.tarball,
        std::fs::metadata(&image.tarball).unwrap().len()
    );
}

/// The chart at its default values runs the host as the kustomize base does: a flag
/// the base sets has the base's value, and any other flag the chart sets has the host's
/// own default (the chart once ran 4 workers where the host's default, chosen by the
/// load benchmark, is 8).
#[test]
fn the_chart_s_defaults_are_the_host_s_and_the_base_s() {
    use clap::CommandFactory;
    prepare_modules();
    let flags = |args: &Value| -> std::collections::BTreeMap<String, String> {
        args.as_array()
            .unwrap()
            .iter()
            .filter_map(|arg| arg.as_str()?.strip_prefix("--")?.split_once('='))
            .map(|(flag, value)| (flag.to_string(), value.to_string()))
            .collect()
    };
    let rendered = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    let chart =
        flags(&one(&rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]);
    let base_deployment: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/deployment.yaml")).unwrap(),
    )
    .unwrap();
    let base = flags(&base_deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    let cli = wasm_provisioner::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("a run subcommand");
    let mut compared = 0;
    for (flag, value) in &chart {
        let expected = match base.get(flag) {
            Some(base_value) => base_value.clone(),
            None => {
                let arg = run
                    .get_arguments()
                    .chain(cli.get_arguments())
                    .find(|arg| arg.get_long() == Some(flag.as_str()))
                    .unwrap_or_else(|| {
                        panic!("the chart sets --{flag}, which `run` does not have")
                    });
                let defaults: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                assert_eq!(
                    defaults.len(),
                    1,
                    "--{flag} has no single default: {defaults:?}"
                );
                defaults[0].clone()
            }
        };
        assert_eq!(
            value, &expected,
            "the chart's default --{flag}={value}; the host's (or the kustomize base's) is {expected}"
        );
        compared += 1;
    }
    assert!(compared >= 10, "only {compared} flags compared: {chart:?}");

    // And the pod around it is the same: resources, hardening, probes, ports.
    let chart_pod = &one(&rendered, "Deployment")["spec"]["template"]["spec"];
    let base_pod = &base_deployment["spec"]["template"]["spec"];
    assert_eq!(chart_pod["securityContext"], base_pod["securityContext"]);
    for field in [
        "resources",
        "securityContext",
        "livenessProbe",
        "readinessProbe",
        "ports",
    ] {
        assert_eq!(
            chart_pod["containers"][0][field], base_pod["containers"][0][field],
            "the chart's and the kustomize base's container {field} differ"
        );
    }
}

/// The one Deployment or DaemonSet of a render: the host's pods.
fn workload(objects: &[Value]) -> &Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one Deployment or DaemonSet, found: {}",
        found
            .iter()
            .map(|o| describe(o))
            .collect::<Vec<_>>()
            .join(", ")
    );
    found[0]
}

/// What node-local mode adds to deployment mode's pod: the entries of the DaemonSet's
/// container args, env, ports and volume mounts, and of its pod's volumes, after the
/// Deployment's (which they must start with), as `{"args": [...], "env": [...], ...}`.
/// Any other difference between the two pod templates is an error.
fn node_local_additions(deployment: &Value, daemon_set: &Value) -> Result<Value, String> {
    let deployment_pod = &deployment["spec"]["template"];
    let mut rest = daemon_set["spec"]["template"].clone();
    let mut additions = json!({});
    for (name, pointer) in [
        ("args", "/spec/containers/0/args"),
        ("env", "/spec/containers/0/env"),
        ("ports", "/spec/containers/0/ports"),
        ("volumeMounts", "/spec/containers/0/volumeMounts"),
        ("volumes", "/spec/volumes"),
    ] {
        let before = deployment_pod
            .pointer(pointer)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let after = rest
            .pointer_mut(pointer)
            .and_then(Value::as_array_mut)
            .ok_or(format!("the DaemonSet's pod has no {name}"))?;
        if !after.starts_with(&before) {
            return Err(format!(
                "the DaemonSet's {name} do not start with the Deployment's: {}\nversus {}",
                Value::Array(after.clone()),
                Value::Array(before)
            ));
        }
        additions[name] = Value::Array(after.split_off(before.len()));
    }
    if &rest != deployment_pod {
        return Err(format!(
            "the pods differ in more than the node-local additions:\nDaemonSet, without them: {rest}\nDeployment: {deployment_pod}"
        ));
    }
    Ok(additions)
}

/// Node-local mode runs the pod of deployment mode plus the channel, the same in the
/// chart and the kustomize overlay: a change to the base's pod that the DaemonSet
/// misses, or an addition one of them lacks, fails here.
#[test]
fn node_local_mode_runs_deployment_mode_s_pod_plus_the_channel() {
    prepare_modules();
    let build = |dir: &str| kustomize_build(dir).unwrap_or_else(|e| panic!("{e:#}"));
    let template = |args: &[&str]| {
        helm_template("wasm-provisioner", "wasm-provisioner", args)
            .unwrap_or_else(|e| panic!("{e:#}"))
    };
    let renders = [
        (
            "the kustomize overlay",
            build("deploy"),
            build("deploy/node-local"),
        ),
        (
            "the chart",
            template(&[]),
            template(&["--set", "mode=node-local"]),
        ),
    ];
    let mut found = Vec::new();
    for (what, deployment_mode, node_local_mode) in &renders {
        let daemon_set = one(node_local_mode, "DaemonSet");
        let mut additions = node_local_additions(one(deployment_mode, "Deployment"), daemon_set)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // --instance-selector selects the DaemonSet's pods (the chart's carry the
        // release's labels, so its value is the chart's own).
        let args = additions["args"].as_array_mut().unwrap();
        let position = args
            .iter()
            .position(|a| a.as_str().unwrap().starts_with("--instance-selector="))
            .unwrap_or_else(|| panic!("{what}: no --instance-selector"));
        let selector = args.remove(position);
        let given: BTreeSet<&str> = selector.as_str().unwrap()["--instance-selector=".len()..]
            .split(',')
            .collect();
        let wanted: BTreeSet<String> = daemon_set["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(key, value)| format!("{key}={}", value.as_str().unwrap()))
            .collect();
        assert_eq!(
            given,
            wanted.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            "{what}: {selector} does not select the DaemonSet's pods"
        );
        assert_eq!(
            daemon_set["spec"]["updateStrategy"],
            json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } }),
            "{what}"
        );
        found.push(additions);
    }
    assert_eq!(
        found[0], found[1],
        "the chart's node-local additions differ from the overlay's"
    );
    // What they are (docs/install.md, "Node-local mode"; the host's flags and defaults):
    // the mode, the channel's address and port, the pod's IP for enrolment, the
    // projected pod-bound token at --token-file's default, the node-gone policy.
    assert_eq!(
        found[0],
        json!({
            "args": ["--mode=node-local", "--node-address=0.0.0.0:9443",
                     "--node-gone-policy=keep", "--node-gone-grace=1h"],
            "env": [{ "name": "WASM_PROVISIONER_POD_IP",
                      "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }],
            "ports": [{ "name": "node-calls", "containerPort": 9443 }],
            "volumeMounts": [{ "name": "token", "mountPath": "/var/run/secrets/wasm-provisioner",
                               "readOnly": true }],
            "volumes": [{ "name": "token", "projected": { "sources": [{ "serviceAccountToken": {
                "audience": "wasm-provisioner", "expirationSeconds": 3600, "path": "token" } }] } }],
        })
    );
}

/// Node-local mode, in the overlay and in the chart: a DaemonSet and no Deployment nor
/// PodDisruptionBudget, the CSIDriver that makes the scheduler read the published
/// capacity, named as the classes' provisioner, and every class WaitForFirstConsumer.
/// The chart takes the port and the node-gone policy from its values, and a class's own
/// binding mode wins; deployment mode renders none of it.
#[test]
fn node_local_mode_renders_a_daemon_set_a_csi_driver_and_waiting_classes() {
    prepare_modules();
    let overlay = kustomize_build("deploy/node-local").unwrap_or_else(|e| panic!("{e:#}"));
    let chart = helm_template(
        "wasm-provisioner",
        "wasm-provisioner",
        &["--set", "mode=node-local"],
    )
    .unwrap();
    for (what, objects) in [("the overlay", &overlay), ("the chart", &chart)] {
        assert!(
            of_kind(objects, "Deployment").is_empty(),
            "{what}: a Deployment"
        );
        assert!(
            of_kind(objects, "PodDisruptionBudget").is_empty(),
            "{what}: a PodDisruptionBudget"
        );
        assert_eq!(workload(objects)["kind"], "DaemonSet");
        let driver = one(objects, "CSIDriver");
        assert_eq!(
            driver["spec"],
            json!({ "attachRequired": false, "podInfoOnMount": false, "storageCapacity": true,
                    "volumeLifecycleModes": ["Persistent"] }),
            "{what}"
        );
        let classes = of_kind(objects, "StorageClass");
        assert_eq!(classes.len(), 2, "{what}: the two example classes");
        for class in classes {
            let name = &class["metadata"]["name"];
            assert_eq!(
                class["volumeBindingMode"], "WaitForFirstConsumer",
                "{what}: class {name}"
            );
            assert_eq!(
                class["provisioner"], driver["metadata"]["name"],
                "{what}: class {name} and the CSIDriver name different provisioners"
            );
        }
    }

    let custom = helm_template(
        "wp",
        "elsewhere",
        &[
            "--set",
            "mode=node-local,nodeLocal.port=9444,nodeLocal.nodeGonePolicy=remove,nodeLocal.nodeGoneGrace=30m",
            "--set",
            "storageClasses[0].name=shared,storageClasses[0].module=nfs-subdir,storageClasses[0].volumeBindingMode=Immediate",
        ],
    )
    .unwrap();
    let container = &one(&custom, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"].as_array().unwrap();
    for arg in [
        "--node-address=0.0.0.0:9444",
        "--node-gone-policy=remove",
        "--node-gone-grace=30m",
    ] {
        assert!(args.contains(&json!(arg)), "no {arg} in {args:?}");
    }
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({ "name": "node-calls", "containerPort": 9444 }))
    );
    assert_eq!(
        one(&custom, "StorageClass")["volumeBindingMode"],
        "Immediate"
    );

    let deployment_mode = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    assert_eq!(workload(&deployment_mode)["kind"], "Deployment");
    assert!(of_kind(&deployment_mode, "CSIDriver").is_empty());
    one(&deployment_mode, "PodDisruptionBudget");
    let nfs = of_kind(&deployment_mode, "StorageClass")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "wasm-nfs-subdir")
        .expect("the nfs-subdir class");
    assert_eq!(nfs["volumeBindingMode"], "Immediate");
}

/// A component with a custom section appended: the same guest, a new version (sha256).
fn new_version(component: &[u8]) -> Vec<u8> {
    let name = b"wasm-provisioner-test-version";
    let payload = random_suffix();
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name);
    section.extend_from_slice(payload.as_bytes());
    let mut bytes = component.to_vec();
    bytes.push(0); // custom section id
    bytes.push(section.len() as u8); // LEB128 size, < 128
    bytes.extend_from_slice(&section);
    bytes
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Deletes the cluster-scoped objects among `objects` (classes, RBAC, the CSIDriver):
/// the namespaced ones go with the test's namespace. Errors are ignored.
async fn delete_cluster_objects(client: &Client, objects: &[Value]) {
    for object in objects {
        if object["metadata"]["namespace"].is_null()
            && let (Some(api_version), Some(kind), Some(name)) = (
                object["apiVersion"].as_str(),
                object["kind"].as_str(),
                object["metadata"]["name"].as_str(),
            )
        {
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
            if let Ok((resource, _)) = kube::discovery::pinned_kind(client, &gvk).await {
                let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
                let _ = api.delete(name, &DeleteParams::default()).await;
            }
        }
    }
}

/// The Deployment as kubelet would run it, from the chart rendered with this test's
/// values (its own provisioner name, class names and metrics port, so runs side by side
/// never meet; everything else is the default), applied to the API server for real.
#[tokio::test]
async fn the_deployment_runs_from_the_image_as_kubelet_would() {
    prepare_modules();
    let ctx = TestContext::new("kubelet").await.expect("a namespace");
    let result = kubelet_scenario(&ctx).await;
    if let Err(error) = &result {
        panic!("{error:?}");
    }
    ctx.cleanup().await;
}

async fn kubelet_scenario(ctx: &TestContext) -> anyhow::Result<()> {
    let client = &ctx.client;
    let dir = tempfile::Builder::new()
        .prefix("wasm-provisioner-kubelet-")
        .tempdir()?;
    let release = format!("wp-{}", random_suffix());
    let provisioner = format!("{}.install.wasm-provisioner.dev", ctx.namespace);
    let hostpath_class = format!("wasm-hostpath-{}", ctx.namespace);
    let nfs_class = format!("wasm-nfs-subdir-{}", ctx.namespace);
    let metrics_port = wasm_provisioner_tests::host::free_port();
    // The chart's default classes, renamed.
    let defaults: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("deploy/helm/wasm-provisioner/values.yaml"),
    )?)?;
    let mut classes = defaults["storageClasses"].clone();
    classes[0]["name"] = json!(hostpath_class);
    classes[1]["name"] = json!(nfs_class);
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "provisionerName": provisioner,
            "storageClasses": classes,
            "metricsPort": metrics_port,
        }))?,
    )?;
    let objects = helm_template(&release, &ctx.namespace, &["-f", values.to_str().unwrap()])?;
    for object in &objects {
        apply(client, object, false).await?;
    }

    // The node the hostpath claims select (no kubelet registers one), made before the
    // host starts so its node cache has it: a selected node the host does not know is
    // taken for gone and unselected.
    let node = format!("node-{}", ctx.namespace);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": node, "labels": { "kubernetes.io/hostname": node } },
            }))?,
        )
        .await?;

    let image = build_image(&wasm_provisioner_tests::host::binary(), dir.path())?;
    let deployment = one(&objects, "Deployment");
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .context("serviceAccountName")?;
    let token = service_account_token(client, &ctx.namespace, account).await?;
    let cluster = Cluster::from_kubeconfig(&admin_kubeconfig())?;
    let pod_dir = dir.path().join("pod");
    std::fs::create_dir_all(&pod_dir)?;
    let mut pod = Pod::start(
        client,
        PodSpec {
            workload: deployment,
            image: &image,
            cluster: &cluster,
            token: Some(&token),
            dir: &pod_dir,
            pod_name: &format!("{release}-0"),
            // The node the claims select (made before the host starts, see `exercise`).
            node_name: &format!("node-{}", ctx.namespace),
            // docs/install.md, "Install into a cluster": the data directory and the granted
            // directories in it (nfs stands in for the mounted NFS export).
            host_path_subdirs: &["hostpath", "nfs"],
            // The machine's network, as before node-local mode needed pod IPs.
            network: None,
        },
    )
    .await?;
    let outcome = exercise(ctx, &mut pod, &provisioner, &hostpath_class, &nfs_class).await;
    if outcome.is_err() {
        // Keep the files for a look.
        let kept = dir.keep();
        eprintln!("kubelet test files kept in {}", kept.display());
    } else {
        let status = pod.terminate(Duration::from_secs(30))?;
        ensure!(
            status.success(),
            "SIGTERM should stop the host cleanly, it exited {status}; log:\n{}",
            pod.log_text()
        );
    }
    delete_cluster_objects(client, &objects).await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    outcome.with_context(|| format!("the container's log:\n{}", pod.log_text()))
}

async fn exercise(
    ctx: &TestContext,
    pod: &mut Pod,
    provisioner: &str,
    hostpath_class: &str,
    nfs_class: &str,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    pod.wait_probe("livenessProbe", WAIT)?;
    pod.wait_probe("readinessProbe", WAIT)?;
    eprintln!(
        "probes pass on port {} after {:.1}s",
        pod.probe_port("readinessProbe")?,
        started.elapsed().as_secs_f64()
    );
    let metrics_port = pod.probe_port("readinessProbe")?;
    let metrics = |pod: &Pod| -> anyhow::Result<String> {
        let (code, body) = pod.get(metrics_port, "/metrics")?;
        ensure!(code == 200, "/metrics answered {code}");
        Ok(body)
    };
    wait_for("this host to lead", WAIT, || async {
        Ok(metrics(pod)?
            .contains("wasm_provisioner_leader 1")
            .then_some(()))
    })
    .await?;

    // A claim of each class to Bound. hostpath's class waits for a consumer: the test
    // plays the scheduler and names the node made before the host started.
    let node = format!("node-{}", ctx.namespace);
    claims_scenario(ctx, pod, provisioner, hostpath_class, nfs_class, &node).await?;

    // Every alert and dashboard query against this host's metrics (`promql`).
    let exported = promql::exported(&metrics(pod)?);
    let read = |file: &str| std::fs::read_to_string(repo_root().join(file));
    let (alerts, mut problems) = promql::check_alerts(
        &read("deploy/observability/prometheus-rules.yaml")?,
        &exported,
    )?;
    let (queries, dashboard_problems) =
        promql::check_dashboard(&read("deploy/observability/dashboard.json")?, &exported)?;
    problems.extend(dashboard_problems);
    ensure!(
        alerts >= 8 && queries >= 22,
        "read {alerts} alerts and {queries} dashboard queries; the files hold more"
    );
    ensure!(
        problems.is_empty(),
        "the alerts and the dashboard do not fit the host's metrics:\n{}",
        problems.join("\n")
    );
    eprintln!("{alerts} alerts and {queries} dashboard queries fit the host's metrics");
    Ok(())
}

async fn claim(
    ctx: &TestContext,
    name: &str,
    class: &str,
    node: Option<&str>,
) -> anyhow::Result<()> {
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name },
        "spec": { "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                  "resources": { "requests": { "storage": "1Mi" } } },
    });
    if let Some(node) = node {
        claim["metadata"]["annotations"] = json!({ "volume.kubernetes.io/selected-node": node });
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    claims
        .create(&PostParams::default(), &serde_json::from_value(claim)?)
        .await?;
    Ok(())
}

async fn wait_bound(ctx: &TestContext, name: &str) -> anyhow::Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let volume = wait_for(&format!("claim {name} Bound"), WAIT, || async {
        let claim = claims.get(name).await?;
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        Ok(bound
            .then(|| claim.spec.and_then(|s| s.volume_name))
            .flatten())
    })
    .await?;
    Ok(Api::<PersistentVolume>::all(ctx.client.clone())
        .get(&volume)
        .await?)
}

fn metric_value(exposition: &str, sample: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
}

async fn claims_scenario(
    ctx: &TestContext,
    pod: &mut Pod,
    provisioner: &str,
    hostpath_class: &str,
    nfs_class: &str,
    node: &str,
) -> anyhow::Result<()> {
    let client = &ctx.client;
    let metrics_port = pod.probe_port("readinessProbe")?;
    let metrics =
        |pod: &Pod| -> anyhow::Result<String> { Ok(pod.get(metrics_port, "/metrics")?.1) };

    claim(ctx, "hostpath-1", hostpath_class, Some(node)).await?;
    claim(ctx, "nfs-1", nfs_class, None).await?;
    let hostpath_volume = wait_bound(ctx, "hostpath-1").await?;
    let nfs_volume = wait_bound(ctx, "nfs-1").await?;
    // The backend work happened in the hostPath volume, as the host's user.
    let data = &pod.volumes.get("data").context("a data volume")?.dir;
    let made = data.join("hostpath").join(hostpath_volume.name_any());
    ensure!(made.is_dir(), "{} was not made", made.display());
    use std::os::unix::fs::MetadataExt as _;
    ensure!(
        std::fs::metadata(&made)?.uid() == 65532,
        "{} is not 65532's",
        made.display()
    );
    let annotation =
        |pv: &PersistentVolume, key: &str| pv.annotations().get(key).cloned().unwrap_or_default();
    let modules_dir = &pod.volumes.get("modules").context("a modules volume")?.dir;
    let hostpath_v1 = std::fs::read(modules_dir.join("hostpath.wasm"))?;
    ensure!(
        annotation(&hostpath_volume, "wasm-provisioner.dev/module-sha256")
            == sha256_hex(&hostpath_v1),
        "the first hostpath PV was not made by the ConfigMap's version"
    );
    ensure!(annotation(&nfs_volume, "pv.kubernetes.io/provisioned-by") == provisioner);

    // Update the modules ConfigMap: a new hostpath version, nfs-subdir removed, a broken
    // module added. Then kubelet's re-projection (a new timestamped directory and an
    // atomic `..data` swap).
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ctx.namespace);
    let map_name = pod.volumes["modules"]
        .config_map
        .clone()
        .context("modules is a ConfigMap")?;
    let mut map = maps.get(&map_name).await?;
    let hostpath_v2 = new_version(&hostpath_v1);
    let binary = map.binary_data.get_or_insert_default();
    binary.insert(
        "hostpath.wasm".into(),
        k8s_openapi::ByteString(hostpath_v2.clone()),
    );
    binary.remove("nfs-subdir.wasm");
    binary.insert(
        "broken.wasm".into(),
        k8s_openapi::ByteString(b"\0asm not a component".to_vec()),
    );
    map.metadata.managed_fields = None;
    maps.replace(&map_name, &PostParams::default(), &map)
        .await?;
    let before: Vec<_> = std::fs::read_dir(modules_dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    pod.resync_config_map(client, "modules").await?;
    let after: Vec<_> = std::fs::read_dir(modules_dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    eprintln!("modules volume before the update: {before:?}; after: {after:?}");
    wait_for(
        "the new hostpath version, the refusal and the removal",
        WAIT,
        || async {
            let text = metrics(pod)?;
            let done = metric_value(
                &text,
                "wasm_provisioner_module_reloads_total{module=\"hostpath\"}",
            ) == Some(2.0)
                && metric_value(
                    &text,
                    "wasm_provisioner_module_refusals_total{module=\"broken\"}",
                ) == Some(1.0)
                && metric_value(
                    &text,
                    "wasm_provisioner_module_removals_total{module=\"nfs-subdir\"}",
                ) == Some(1.0);
            Ok(done.then_some(()))
        },
    )
    .await?;
    claim(ctx, "hostpath-2", hostpath_class, Some(node)).await?;
    let second = wait_bound(ctx, "hostpath-2").await?;
    ensure!(
        annotation(&second, "wasm-provisioner.dev/module-sha256") == sha256_hex(&hostpath_v2),
        "the claim after the update was not served by the new version"
    );
    eprintln!(
        "after the ConfigMap update the new hostpath version {} serves",
        &sha256_hex(&hostpath_v2)[..12]
    );

    // A failing class (a parameter the module refuses) and a delete, so the failure and
    // delete metrics exist too.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let failing = format!("failing-{}", ctx.namespace);
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": { "name": failing }, "provisioner": provisioner,
                "parameters": { "module": "hostpath", "nodePath": "/var/lib/wasm-provisioner/hostpath",
                                "noSuchParameter": "x" },
            }))?,
        )
        .await?;
    claim(ctx, "failing-1", &failing, None).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ctx.namespace);
    claims
        .delete("hostpath-1", &DeleteParams::default())
        .await?;
    let outcome = wait_for("a failed attempt and a delete counted", WAIT, || async {
        let text = metrics(pod)?;
        let failed = text.contains(&format!(
            "controller_persistentvolumeclaim_provision_failed_total{{class=\"{failing}\""
        ));
        let deleted = text.contains(&format!(
            "controller_persistentvolume_delete_total{{class=\"{hostpath_class}\"}} 1"
        ));
        Ok((failed && deleted).then_some(()))
    })
    .await;
    let _ = classes.delete(&failing, &DeleteParams::default()).await;
    outcome?;
    ensure!(
        !made.exists(),
        "{} was not deleted with its claim",
        made.display()
    );
    Ok(())
}

/// The hostname a PV's node affinity requires.
fn affinity_node(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let requirement = terms.first()?.match_expressions.as_ref()?.first()?;
    requirement.values.as_ref()?.first().cloned()
}

/// The nodes a DaemonSet runs a pod on in the node-local test.
const NODES: usize = 2;

/// Node-local mode as kubelet would run it: the chart rendered with `mode: node-local`
/// (its own provisioner name and class names, the default ports: each pod has its own
/// network namespace and IP), applied for real, and every workload of the render run
/// from the image: each DaemonSet one pod per node on two schedulable Nodes, each
/// Deployment (should node-local mode render one) one pod on a node of its own. The
/// pods find the leader, enrol over the pod network with their pod-bound tokens, and
/// each node's claim is made and deleted in that node's pod's data directory.
#[tokio::test]
async fn the_daemonset_runs_from_the_image_as_kubelet_would() {
    prepare_modules();
    let fx = Fixture::new("kubelet-daemonset").await.expect("a fixture");
    let result = daemon_set_scenario(&fx).await;
    if let Err(error) = &result {
        panic!("{error:?}");
    }
    fx.cleanup().await;
}

async fn daemon_set_scenario(fx: &Fixture) -> anyhow::Result<()> {
    let ctx = &fx.ctx;
    let client = &ctx.client;
    // In the fixture's files: kept after a failure (the test panics while the fixture
    // lives), removed with it otherwise.
    let dir = fx.root.join("kubelet");
    std::fs::create_dir_all(&dir)?;
    let release = format!("wp-{}", random_suffix());
    let provisioner = format!("{}.install.wasm-provisioner.dev", ctx.namespace);
    let hostpath_class = format!("wasm-hostpath-{}", ctx.namespace);
    let nfs_class = format!("wasm-nfs-subdir-{}", ctx.namespace);
    let defaults: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("deploy/helm/wasm-provisioner/values.yaml"),
    )?)?;
    let mut classes = defaults["storageClasses"].clone();
    classes[0]["name"] = json!(hostpath_class);
    classes[1]["name"] = json!(nfs_class);
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "mode": "node-local",
            "provisionerName": provisioner,
            "storageClasses": classes,
        }))?,
    )?;
    let objects = helm_template(&release, &ctx.namespace, &["-f", values.to_str().unwrap()])?;
    // As the server stored them: a DaemonSet's uid makes it its pods' controller.
    let mut applied = Vec::new();
    for object in &objects {
        applied.push(apply(client, object, false).await?);
    }

    // What runs where: each DaemonSet on every test node, each Deployment on a node
    // of its own after them.
    let prefix = format!("{}-node", ctx.namespace);
    let node = |index: usize| format!("{prefix}-{index}");
    let mut plan: Vec<(&Value, String)> = Vec::new();
    for workload in applied.iter().filter(|o| o["kind"] == "DaemonSet") {
        plan.extend((0..NODES).map(|index| (workload, node(index))));
    }
    let mut extra = NODES;
    for workload in applied.iter().filter(|o| o["kind"] == "Deployment") {
        plan.push((workload, node(extra)));
        extra += 1;
    }
    ensure!(
        plan.iter().any(|(w, _)| w["kind"] == "DaemonSet"),
        "node-local mode rendered no DaemonSet: {}",
        objects.iter().map(describe).collect::<Vec<_>>().join(", ")
    );

    let image = build_image(&wasm_provisioner_tests::host::binary(), &dir)?;
    let cluster = Cluster::from_kubeconfig(&admin_kubeconfig())?;
    let network = Network::new()?;
    let mut pods: Vec<Pod> = Vec::new();
    let outcome = async {
        // The Nodes first: kubelet registers its Node before it runs pods, and the
        // leader takes a selected node it does not know for gone.
        for index in 0..extra {
            fx.schedulable_node(&node(index)).await?;
        }
        for (workload, node) in &plan {
            let owner = workload["metadata"]["name"].as_str().context("a name")?;
            // The controllers' names: <daemonset>-<5>, <deployment>-<hash>-<5>.
            let name = if workload["kind"] == "DaemonSet" {
                format!("{owner}-{}", &random_suffix()[..5])
            } else {
                format!("{owner}-{}-{}", random_suffix(), &random_suffix()[..5])
            };
            let pod_dir = dir.join("pods").join(&name);
            std::fs::create_dir_all(&pod_dir)?;
            let pod = Pod::start(
                client,
                PodSpec {
                    workload,
                    image: &image,
                    cluster: &cluster,
                    // kubelet's own, bound to the Pod object.
                    token: None,
                    dir: &pod_dir,
                    pod_name: &name,
                    node_name: node,
                    host_path_subdirs: &["hostpath", "nfs"],
                    network: Some(&network),
                },
            )
            .await
            .with_context(|| format!("starting pod {name} on {node}"))?;
            eprintln!(
                "pod {name} of {} {owner} on {node} at {}",
                workload["kind"].as_str().unwrap_or("?"),
                pod.ip()
            );
            pods.push(pod);
        }
        exercise_node_local(
            fx,
            &mut pods,
            &hostpath_class,
            &(0..NODES).map(node).collect::<Vec<_>>(),
        )
        .await
    }
    .await;
    let outcome = match outcome {
        Err(error) => {
            eprintln!(
                "kubelet test files (each pod's volumes and log under pods/) kept in {}",
                dir.display()
            );
            Err(error)
        }
        Ok(()) => {
            // kubelet's stop: SIGTERM to each, a clean exit.
            let mut stopped = Ok(());
            for pod in &mut pods {
                let status = pod.terminate(Duration::from_secs(30));
                let clean = matches!(&status, Ok(status) if status.success());
                if !clean && stopped.is_ok() {
                    stopped = Err(anyhow::anyhow!(
                        "SIGTERM should stop pod {} cleanly: {status:?}",
                        pod.name
                    ));
                }
            }
            stopped
        }
    };
    for pod in &pods {
        pod.delete_object(client).await;
    }
    delete_cluster_objects(client, &objects).await;
    fx.delete_nodes(&prefix, extra).await;
    outcome.with_context(|| {
        pods.iter()
            .map(|pod| {
                format!(
                    "pod {} on {} at {}, its log:\n{}",
                    pod.name,
                    pod.node,
                    pod.ip(),
                    pod.log_text()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

async fn exercise_node_local(
    fx: &Fixture,
    pods: &mut [Pod],
    hostpath_class: &str,
    nodes: &[String],
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    for pod in pods.iter_mut() {
        pod.wait_probe("livenessProbe", WAIT)?;
        pod.wait_probe("readinessProbe", WAIT)?;
    }
    eprintln!(
        "{} pods' probes pass after {:.1}s",
        pods.len(),
        started.elapsed().as_secs_f64()
    );
    let metrics = |pod: &Pod| -> anyhow::Result<String> {
        let (code, body) = pod.get(pod.probe_port("readinessProbe")?, "/metrics")?;
        ensure!(code == 200, "/metrics of pod {} answered {code}", pod.name);
        Ok(body)
    };
    let leader = wait_for("one pod to lead", WAIT, || async {
        for pod in pods.iter() {
            if metrics(pod)?.contains("wasm_provisioner_leader 1") {
                return Ok(Some(pod.name.clone()));
            }
        }
        Ok(None)
    })
    .await?;
    // It advertises its pod IP for the instances to enrol at: the pod network's path.
    let leases: Api<Lease> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    let advertised: std::net::SocketAddr = wait_for(
        "the leader's channel address on its Lease",
        WAIT,
        || async {
            Ok(leases
                .list(&Default::default())
                .await?
                .items
                .iter()
                .find_map(|lease| lease.annotations().get(ANNOTATION_ADDRESS)?.parse().ok()))
        },
    )
    .await?;
    let leading = pods
        .iter()
        .find(|pod| pod.name == leader)
        .context("the leader")?;
    ensure!(
        advertised.ip() == leading.ip()
            && leading
                .ports
                .get("node-calls")
                .is_none_or(|port| *port == advertised.port()),
        "the leader {leader} at {} advertises {advertised}",
        leading.ip()
    );
    eprintln!(
        "pod {leader} leads, advertising {advertised}, after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // The test plays the scheduler: each claim names its node.
    let ctx = &fx.ctx;
    for (index, node) in nodes.iter().enumerate() {
        claim(
            ctx,
            &format!("hostpath-{index}"),
            hostpath_class,
            Some(node),
        )
        .await?;
    }
    let data = |pod: &Pod| -> anyhow::Result<std::path::PathBuf> {
        Ok(pod
            .volumes
            .get("data")
            .with_context(|| format!("pod {} has no data volume", pod.name))?
            .dir
            .join("hostpath"))
    };
    let mut made = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        let volume = wait_bound(ctx, &format!("hostpath-{index}")).await?;
        let name = volume.name_any();
        let recorded = volume
            .annotations()
            .get("wasm-provisioner.dev/node")
            .cloned();
        ensure!(
            recorded.as_deref() == Some(node.as_str()),
            "PV {name} of the claim on {node} records node {recorded:?}"
        );
        ensure!(
            affinity_node(&volume).as_deref() == Some(node.as_str()),
            "PV {name} of the claim on {node} has node affinity {:?}",
            affinity_node(&volume)
        );
        // Made by that node's pod, in its data directory (its node's disk), as the
        // host's user; in no other pod's.
        let own = pods
            .iter()
            .find(|pod| &pod.node == node && pod.volumes.contains_key("data"))
            .with_context(|| format!("no pod with a data volume on {node}"))?;
        let path = data(own)?.join(&name);
        ensure!(
            path.is_dir(),
            "{} was not made in pod {}'s data volume",
            path.display(),
            own.name
        );
        use std::os::unix::fs::MetadataExt as _;
        ensure!(
            std::fs::metadata(&path)?.uid() == 65532,
            "{} is not 65532's",
            path.display()
        );
        for other in pods.iter().filter(|p| p.name != own.name) {
            if let Ok(other_data) = data(other) {
                let elsewhere = other_data.join(&name);
                ensure!(
                    !elsewhere.exists(),
                    "{} was made in pod {}'s data volume too (on {})",
                    elsewhere.display(),
                    other.name,
                    other.node
                );
            }
        }
        eprintln!(
            "PV {name} made on {node} by pod {} after {:.1}s",
            own.name,
            started.elapsed().as_secs_f64()
        );
        made.push((name, path));
    }

    // The classes reclaim with Delete: each directory goes with its claim.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for index in 0..nodes.len() {
        claims
            .delete(&format!("hostpath-{index}"), &DeleteParams::default())
            .await?;
    }
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    for (name, path) in &made {
        wait_for(&format!("PV {name} deleted"), WAIT, || async {
            Ok(volumes.get_opt(name).await?.is_none().then_some(()))
        })
        .await?;
        ensure!(
            !path.exists(),
            "{} was not deleted with its claim",
            path.display()
        );
    }
    eprintln!(
        "{} volumes made and deleted on their nodes after {:.1}s",
        made.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
