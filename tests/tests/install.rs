//! The production install, proven against the real API server (docs/install.md): the Helm chart
//! (`helm lint`, `helm template` with default and non-default values, in either mode), the
//! kustomize base and its overlays (node-local mode's among them), every rendered object
//! applied with a server-side dry run, the chart's RBAC against `deploy/rbac.yaml` and
//! node-local mode's against the overlay's, node-local mode's two pods (the controller's,
//! the node instances') against deployment mode's, the node instances' account proven to
//! read the Lease and the StorageClasses and nothing else, the image tarball's metadata
//! against the Deployment, the Deployment run from the image as kubelet would run it
//! (provision, hot reload, probes) with the dashboard's and alerts' metrics checked on
//! that host's `/metrics`, and node-local mode's two workloads run the same way (the
//! controller on a node of its own, one node instance per node, each pod in a network
//! namespace of its own: enrolment, a volume made and deleted on each claim's node).

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
    apply, build_image, describe, helm_template, helm_template_command, into_namespace,
    kustomize_build, of_kind, one, prepare_modules, run, run_expecting_failure, tool,
};
use wasm_provisioner_tests::kubelet::{Cluster, Network, Pod, PodSpec};
use wasm_provisioner_tests::nodes::affinity_node;
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
                             "prometheusRule": { "enabled": true },
                             "dashboard": { "enabled": true, "labels": { "grafana_dashboard": "1", "team": "storage" } } },
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
            "modules from OCI artifacts by digest, a private registry's CA, topology spread, a NetworkPolicy",
            json!({
                "image": { "registry": "registry.example.com:5000", "repository": "storage/wasm-provisioner",
                           "digest": format!("sha256:{}", "c".repeat(64)) },
                "modules": { "source": "oci", "oci": {
                    "hostpath": format!("registry.example.com:5000/modules/hostpath@sha256:{}", "a".repeat(64)),
                    "nfs-subdir": format!("registry.example.com:5000/modules/nfs-subdir@sha256:{}", "b".repeat(64)) } },
                "registries": [{ "host": "registry.example.com:5000", "caFile": "/etc/registry-ca/ca.crt",
                                 "pullSecret": "registry-credentials" }],
                "extraVolumes": [{ "name": "registry-ca", "configMap": { "name": "registry-ca" } }],
                "extraVolumeMounts": [{ "name": "registry-ca", "mountPath": "/etc/registry-ca", "readOnly": true }],
                "topologySpreadConstraints": [{ "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                                "whenUnsatisfiable": "ScheduleAnyway" }],
                "networkPolicy": { "enabled": true,
                    "metricsFrom": [{ "namespaceSelector": { "matchLabels": { "name": "monitoring" } } }],
                    "egress": [{ "ports": [{ "protocol": "TCP", "port": 443 }, { "protocol": "TCP", "port": 6443 },
                                           { "protocol": "UDP", "port": 53 }] }] },
                "mode": "node-local",
            }),
        ),
        (
            "modules from a PersistentVolumeClaim",
            json!({
                "modules": { "source": "volume",
                             "volume": { "persistentVolumeClaim": { "claimName": "wasm-modules", "readOnly": true } } },
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
            "node-local mode, its own port, node-gone policy and node instances' settings, a class that binds at once",
            json!({
                "mode": "node-local",
                "nodeLocal": { "port": 9444, "nodeGonePolicy": "remove", "nodeGoneGrace": "30m",
                    "instances": { "tolerations": [{ "key": "storage", "operator": "Exists" }],
                                   "nodeSelector": { "kubernetes.io/os": "linux" },
                                   "resources": { "requests": { "cpu": "50m", "memory": "64Mi" } } },
                    "serviceAccount": { "name": "nodes", "annotations": { "example.com/owner": "storage" } } },
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
        // behind a disabled feature gate would be). Node-local mode: the Deployment (the
        // controller) and the DaemonSet (the node instances).
        let node_local = !of_kind(&objects, "DaemonSet").is_empty();
        let kinds: &[&str] = if node_local {
            &["Deployment", "DaemonSet"]
        } else {
            &["Deployment"]
        };
        for kind in kinds {
            let stored = applied
                .iter()
                .find(|o| o["kind"] == *kind)
                .unwrap_or_else(|| panic!("with {what}: the server returned no {kind}"));
            let volumes = stored["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .expect("volumes");
            let modules = volumes
                .iter()
                .find(|v| v["name"] == "modules")
                .expect("a modules volume");
            assert!(
                ["configMap", "image", "emptyDir", "persistentVolumeClaim"]
                    .iter()
                    .any(|k| modules.get(*k).is_some()),
                "with {what}: the server stored a {kind} modules volume without a source: {modules}"
            );
            if *kind == "DaemonSet" {
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
        }
        eprintln!(
            "helm template with {what}: {} objects accepted by a server-side dry run: {}",
            objects.len(),
            objects.iter().map(describe).collect::<Vec<_>>().join(", ")
        );
    }
    ctx.cleanup().await;
}

/// Every alert of the PrometheusRule carries a `runbook_url`: its own section of
/// docs/runbooks.md (a heading that is the alert's name), and every section there is an
/// alert's.
#[test]
fn every_alert_links_its_runbook() {
    const BASE: &str =
        "https://github.com/wasm-provisioner/wasm-provisioner/blob/main/docs/runbooks.md#";
    let rules: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/observability/prometheus-rules.yaml"))
            .unwrap(),
    )
    .unwrap();
    let runbooks = std::fs::read_to_string(repo_root().join("docs/runbooks.md")).unwrap();
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|line| line.strip_prefix("## "))
        .map(str::to_string)
        .collect();
    let mut alerts = BTreeSet::new();
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap().to_string();
            assert_eq!(
                rule["annotations"]["runbook_url"].as_str(),
                Some(format!("{BASE}{}", alert.to_lowercase()).as_str()),
                "alert {alert}: its runbook_url"
            );
            alerts.insert(alert);
        }
    }
    assert!(alerts.len() >= 12, "{alerts:?}");
    assert_eq!(
        sections, alerts,
        "docs/runbooks.md's sections against the alerts"
    );
}

#[test]
fn bad_chart_values_fail_with_a_clear_message() {
    prepare_modules();
    let cases: [(&[&str], &str); 9] = [
        (
            &["--set", "modules.source=git"],
            "modules.source must be oci, files, configMap, image, initContainer or volume",
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
    // to node-local mode's deploy/node-local/rbac.yaml (the controller's) and
    // deploy/node-local/node-rbac.yaml (the node instances').
    for (file, target) in [
        ("rbac.yaml", "deploy/rbac.yaml"),
        ("node-local-rbac.yaml", "deploy/node-local/rbac.yaml"),
        ("node-rbac.yaml", "deploy/node-local/node-rbac.yaml"),
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

    // Node-local mode: the same plus deploy/node-local/rbac.yaml (more for the same
    // account, the controller's) and deploy/node-local/node-rbac.yaml (the node
    // instances' own account), which is what the node-local overlay grants.
    let parse_file = |path: &str| {
        wasm_provisioner_tests::install::parse_documents(
            &std::fs::read_to_string(repo_root().join(path)).unwrap(),
        )
        .unwrap()
    };
    let added = rbac_of(&parse_file("deploy/node-local/rbac.yaml"));
    let node = rbac_of(&parse_file("deploy/node-local/node-rbac.yaml"));
    assert!(
        !added.is_empty() && added.is_disjoint(&expected),
        "deploy/node-local/rbac.yaml adds nothing to deploy/rbac.yaml"
    );
    assert!(
        !node.is_empty() && node.is_disjoint(&expected) && node.is_disjoint(&added),
        "deploy/node-local/node-rbac.yaml repeats another file's objects"
    );
    let chart = rbac_of(
        &helm_template(
            "wasm-provisioner",
            "wasm-provisioner",
            &["--set", "mode=node-local"],
        )
        .unwrap(),
    );
    let all: BTreeSet<String> = expected
        .iter()
        .chain(&added)
        .chain(&node)
        .cloned()
        .collect();
    assert_eq!(
        chart, all,
        "the chart's RBAC in node-local mode is not deploy/rbac.yaml's, deploy/node-local/rbac.yaml's and deploy/node-local/node-rbac.yaml's"
    );
    let overlay =
        rbac_of(&kustomize_build("deploy/node-local").unwrap_or_else(|e| panic!("{e:#}")));
    assert_eq!(
        chart, overlay,
        "the chart's RBAC in node-local mode differs from the node-local overlay's"
    );
    // Deployment mode grants none of it.
    assert!(actual.is_disjoint(&added) && actual.is_disjoint(&node));
}

/// The subjects of the bindings among `objects` that name ServiceAccount
/// `namespace/account`: the roles it holds, as `Kind/name`.
fn roles_of(objects: &[Value], namespace: &str, account: &str) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
        .filter(|o| {
            o["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace
            })
        })
        .map(|o| {
            format!(
                "{}/{}",
                o["roleRef"]["kind"].as_str().unwrap(),
                o["roleRef"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Node-local mode's two accounts, in the overlay and in the chart: the controller (the
/// Deployment) runs as the account with deployment mode's roles and the node-local ones;
/// the node instances (the DaemonSet) as their own, bound to one Role, which may get,
/// list and watch the one Lease (named as the host names it: the provisioner name with
/// '/' made '-'), and one ClusterRole, which may read the StorageClasses (a new module
/// version is checked against them), and nothing else.
#[test]
fn node_instances_run_as_an_account_that_may_only_read_the_lease_and_the_classes() {
    prepare_modules();
    let overlay = kustomize_build("deploy/node-local").unwrap_or_else(|e| panic!("{e:#}"));
    let chart = helm_template(
        "wasm-provisioner",
        "wasm-provisioner",
        &["--set", "mode=node-local"],
    )
    .unwrap();
    let other = helm_template(
        "other",
        "elsewhere",
        &["--set", "mode=node-local,provisionerName=example.com-fast"],
    )
    .unwrap();
    for (what, objects, namespace, prefix, lease) in [
        (
            "the overlay",
            &overlay,
            "wasm-provisioner",
            "wasm-provisioner",
            "wasm-provisioner.dev",
        ),
        (
            "the chart",
            &chart,
            "wasm-provisioner",
            "wasm-provisioner",
            "wasm-provisioner.dev",
        ),
        (
            "the chart as release other",
            &other,
            "elsewhere",
            "other-wasm-provisioner",
            "example.com-fast",
        ),
    ] {
        let pod = |kind: &str| one(objects, kind)["spec"]["template"]["spec"].clone();
        let controller = pod("Deployment")["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_string();
        let node = pod("DaemonSet")["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(controller, prefix, "{what}: the Deployment's account");
        assert_eq!(
            node,
            format!("{prefix}-node"),
            "{what}: the DaemonSet's account"
        );
        let accounts: BTreeSet<&str> = of_kind(objects, "ServiceAccount")
            .iter()
            .map(|a| a["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            accounts,
            BTreeSet::from([controller.as_str(), node.as_str()]),
            "{what}: the ServiceAccounts"
        );
        assert_eq!(
            roles_of(objects, namespace, &controller),
            BTreeSet::from([
                format!("ClusterRole/{prefix}"),
                format!("Role/{prefix}-leader"),
                format!("ClusterRole/{prefix}-node-local"),
                format!("Role/{prefix}-node-local"),
            ]),
            "{what}: the controller's roles"
        );
        let role = format!("{prefix}-node");
        assert_eq!(
            roles_of(objects, namespace, &node),
            BTreeSet::from([format!("Role/{role}"), format!("ClusterRole/{role}")]),
            "{what}: the node instances' roles"
        );
        let classes = of_kind(objects, "ClusterRole")
            .into_iter()
            .find(|r| r["metadata"]["name"] == role.as_str())
            .unwrap_or_else(|| panic!("{what}: no ClusterRole {role}"));
        assert_eq!(
            classes["rules"],
            json!([{ "apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                     "verbs": ["get", "list", "watch"] }]),
            "{what}: the node instances' ClusterRole"
        );
        let granted = of_kind(objects, "Role")
            .into_iter()
            .find(|r| r["metadata"]["name"] == role.as_str())
            .unwrap_or_else(|| panic!("{what}: no Role {role}"));
        assert_eq!(granted["metadata"]["namespace"], namespace, "{what}");
        assert_eq!(
            granted["rules"],
            json!([{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                     "resourceNames": [lease], "verbs": ["get", "list", "watch"] }]),
            "{what}: the node instances' Role"
        );
    }
}

/// The lease name of the kustomize install (its default provisioner name).
const LEASE: &str = "wasm-provisioner.dev";

/// `result` is the API server's refusal (403) of what `what` tried.
fn refused<T>(what: &str, result: Result<T, kube::Error>) -> anyhow::Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        Err(error) => anyhow::bail!("{what}: expected a 403, got {error}"),
        Ok(_) => anyhow::bail!("{what}: allowed"),
    }
}

/// What the API server says `client` may do in `namespace` (a SelfSubjectRulesReview):
/// every resource rule as `group/resource verb name` (`*` for any name), and the
/// non-resource rules as `verb path`.
async fn rules_of(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
    use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_string()),
        },
        ..Default::default()
    };
    let status = Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?
        .status
        .context("a SelfSubjectRulesReview without status")?;
    ensure!(
        !status.incomplete,
        "the rules review is incomplete: {:?}",
        status.evaluation_error
    );
    let mut resources = BTreeSet::new();
    for rule in status.resource_rules {
        let names = rule.resource_names.clone().filter(|n| !n.is_empty());
        let names = names.unwrap_or_else(|| vec!["*".to_string()]);
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in &names {
                        resources.insert(format!("{group}/{resource} {verb} {name}"));
                    }
                }
            }
        }
    }
    let mut non_resources = BTreeSet::new();
    for rule in status.non_resource_rules {
        for verb in &rule.verbs {
            for path in rule.non_resource_urls.iter().flatten() {
                non_resources.insert(format!("{verb} {path}"));
            }
        }
    }
    Ok((resources, non_resources))
}

/// The node instances' account, applied from the node-local overlay with all its RBAC
/// into a test namespace, on the real API server: with a token of it (TokenRequest) a
/// client can get, list and watch the Lease (list and watch selecting it by name, as the
/// host's watch does) and the StorageClasses, and is refused everything the controller's
/// account may do and more: PVs, claims, Events, the Lease's writes, TokenReviews,
/// Secrets, CSIStorageCapacities, ConfigMaps, pods, nodes, class writes. And all it may do
/// in the namespace (SelfSubjectRulesReview) is that, beside what every authenticated
/// account may do (an account bound to nothing, asked the same); in another namespace,
/// only the StorageClasses' read.
#[tokio::test]
async fn the_node_instances_account_reads_the_lease_and_the_classes_and_nothing_else() {
    prepare_modules();
    let ctx = TestContext::new("node-rbac").await.expect("a namespace");
    let result = node_account_scenario(&ctx).await;
    ctx.cleanup().await;
    if let Err(error) = result {
        panic!("{error:?}");
    }
}

async fn node_account_scenario(ctx: &TestContext) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let client = &ctx.client;
    let namespace = &ctx.namespace;
    let uid = Api::<Namespace>::all(client.clone())
        .get(namespace)
        .await?
        .uid()
        .context("the namespace's uid")?;
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let rbac: Vec<Value> = kustomize_build("deploy/node-local")?
        .into_iter()
        .filter(|o| rbac_kinds.iter().any(|k| o["kind"] == *k))
        .collect();
    let objects = into_namespace(&rbac, "wasm-provisioner", namespace, &uid);
    eprintln!(
        "applying {}",
        objects.iter().map(describe).collect::<Vec<_>>().join(", ")
    );
    let mut outcome = Ok(());
    for object in &objects {
        if let Err(error) = apply(client, object, false).await {
            outcome = Err(error);
            break;
        }
    }
    if outcome.is_ok() {
        outcome = node_account_checks(ctx).await;
    }
    for object in objects
        .iter()
        .filter(|o| o["metadata"]["namespace"].is_null())
    {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let _ = match object["kind"].as_str() {
            Some("ClusterRole") => Api::<ClusterRole>::all(client.clone())
                .delete(name, &DeleteParams::default())
                .await
                .map(drop),
            Some("ClusterRoleBinding") => Api::<ClusterRoleBinding>::all(client.clone())
                .delete(name, &DeleteParams::default())
                .await
                .map(drop),
            _ => Ok(()),
        };
    }
    outcome
}

async fn node_account_checks(ctx: &TestContext) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
    use k8s_openapi::api::storage::v1::CSIStorageCapacity;
    use kube::api::{
        ApiResource, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams,
    };
    use wasm_provisioner_tests::cluster::client_with_token;

    let client = &ctx.client;
    let namespace = ctx.namespace.as_str();
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    for name in [LEASE, "another-lease"] {
        leases
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "spec": { "holderIdentity": "someone" },
                }))?,
            )
            .await?;
    }
    let token = service_account_token(client, namespace, "wasm-provisioner-node").await?;
    let node = client_with_token(&token).await?;
    let node_leases: Api<Lease> = Api::namespaced(node.clone(), namespace);

    // The RoleBinding reaches the authorizer's cache shortly after it is made.
    wait_for("the node account to read the Lease", WAIT, || async {
        match node_leases.get(LEASE).await {
            Ok(lease) => Ok(Some(lease)),
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
            Err(error) => Err(error.into()),
        }
    })
    .await?;

    // What it may do: get, list and watch the one Lease, selected by name.
    let by_name = format!("metadata.name={LEASE}");
    let listed = node_leases
        .list(&ListParams::default().fields(&by_name))
        .await
        .context("listing the Lease by name")?;
    ensure!(
        listed
            .items
            .iter()
            .map(|l| l.name_any())
            .collect::<Vec<_>>()
            == [LEASE],
        "listing the Lease by name found {:?}",
        listed
            .items
            .iter()
            .map(|l| l.name_any())
            .collect::<Vec<_>>()
    );
    let version = listed.metadata.resource_version.clone().unwrap_or_default();
    let mut events = node_leases
        .watch(
            &WatchParams::default().fields(&by_name).timeout(60),
            &version,
        )
        .await
        .context("watching the Lease by name")?
        .boxed();
    leases
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "holderIdentity": "someone-else" } })),
        )
        .await?;
    let seen = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            match event? {
                WatchEvent::Modified(lease)
                    if lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.as_deref())
                        == Some("someone-else") =>
                {
                    return Ok(lease);
                }
                WatchEvent::Error(error) => anyhow::bail!("the watch failed: {error:?}"),
                _ => {}
            }
        }
        anyhow::bail!("the watch ended before the Lease changed")
    })
    .await
    .context("the Lease's change never reached the watch")??;
    eprintln!("the node account watched {} change holder", seen.name_any());

    // What it may not do. Writes are dry runs: a grant by mistake changes nothing (a
    // refusal comes before the object is even read).
    let post = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let patch = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let delete = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    let label = Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } }));
    let dynamic = |resource: &ApiResource, namespaced: bool| -> Api<DynamicObject> {
        if namespaced {
            Api::namespaced_with(node.clone(), namespace, resource)
        } else {
            Api::all_with(node.clone(), resource)
        }
    };
    let object = |resource: &ApiResource, name: &str, namespaced: bool| {
        let mut object = DynamicObject::new(name, resource);
        if namespaced {
            object = object.within(namespace);
        }
        object
    };
    let cases: [(ApiResource, bool, &[&str]); 12] = [
        (
            ApiResource::erase::<PersistentVolume>(&()),
            false,
            &["get", "list", "create", "update", "patch", "delete"],
        ),
        (
            ApiResource::erase::<PersistentVolumeClaim>(&()),
            true,
            &["get", "list", "create", "update", "patch", "delete"],
        ),
        (ApiResource::erase::<Event>(&()), true, &["create", "patch"]),
        (
            ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()),
            true,
            &["create", "patch"],
        ),
        (
            ApiResource::erase::<Lease>(&()),
            true,
            &["list", "create", "update", "patch", "delete"],
        ),
        (ApiResource::erase::<TokenReview>(&()), false, &["create"]),
        (
            ApiResource::erase::<Secret>(&()),
            true,
            &["get", "list", "create"],
        ),
        (
            ApiResource::erase::<CSIStorageCapacity>(&()),
            true,
            &["get", "list", "create", "update", "patch", "delete"],
        ),
        (
            ApiResource::erase::<ConfigMap>(&()),
            true,
            &["get", "list", "create", "update", "patch"],
        ),
        (ApiResource::erase::<Pod>(&()), true, &["get", "list"]),
        (ApiResource::erase::<Node>(&()), false, &["get", "list"]),
        (
            ApiResource::erase::<StorageClass>(&()),
            false,
            &["create", "update", "patch", "delete"],
        ),
    ];
    let mut tried = 0;
    for (resource, namespaced, verbs) in &cases {
        let api = dynamic(resource, *namespaced);
        // The Lease's own name for the Lease (what it may read, it may not write).
        let name = if resource.kind == "Lease" { LEASE } else { "x" };
        let body = object(resource, name, *namespaced);
        for verb in *verbs {
            let what = format!("{verb} {} {name}", resource.plural);
            let result = match *verb {
                "get" => api.get(name).await.map(drop),
                "list" => api.list(&ListParams::default()).await.map(drop),
                "create" => api.create(&post, &body).await.map(drop),
                "update" => api.replace(name, &post, &body).await.map(drop),
                "patch" => api.patch(name, &patch, &label).await.map(drop),
                "delete" => api.delete(name, &delete).await.map(drop),
                other => unreachable!("{other}"),
            };
            refused(&what, result)?;
            tried += 1;
        }
    }
    refused("get another Lease", node_leases.get("another-lease").await)?;
    // The StorageClasses it may read (and only read).
    Api::<StorageClass>::all(node.clone())
        .list(&ListParams::default())
        .await
        .context("the node account listing the StorageClasses")?;
    refused(
        "watch every Lease",
        match node_leases
            .watch(&WatchParams::default().timeout(5), "0")
            .await
        {
            Ok(stream) => match stream.boxed().next().await {
                Some(Ok(WatchEvent::Error(status))) if status.code == 403 => {
                    Err(kube::Error::Api(status))
                }
                Some(Err(error)) => Err(error),
                other => Ok(format!("{other:?}")),
            },
            Err(error) => Err(error),
        },
    )?;
    eprintln!(
        "the node account was refused {tried} requests, another Lease and a watch of every Lease"
    );

    // All it may do, as the API server tells it: the Lease's rule beside what every
    // account may do (an account bound to nothing, in the same namespace).
    let nobody_token = service_account_token(client, namespace, "bound-to-nothing").await?;
    let nobody = client_with_token(&nobody_token).await?;
    let (rules, non_resource) = rules_of(&node, namespace).await?;
    let (baseline, baseline_non_resource) = rules_of(&nobody, namespace).await?;
    // The StorageClasses' rule is cluster-wide: the review shows it in every namespace.
    let class_rules: BTreeSet<String> = ["get", "list", "watch"]
        .iter()
        .map(|verb| format!("storage.k8s.io/storageclasses {verb} *"))
        .collect();
    let lease_rules: BTreeSet<String> = ["get", "list", "watch"]
        .iter()
        .map(|verb| format!("coordination.k8s.io/leases {verb} {LEASE}"))
        .chain(class_rules.iter().cloned())
        .collect();
    eprintln!("every account may: {baseline:?}");
    ensure!(
        rules
            == baseline
                .union(&lease_rules)
                .cloned()
                .collect::<BTreeSet<_>>(),
        "the node account may do, in its namespace, {:?} beyond what any account may, and lacks {:?}",
        rules.difference(&baseline).collect::<Vec<_>>(),
        lease_rules.difference(&rules).collect::<Vec<_>>()
    );
    ensure!(
        non_resource == baseline_non_resource,
        "non-resource rules: {non_resource:?} versus {baseline_non_resource:?}"
    );
    // What every account may do is to ask what it may do (and who it is): nothing of
    // the install's resources.
    ensure!(
        baseline
            .iter()
            .all(|rule| rule.starts_with("authorization.k8s.io/")
                || rule.starts_with("authentication.k8s.io/")),
        "every account may do more than ask about itself here: {baseline:?}"
    );
    // Elsewhere, nothing of its own.
    let (elsewhere, _) = rules_of(&node, "default").await?;
    let (baseline_elsewhere, _) = rules_of(&nobody, "default").await?;
    ensure!(
        elsewhere
            == baseline_elsewhere
                .union(&class_rules)
                .cloned()
                .collect::<BTreeSet<_>>(),
        "in namespace default the node account may do {:?} beyond what any account may",
        elsewhere
            .difference(&baseline_elsewhere)
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// `metrics.dashboard.enabled` ships deploy/observability/dashboard.json, byte for
/// byte, as a ConfigMap the Grafana sidecar finds by its default label; off by default.
#[test]
fn the_chart_ships_the_dashboard_for_grafana_s_sidecar() {
    prepare_modules();
    let name = "wasm-provisioner-dashboard";
    let default = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    assert!(
        of_kind(&default, "ConfigMap")
            .iter()
            .all(|c| c["metadata"]["name"] != name),
        "the dashboard is off by default"
    );
    let rendered = helm_template(
        "wasm-provisioner",
        "wasm-provisioner",
        &["--set", "metrics.dashboard.enabled=true"],
    )
    .unwrap();
    let dashboard = of_kind(&rendered, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == name)
        .expect("the dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/observability/dashboard.json")).unwrap();
    let json = dashboard["data"]["wasm-provisioner.json"].as_str().unwrap();
    assert_eq!(json, shipped.trim_end(), "the dashboard, byte for byte");
    let parsed: Value = serde_json::from_str(json).unwrap();
    assert!(parsed["panels"].as_array().is_some_and(|p| !p.is_empty()));
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
    let with_alerts = kustomize_build("examples/with-alerts").unwrap_or_else(|e| panic!("{e:#}"));

    // What the chart has beside the Deployment, the base has too: a PodDisruptionBudget
    // and a metrics Service that select the Deployment's pods, and (as a component) the
    // alerts, deploy/observability/prometheus-rules.yaml as it is, in the namespace.
    let pod_labels = &one(&base, "Deployment")["spec"]["template"]["metadata"]["labels"];
    let budget = one(&base, "PodDisruptionBudget");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], pod_labels);
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    let service = one(&base, "Service");
    assert_eq!(&service["spec"]["selector"], pod_labels);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert!(of_kind(&base, "PrometheusRule").is_empty());
    let rule = one(&with_alerts, "PrometheusRule");
    let shipped: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/observability/prometheus-rules.yaml"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(rule["spec"], shipped["spec"]);
    assert_eq!(rule["metadata"]["namespace"], "wasm-provisioner");
    assert_eq!(with_alerts.len(), base.len() + 1);

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

    // Node-local mode: the base's ConfigMaps (the same names: both workloads follow the
    // hashed grants), the base's Deployment as the controller and a DaemonSet of node
    // instances (checked further by
    // `node_local_mode_renders_a_controller_node_instances_a_csi_driver_and_waiting_classes`).
    assert_eq!(
        of_kind(&node_local, "ConfigMap"),
        of_kind(&base, "ConfigMap"),
        "the node-local overlay's ConfigMaps differ from the base's"
    );
    for kind in ["Deployment", "DaemonSet"] {
        assert!(
            one(&node_local, kind)["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["configMap"]["name"] == grants["metadata"]["name"]),
            "the node-local {kind} mounts the hashed grants ConfigMap"
        );
    }

    // One namespace may serve two builds (deploy/ and deploy/node-local/): the ones made
    // are deleted after every dry run, as a namespace being deleted takes no objects.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut made = Vec::new();
    let mut failure = None;
    for (what, objects) in [
        ("deploy/", &base),
        ("the overlay", &overlay),
        ("deploy/node-local/", &node_local),
        ("examples/with-alerts", &with_alerts),
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
    // deploy/deployment/deployment.yaml names the same image.
    let raw: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/deployment/deployment.yaml")).unwrap(),
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
        &std::fs::read_to_string(repo_root().join("deploy/deployment/deployment.yaml")).unwrap(),
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

/// Whether a `matchLabels` selector selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .expect("a matchLabels selector")
        .iter()
        .all(|(key, value)| &labels[key] == value)
}

/// What node-local mode adds to a pod template: the entries of `template`'s container
/// args, env, ports and volume mounts, and of its pod's volumes, after `base`'s (which
/// they must start with), as `{"args": [...], "env": [...], ...}`. Any other difference
/// between the two pod templates is an error.
fn additions_to(base: &Value, template: &Value) -> Result<Value, String> {
    let mut rest = template.clone();
    let mut additions = json!({});
    for (name, pointer) in [
        ("args", "/spec/containers/0/args"),
        ("env", "/spec/containers/0/env"),
        ("ports", "/spec/containers/0/ports"),
        ("volumeMounts", "/spec/containers/0/volumeMounts"),
        ("volumes", "/spec/volumes"),
    ] {
        let before = base
            .pointer(pointer)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let after = rest
            .pointer_mut(pointer)
            .and_then(Value::as_array_mut)
            .ok_or(format!("the pod has no {name}"))?;
        if !after.starts_with(&before) {
            return Err(format!(
                "its {name} do not start with deployment mode's: {}\nversus {}",
                Value::Array(after.clone()),
                Value::Array(before)
            ));
        }
        additions[name] = Value::Array(after.split_off(before.len()));
    }
    if &rest != base {
        return Err(format!(
            "the pods differ in more than the node-local additions:\nnode-local, without them: {rest}\ndeployment mode: {base}"
        ));
    }
    Ok(additions)
}

/// Deployment mode's pod template as node-local mode's node instances start from it:
/// without the leader-election flags (an instance never elects), with the DaemonSet's
/// ServiceAccount and pod labels (which the callers check differ from the Deployment's).
fn as_node_instance(deployment_pod: &Value, daemon_set_pod: &Value) -> Value {
    let mut pod = deployment_pod.clone();
    if let Some(args) = pod
        .pointer_mut("/spec/containers/0/args")
        .and_then(Value::as_array_mut)
    {
        args.retain(|arg| !arg.as_str().unwrap_or("").starts_with("--leader-elect"));
    }
    pod["spec"]["serviceAccountName"] = daemon_set_pod["spec"]["serviceAccountName"].clone();
    pod["metadata"]["labels"] = daemon_set_pod["metadata"]["labels"].clone();
    pod
}

/// Node-local mode runs deployment mode's pod twice, the same in the chart and the
/// kustomize overlay: as the controller (the Deployment, plus the controller role's
/// flags, the pod's IP and the channel's port) and as the node instances (the DaemonSet:
/// without the election flags, plus the node role's flags, the channel's port and the
/// projected token, under its own ServiceAccount and labels). Hardened the same, with the
/// same resources, probes, volumes and data directory: a change to the base's pod that
/// either misses, or an addition one of the installs lacks, fails here.
#[test]
fn node_local_mode_runs_deployment_mode_s_pod_as_controller_and_as_node_instances() {
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
        let base = &one(deployment_mode, "Deployment")["spec"]["template"];
        let controller = &one(node_local_mode, "Deployment")["spec"]["template"];
        let daemon_set = one(node_local_mode, "DaemonSet");
        let node = &daemon_set["spec"]["template"];

        let mut controller_additions = additions_to(base, controller)
            .unwrap_or_else(|e| panic!("{what}, the controller: {e}"));
        // --instance-selector selects the DaemonSet's pods (the chart's carry the
        // release's labels, so its value is the chart's own).
        let args = controller_additions["args"].as_array_mut().unwrap();
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

        // The node instances: their own account and labels, no election flag.
        assert_ne!(
            node["spec"]["serviceAccountName"], base["spec"]["serviceAccountName"],
            "{what}: the node instances run as the controller's ServiceAccount"
        );
        assert!(
            !selects(
                &daemon_set["spec"]["selector"]["matchLabels"],
                &base["metadata"]["labels"]
            ),
            "{what}: the DaemonSet's selector selects the Deployment's pods"
        );
        let node_args = node["spec"]["containers"][0]["args"].as_array().unwrap();
        assert!(
            !node_args
                .iter()
                .any(|a| a.as_str().unwrap().starts_with("--leader-elect")),
            "{what}: the node instances take part in the election: {node_args:?}"
        );
        let node_additions = additions_to(&as_node_instance(base, node), node)
            .unwrap_or_else(|e| panic!("{what}, the node instances: {e}"));
        // Said once more, for the reader: hardened as the Deployment.
        for pointer in [
            "/spec/securityContext",
            "/spec/containers/0/securityContext",
            "/spec/containers/0/resources",
            "/spec/containers/0/livenessProbe",
            "/spec/containers/0/readinessProbe",
        ] {
            assert_eq!(
                node.pointer(pointer),
                base.pointer(pointer),
                "{what}: {pointer}"
            );
        }
        assert_eq!(
            daemon_set["spec"]["updateStrategy"],
            json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } }),
            "{what}"
        );
        found.push(json!({ "controller": controller_additions, "node": node_additions }));
    }
    assert_eq!(
        found[0], found[1],
        "the chart's node-local additions differ from the overlay's"
    );
    // What they are (docs/install.md, "Node-local mode"; the host's flags and defaults):
    // the mode and role; the controller's channel address and port, pod IP (advertised
    // on the Lease for enrolment) and node-gone policy; the node instances' channel
    // address and port and the projected pod-bound token at --token-file's default.
    let node_calls = json!([{ "name": "node-calls", "containerPort": 9443 }]);
    assert_eq!(
        found[0],
        json!({
            "controller": {
                "args": ["--mode=node-local", "--node-local-role=controller",
                         "--node-address=0.0.0.0:9443",
                         "--node-gone-policy=keep", "--node-gone-grace=1h"],
                "env": [{ "name": "WASM_PROVISIONER_POD_IP",
                          "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }],
                "ports": node_calls,
                "volumeMounts": [],
                "volumes": [],
            },
            "node": {
                "args": ["--mode=node-local", "--node-local-role=node",
                         "--node-address=0.0.0.0:9443"],
                "env": [],
                "ports": node_calls,
                "volumeMounts": [{ "name": "token", "mountPath": "/var/run/secrets/wasm-provisioner",
                                   "readOnly": true }],
                "volumes": [{ "name": "token", "projected": { "sources": [{ "serviceAccountToken": {
                    "audience": "wasm-provisioner", "expirationSeconds": 3600, "path": "token" } }] } }],
            },
        })
    );
}

/// Node-local mode, in the overlay and in the chart: deployment mode's Deployment (the
/// same name, selector and replicas, so an upgrade changes it in place; the chart's
/// PodDisruptionBudget with it) as the controller, a DaemonSet of node instances whose
/// pods no other selector of the install selects and whose selector selects no other
/// pod, the CSIDriver that makes the scheduler read the published capacity, named as the
/// classes' provisioner, and every class WaitForFirstConsumer. The chart takes the port,
/// the node-gone policy and the instances' scheduling and resources from its values, and
/// a class's own binding mode wins; deployment mode renders none of it.
#[test]
fn node_local_mode_renders_a_controller_node_instances_a_csi_driver_and_waiting_classes() {
    prepare_modules();
    let build = |dir: &str| kustomize_build(dir).unwrap_or_else(|e| panic!("{e:#}"));
    let base = build("deploy");
    let overlay = build("deploy/node-local");
    let deployment_mode = helm_template("wasm-provisioner", "wasm-provisioner", &[]).unwrap();
    let chart = helm_template(
        "wasm-provisioner",
        "wasm-provisioner",
        &["--set", "mode=node-local"],
    )
    .unwrap();
    for (what, objects, before) in [
        ("the overlay", &overlay, &base),
        ("the chart", &chart, &deployment_mode),
    ] {
        let controller = one(objects, "Deployment");
        let daemon_set = one(objects, "DaemonSet");
        let deployment = one(before, "Deployment");
        for pointer in ["/metadata/name", "/spec/selector", "/spec/replicas"] {
            assert_eq!(
                controller.pointer(pointer),
                deployment.pointer(pointer),
                "{what}: the controller's {pointer} is not deployment mode's"
            );
        }
        assert_ne!(
            daemon_set["metadata"]["name"], controller["metadata"]["name"],
            "{what}"
        );
        let labels = |workload: &Value| workload["spec"]["template"]["metadata"]["labels"].clone();
        let (controller_pods, node_pods) = (labels(controller), labels(daemon_set));
        let controller_selector = &controller["spec"]["selector"]["matchLabels"];
        let node_selector = &daemon_set["spec"]["selector"]["matchLabels"];
        assert!(selects(controller_selector, &controller_pods), "{what}");
        assert!(selects(node_selector, &node_pods), "{what}");
        assert!(
            !selects(controller_selector, &node_pods) && !selects(node_selector, &controller_pods),
            "{what}: the Deployment's and the DaemonSet's selectors overlap"
        );
        // Every other selector (the chart's PodDisruptionBudget and metrics Services)
        // selects one workload's pods, never both.
        for object in objects
            .iter()
            .filter(|o| o["kind"] == "PodDisruptionBudget" || o["kind"] == "Service")
        {
            let selector = if object["kind"] == "Service" {
                &object["spec"]["selector"]
            } else {
                &object["spec"]["selector"]["matchLabels"]
            };
            assert!(
                selects(selector, &controller_pods) != selects(selector, &node_pods),
                "{what}: {} selects the pods of both workloads, or of neither",
                describe(object)
            );
        }
        assert_eq!(
            of_kind(objects, "PodDisruptionBudget"),
            of_kind(before, "PodDisruptionBudget"),
            "{what}: the PodDisruptionBudget is not deployment mode's"
        );
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
            "--set",
            "nodeSelector.role=control,nodeLocal.instances.nodeSelector.role=storage",
            "--set",
            "nodeLocal.instances.tolerations[0].operator=Exists,nodeLocal.instances.resources.requests.cpu=50m",
        ],
    )
    .unwrap();
    let pod = |kind: &str| one(&custom, kind)["spec"]["template"]["spec"].clone();
    let (controller, node) = (pod("Deployment"), pod("DaemonSet"));
    let args = |pod: &Value| -> Vec<String> {
        pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    for pod in [&controller, &node] {
        assert!(args(pod).contains(&"--node-address=0.0.0.0:9444".to_string()));
        assert!(
            pod["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .contains(&json!({ "name": "node-calls", "containerPort": 9444 }))
        );
    }
    for arg in ["--node-gone-policy=remove", "--node-gone-grace=30m"] {
        assert!(args(&controller).contains(&arg.to_string()), "no {arg}");
        assert!(
            !args(&node).iter().any(|a| a.starts_with("--node-gone")),
            "the node instances have the controller's {arg}"
        );
    }
    assert_eq!(controller["nodeSelector"], json!({ "role": "control" }));
    assert_eq!(controller["tolerations"], Value::Null);
    assert_eq!(
        controller["containers"][0]["resources"]["requests"]["cpu"],
        "100m"
    );
    assert_eq!(node["nodeSelector"], json!({ "role": "storage" }));
    assert_eq!(node["tolerations"], json!([{ "operator": "Exists" }]));
    assert_eq!(node["containers"][0]["resources"]["requests"]["cpu"], "50m");
    assert_eq!(
        one(&custom, "StorageClass")["volumeBindingMode"],
        "Immediate"
    );

    assert!(of_kind(&deployment_mode, "DaemonSet").is_empty());
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
        Ok(leads(&metrics(pod)?).then_some(()))
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
    // And a failed delete: nfs-subdir, which made nfs-1's volume, is gone now.
    claims.delete("nfs-1", &DeleteParams::default()).await?;
    let outcome = wait_for(
        "a failed attempt, a delete and a failed delete counted",
        WAIT,
        || async {
            let text = metrics(pod)?;
            let failed = text.contains(&format!(
                "controller_persistentvolumeclaim_provision_failed_total{{class=\"{failing}\""
            ));
            let deleted = text.contains(&format!(
                "controller_persistentvolume_delete_total{{class=\"{hostpath_class}\"}} 1"
            ));
            let delete_failed = text.contains(&format!(
                "controller_persistentvolume_delete_failed_total{{class=\"{nfs_class}\"}}"
            ));
            Ok((failed && deleted && delete_failed).then_some(()))
        },
    )
    .await;
    let _ = classes.delete(&failing, &DeleteParams::default()).await;
    // The volume whose module is gone keeps its PV (no orphan): the test lets it go.
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let _ = volumes
        .patch(
            &nfs_volume.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await;
    let _ = volumes
        .delete(&nfs_volume.name_any(), &DeleteParams::default())
        .await;
    outcome?;
    ensure!(
        !made.exists(),
        "{} was not deleted with its claim",
        made.display()
    );
    Ok(())
}

/// Whether a host's `/metrics` says it leads: the gauge's sample line, not its HELP line
/// (which reads "wasm_provisioner_leader 1 while this process holds...").
fn leads(metrics: &str) -> bool {
    metrics
        .lines()
        .any(|line| line.trim() == "wasm_provisioner_leader 1")
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
            if leads(&metrics(pod)?) {
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
