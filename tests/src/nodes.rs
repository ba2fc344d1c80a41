//! Node-local mode's test cluster: schedulable Nodes, and for each the DaemonSet's pod
//! as kubelet would report it (bound to its node, Running, with its own loopback IP)
//! with a token bound to it (what the projected volume would hold), and the flags an
//! instance on that node runs with. The instances are host processes the test starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::fixture::{Fixture, SCENARIO_LABEL, TEST_VOLUME_GRANTS};
use crate::host::free_port;

/// The instances' ServiceAccount.
pub const INSTANCE_ACCOUNT: &str = "wasm-provisioner";
/// The instances' pod label (the host's default `--instance-selector`).
pub const INSTANCE_LABEL: (&str, &str) = ("app", "wasm-provisioner-node");

/// One node and what its instance needs.
#[derive(Debug, Clone)]
pub struct TestNode {
    pub name: String,
    /// The pod's IP: 127.0.0.(index + 2), so every instance listens on the same port.
    pub ip: String,
    /// The instance's files (token, grants, logs).
    pub dir: PathBuf,
    pub token: PathBuf,
    /// The channel port every instance uses.
    pub port: u16,
}

impl TestNode {
    /// The flags of this node's instance (node-local mode, short election timings).
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--leader-elect=true".into(),
            "--mode=node-local".into(),
            format!("--node-name={}", self.name),
            format!("--pod-ip={}", self.ip),
            format!("--node-address={}:{}", self.ip, self.port),
            format!("--token-file={}", self.token.display()),
        ]
        .into_iter()
        .chain(common_flags())
        .collect()
    }
}

/// The flags of a controller (`--node-local-role=controller`: leads, serves no node) at
/// `ip`, its channel on the instances' `port` (a DaemonSet's port is the same on every
/// pod), with the instances' short election timings.
pub fn controller_flags(ip: &str, port: u16) -> Vec<String> {
    vec![
        "--leader-elect=true".into(),
        "--mode=node-local".into(),
        "--node-local-role=controller".into(),
        format!("--pod-ip={ip}"),
        format!("--node-address={ip}:{port}"),
    ]
    .into_iter()
    .chain(common_flags())
    .collect()
}

/// The flags every node-local process of the tests shares: the instances' selector and
/// short election timings.
fn common_flags() -> Vec<String> {
    vec![
        format!(
            "--instance-selector={}={}",
            INSTANCE_LABEL.0, INSTANCE_LABEL.1
        ),
        "--leader-election-lease-duration=6s".into(),
        "--leader-election-renew-deadline=4s".into(),
        "--leader-election-retry-period=1s".into(),
    ]
}

/// Writes a grants file at `path` for one node: hostpath's `/volumes` is that node's
/// data directory `data` (made here), with the tests' volume grants.
pub fn hostpath_grants(path: &Path, data: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data)?;
    let text = format!(
        "allow:\n  directories: [{}]\nmodules:\n  hostpath:\n    directories:\n      - {{ host: {}, guest: /volumes, mode: read-write }}\n{TEST_VOLUME_GRANTS}",
        data.parent().unwrap_or(data).display(),
        data.display()
    );
    std::fs::write(path, text)?;
    Ok(())
}

/// Creates a ServiceAccount of the fixture's namespace.
pub async fn service_account(fx: &Fixture, name: &str) -> anyhow::Result<()> {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace)
        .create(&PostParams::default(), &account)
        .await
        .with_context(|| format!("creating ServiceAccount {name}"))?;
    Ok(())
}

/// The namespace's ServiceAccounts (`default`, which pod admission wants, and the
/// instances'), then `count` schedulable Nodes `prefix-<i>`, each with its instance's
/// pod and token. Nodes are cluster-wide: the caller deletes them
/// ([`Fixture::delete_nodes`]).
pub async fn test_nodes(fx: &Fixture, prefix: &str, count: usize) -> anyhow::Result<Vec<TestNode>> {
    service_account(fx, "default").await?;
    service_account(fx, INSTANCE_ACCOUNT).await?;
    let port = free_port();
    let mut nodes = Vec::new();
    for index in 0..count {
        let name = format!("{prefix}-{index}");
        fx.schedulable_node(&name).await?;
        let dir = fx.root.join(&name);
        std::fs::create_dir_all(&dir)?;
        let node = TestNode {
            ip: format!("127.0.0.{}", index + 2),
            token: dir.join("token"),
            dir,
            name,
            port,
        };
        instance_pod(fx, index, &node).await?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// The DaemonSet's pod on `node`, Running with the node's IP, and a token bound to it.
async fn instance_pod(fx: &Fixture, index: usize, node: &TestNode) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    let name = format!("wasm-provisioner-{index}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { INSTANCE_LABEL.0: INSTANCE_LABEL.1 } },
        "spec": {
            "nodeName": node.name,
            "serviceAccountName": INSTANCE_ACCOUNT,
            "automountServiceAccountToken": false,
            "containers": [{ "name": "host", "image": "wasm-provisioner:test" }],
        },
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let status = json!({ "status": { "phase": "Running", "podIP": node.ip, "podIPs": [{ "ip": node.ip }] } });
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("reporting pod {name} Running"))?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["wasm-provisioner".into()],
            bound_object_ref: Some(BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: Some(name.clone()),
                uid: pod.uid(),
            }),
            expiration_seconds: Some(3600),
        },
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace)
        .create_token_request(INSTANCE_ACCOUNT, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token bound to pod {name}"))?;
    std::fs::write(&node.token, issued.status.context("no token issued")?.token)?;
    Ok(())
}

/// The hostname a PV's node affinity requires.
pub fn affinity_node(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Option<String> {
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

/// A pod `name` that mounts claim `claim`, on one of the scenario's nodes (or on
/// `node` when given). It never runs: the tests have no kubelet.
pub fn app_pod(fx: &Fixture, name: &str, claim: &str, node: Option<&str>) -> anyhow::Result<Pod> {
    let mut selector = BTreeMap::from([(SCENARIO_LABEL.to_string(), fx.ctx.namespace.clone())]);
    if let Some(node) = node {
        selector.insert("kubernetes.io/hostname".into(), node.into());
    }
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeSelector": selector,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
            }],
            "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }],
        },
    }))?)
}
