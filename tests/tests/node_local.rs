//! Node-local mode on the real control plane: three "nodes" (Ready Node objects the
//! scheduler uses), one host instance per node (each with its own data directory
//! standing for its disk, and a pod object bound to its node whose pod-bound token it
//! enrols with), 30 pods with WaitForFirstConsumer claims placed by kube-scheduler.
//! Every volume must be made by the instance of the node its pod was scheduled to,
//! recorded on its PV, and deleted there; a node whose instance is down keeps its claim
//! Pending with an Event naming the node, and binds once the instance is back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::{admin_kubeconfig, service_account_token, wait_for};
use wasm_provisioner_tests::fixture::{Fixture, WAIT, scenario};
use wasm_provisioner_tests::host::{Host, HostConfig};
use wasm_provisioner_tests::kubeconfig;
use wasm_provisioner_tests::metrics::host_watches;
use wasm_provisioner_tests::nodes::{
    INSTANCE_ACCOUNT, affinity_node, app_pod, controller_flags, hostpath_grants, test_nodes,
};

const NODES: usize = 3;
const PODS: usize = 30;

/// One node's instance: its data directory, how to start it.
struct Instance {
    node: String,
    data: PathBuf,
    /// The channel port (the same for every instance, as a DaemonSet's).
    port: u16,
    config: HostConfig,
}

/// `count` nodes and their instances (not started), with `extra` flags.
async fn instances(
    fx: &Fixture,
    prefix: &str,
    count: usize,
    extra: &[&str],
) -> anyhow::Result<Vec<Instance>> {
    instances_on(fx, prefix, count, extra, |_| None).await
}

/// [`instances`], node `i`'s data directory under `data_root(i)` when given (another
/// filesystem, standing for another disk).
async fn instances_on(
    fx: &Fixture,
    prefix: &str,
    count: usize,
    extra: &[&str],
    data_root: impl Fn(usize) -> Option<PathBuf>,
) -> anyhow::Result<Vec<Instance>> {
    let mut instances = Vec::new();
    for (index, node) in test_nodes(fx, prefix, count).await?.into_iter().enumerate() {
        let grants = node.dir.join("grants.yaml");
        let data = data_root(index)
            .unwrap_or_else(|| node.dir.join("data"))
            .join("hostpath");
        hostpath_grants(&grants, &data)?;
        let mut args = node.flags();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut config = fx.host_config(&args);
        config.grants = Some(grants);
        config.log_dir = node.dir.join("logs");
        instances.push(Instance {
            node: node.name,
            data,
            port: node.port,
            config,
        });
    }
    Ok(instances)
}

/// The names of the volumes (directories) in a node's data directory.
fn directories(data: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("pvc-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Which of the running hosts leads.
fn leader(hosts: &[Option<Host>]) -> anyhow::Result<usize> {
    hosts
        .iter()
        .position(|host| {
            host.as_ref()
                .and_then(|h| h.metric("wasm_provisioner_leader"))
                == Some(1.0)
        })
        .context("no instance leads")
}

fn logs(hosts: &[Option<Host>]) -> String {
    hosts
        .iter()
        .flatten()
        .map(|host| host.log_tail())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

#[tokio::test]
async fn each_volume_is_made_and_deleted_by_its_node_s_instance() {
    scenario("node-local", async |fx| {
        let prefix = format!("nl-{}", fx.ctx.namespace);
        let result = async {
            fx.install_module("hostpath", "hostpath");
            let instances = instances(fx, &prefix, NODES, &[]).await?;
            let mut hosts: Vec<Option<Host>> = Vec::new();
            for instance in &instances {
                hosts.push(Some(Host::start(&instance.config)?));
            }
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for i in 0..PODS {
                let claim = format!("data-{i}");
                fx.claim(&claim, &class, "1Mi", json!({})).await?;
                pods.create(&PostParams::default(), &app_pod(fx, &format!("app-{i}"), &claim, None)?)
                    .await?;
            }
            let mut per_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for i in 0..PODS {
                let (claim, pod_name) = (format!("data-{i}"), format!("app-{i}"));
                let pv = fx.wait_bound(&claim).await.with_context(|| logs(&hosts))?;
                let node = wait_for(&format!("pod {pod_name} to be bound to a node"), WAIT, || async {
                    Ok(pods.get(&pod_name).await?.spec.and_then(|s| s.node_name))
                })
                .await?;
                let recorded = pv.annotations().get("wasm-provisioner.dev/node").cloned();
                ensure!(
                    recorded.as_deref() == Some(node.as_str()) && affinity_node(&pv).as_deref() == Some(node.as_str()),
                    "claim {claim}: its pod is on {node}, its PV {} records {recorded:?} and is pinned to {:?}",
                    pv.name_any(),
                    affinity_node(&pv)
                );
                per_node.entry(node).or_default().push(pv.name_any());
            }
            ensure!(per_node.len() >= 2, "the scheduler used one node only: {per_node:?}");
            let leader = leader(&hosts)?;
            let sent = hosts[leader]
                .as_ref()
                .and_then(|host| host.metric(r#"wasm_provisioner_node_call_duration_seconds_count{outcome="ok"}"#))
                .unwrap_or(0.0);
            ensure!(sent > 0.0, "the leader sent no call to another node's instance");
            // What each costs the API server: the other instances are enrolled and hold
            // no watch (of claims, PVs or anything); the leader watches claims and PVs.
            for (i, host) in hosts.iter().enumerate().filter(|(i, _)| *i != leader) {
                let host = host.as_ref().context("every instance runs")?;
                ensure!(
                    host.metric("wasm_provisioner_node_enrolled") == Some(1.0),
                    "instance {i} is not enrolled with the leader:\n{}",
                    host.log_text()
                );
                let watches = host_watches(host)?;
                ensure!(watches.open.is_empty(), "instance {i}, not the leader, holds watches: {watches:?}");
            }
            let leading = host_watches(hosts[leader].as_ref().context("the leader runs")?)?;
            ensure!(
                ["persistentvolumeclaims", "persistentvolumes"]
                    .iter()
                    .all(|resource| leading.open.get(*resource) == Some(&1.0))
                    && leading.bytes > 0.0,
                "the leader's watches: {leading:?}"
            );
            for instance in &instances {
                let mut expected = per_node.get(&instance.node).cloned().unwrap_or_default();
                expected.sort();
                ensure!(
                    directories(&instance.data) == expected,
                    "node {}: its data directory holds {:?}, its volumes are {expected:?}",
                    instance.node,
                    directories(&instance.data)
                );
            }

            // One node's instance down: its claim waits, with an Event naming the node;
            // it binds once the instance is back. (Not the leader's node: the leader
            // serves its own node in process.)
            let down = (leader + 1) % NODES;
            hosts[down].take().expect("running").kill();
            fx.claim("waiting", &class, "1Mi", json!({})).await?;
            pods.create(
                &PostParams::default(),
                &app_pod(fx, "app-waiting", "waiting", Some(&instances[down].node))?,
            )
            .await?;
            let event = fx.wait_claim_event("waiting", "ProvisioningFailed").await.with_context(|| logs(&hosts))?;
            ensure!(
                event.contains(&instances[down].node),
                "the Event does not name the node whose instance is down: {event}"
            );
            ensure!(
                fx.claims().get("waiting").await?.status.and_then(|s| s.phase).as_deref() == Some("Pending"),
                "the claim of the node whose instance is down must stay Pending"
            );
            hosts[down] = Some(Host::start(&instances[down].config)?);
            let pv = fx.wait_bound("waiting").await.with_context(|| logs(&hosts))?;
            ensure!(
                directories(&instances[down].data).contains(&pv.name_any()),
                "the volume was not made on node {}",
                instances[down].node
            );

            // Deleting them removes each directory on its node.
            let claims = fx.claims();
            for i in 0..PODS {
                pods.delete(&format!("app-{i}"), &DeleteParams::default().grace_period(0)).await?;
                claims.delete(&format!("data-{i}"), &DeleteParams::default()).await?;
            }
            pods.delete("app-waiting", &DeleteParams::default().grace_period(0)).await?;
            claims.delete("waiting", &DeleteParams::default()).await?;
            for volumes in per_node.values() {
                for volume in volumes {
                    fx.wait_volume_gone(volume).await.with_context(|| logs(&hosts))?;
                }
            }
            fx.wait_volume_gone(&pv.name_any()).await?;
            for instance in &instances {
                ensure!(
                    directories(&instance.data).is_empty(),
                    "node {} still holds {:?}",
                    instance.node,
                    directories(&instance.data)
                );
            }
            for host in hosts.iter_mut().flatten() {
                host.terminate(Duration::from_secs(20))?;
            }
            anyhow::Ok(())
        }
        .await;
        fx.delete_nodes(&prefix, NODES).await;
        result
    })
    .await;
}

#[tokio::test]
async fn the_volumes_of_a_deleted_node_are_never_deleted_elsewhere() {
    scenario("node-gone", async |fx| {
        let prefix = format!("ng-{}", fx.ctx.namespace);
        let result = async {
            fx.install_module("hostpath", "hostpath");
            let instances = instances(
                fx,
                &prefix,
                2,
                &["--node-gone-policy=remove", "--node-gone-grace=3s"],
            )
            .await?;
            let mut hosts: Vec<Option<Host>> = Vec::new();
            for instance in &instances {
                hosts.push(Some(Host::start(&instance.config)?));
            }
            // Give the election its first round, so the leader is known.
            let leader = wait_for("an instance to lead", WAIT, || async {
                Ok(leader(&hosts).ok())
            })
            .await?;
            let gone = &instances[(leader + 1) % 2];
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            fx.claim("data", &class, "1Mi", json!({})).await?;
            pods.create(
                &PostParams::default(),
                &app_pod(fx, "app", "data", Some(&gone.node))?,
            )
            .await?;
            let pv = fx.wait_bound("data").await.with_context(|| logs(&hosts))?;
            let volume = pv.name_any();
            ensure!(
                directories(&gone.data) == vec![volume.clone()],
                "the volume is not on {}",
                gone.node
            );

            // The node is deleted (its instance with it).
            hosts[(leader + 1) % 2].take().expect("running").kill();
            Api::<k8s_openapi::api::core::v1::Node>::all(fx.ctx.client.clone())
                .delete(&gone.node, &DeleteParams::default())
                .await?;
            let events = wait_for("the NodeGone Event on the PV", WAIT, || async {
                let events = fx.events("default", &volume).await?;
                Ok(events
                    .iter()
                    .any(|(reason, _)| reason == "NodeGone")
                    .then_some(events))
            })
            .await
            .with_context(|| logs(&hosts))?;
            let note = &events
                .iter()
                .find(|(reason, _)| reason == "NodeGone")
                .expect("found")
                .1;
            ensure!(
                note.contains(&gone.node) && note.contains("policy remove"),
                "{note}"
            );
            // Policy remove: after the grace period the PV object goes (once its claim
            // is gone too: pv-protection keeps a Bound PV), recorded as abandoned; its
            // directory stays on the gone node's disk, untouched.
            // (kube-controller-manager's pod GC may have removed the pod of the gone node.)
            let _ = pods
                .delete("app", &DeleteParams::default().grace_period(0))
                .await;
            fx.claims().delete("data", &DeleteParams::default()).await?;
            fx.wait_volume_gone(&volume)
                .await
                .with_context(|| logs(&hosts))?;
            let events = fx.events("default", &volume).await?;
            ensure!(
                events
                    .iter()
                    .any(|(reason, note)| reason == "VolumeAbandoned"
                        && note.contains("could not be cleaned")),
                "no VolumeAbandoned Event: {events:?}"
            );
            ensure!(
                directories(&gone.data) == vec![volume.clone()],
                "the gone node's data was touched: {:?}",
                directories(&gone.data)
            );
            let abandoned = hosts[leader].as_ref().and_then(|host| {
                host.metric(r#"wasm_provisioner_volumes_abandoned_total{reason="node_gone"}"#)
            });
            ensure!(
                abandoned == Some(1.0),
                "abandoned volumes counted: {abandoned:?}"
            );
            for host in hosts.iter_mut().flatten() {
                host.terminate(Duration::from_secs(20))?;
            }
            anyhow::Ok(())
        }
        .await;
        fx.delete_nodes(&prefix, 2).await;
        result
    })
    .await;
}

/// The bytes available on the filesystem of `path` (`df`).
fn available_bytes(path: &Path) -> anyhow::Result<u64> {
    let output = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .context("running df")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .nth(1)
        .and_then(|line| line.trim().parse().ok())
        .with_context(|| format!("df said {text:?} of {}", path.display()))
}

#[tokio::test]
async fn the_scheduler_places_no_pod_on_a_node_with_too_little_capacity() {
    scenario("node-capacity", async |fx| {
        let prefix = format!("nc-{}", fx.ctx.namespace);
        // Node 0's disk is a 64 MiB tmpfs mounted for the test, node 1's the test's
        // temporary directory: two filesystems with different free space, whatever the
        // machine's disks hold. The claims ask for a size between.
        let small_root = fx.root.join("small-disk");
        std::fs::create_dir_all(&small_root)?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs"])
            .arg(&small_root)
            .status()
            .context("running mount")?;
        ensure!(
            mounted.success(),
            "this test mounts a 64 MiB tmpfs at {} as a small node disk, and needs root for it (mount said {mounted})",
            small_root.display()
        );
        let (small, large) = (available_bytes(&small_root)?, available_bytes(&fx.root)?);
        ensure!(
            large > small + small / 5,
            "this test needs {} ({large} bytes free) to have more room than its 64 MiB tmpfs",
            fx.root.display()
        );
        let size = small + (large - small) / 2;
        let driver = fx.provisioner.clone();
        let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(fx.ctx.client.clone());
        let result = async {
            fx.install_module("hostpath", "hostpath");
            // The scheduler consults CSIStorageCapacity for this provisioner only once
            // a CSIDriver of its name says so (the node-local manifests ship it).
            drivers
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({
                        "metadata": { "name": driver },
                        "spec": { "attachRequired": false, "podInfoOnMount": false, "storageCapacity": true, "volumeLifecycleModes": ["Persistent"] },
                    }))?,
                )
                .await?;
            let root = small_root.clone();
            let instances = instances_on(
                fx,
                &prefix,
                2,
                &["--capacity-poll-interval=2s"],
                move |index| (index == 0).then(|| root.clone()),
            )
            .await?;
            let mut hosts: Vec<Option<Host>> = Vec::new();
            for instance in &instances {
                hosts.push(Some(Host::start(&instance.config)?));
            }
            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let capacities: Api<k8s_openapi::api::storage::v1::CSIStorageCapacity> =
                Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            let published = wait_for("one CSIStorageCapacity per node of the class", WAIT, || async {
                let list = capacities.list(&Default::default()).await?;
                let of_class: Vec<_> = list.items.into_iter().filter(|c| c.storage_class_name == class).collect();
                Ok((of_class.len() == 2).then_some(of_class))
            })
            .await
            .with_context(|| logs(&hosts))?;
            for object in &published {
                let node = object
                    .node_topology
                    .as_ref()
                    .and_then(|t| t.match_labels.as_ref())
                    .and_then(|l| l.get("kubernetes.io/hostname"))
                    .cloned()
                    .context("no node topology")?;
                let capacity: u64 = object.capacity.as_ref().context("no capacity")?.0.parse().unwrap_or(0);
                let room = if node == instances[0].node { small } else { large };
                // Free space moves a little while the test runs.
                ensure!(
                    capacity.abs_diff(room) < room / 20 + (64 << 20),
                    "node {node}: published {capacity} bytes, df says {room}"
                );
            }
            let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
            for i in 0..4 {
                let claim = format!("big-{i}");
                fx.claim(&claim, &class, &size.to_string(), json!({})).await?;
                pods.create(&PostParams::default(), &app_pod(fx, &format!("app-{i}"), &claim, None)?)
                    .await?;
            }
            for i in 0..4 {
                let pv = fx.wait_bound(&format!("big-{i}")).await.with_context(|| logs(&hosts))?;
                ensure!(
                    affinity_node(&pv).as_deref() == Some(instances[1].node.as_str()),
                    "a claim of {size} bytes went to {:?}; only {} has room",
                    affinity_node(&pv),
                    instances[1].node
                );
            }

            // A node whose instance is down: its object is withdrawn.
            let leader = leader(&hosts)?;
            let down = (leader + 1) % 2;
            hosts[down].take().expect("running").kill();
            wait_for("the object of the node whose instance is down to be withdrawn", WAIT, || async {
                let list = capacities.list(&Default::default()).await?;
                Ok((list.items.iter().filter(|c| c.storage_class_name == class).count() == 1).then_some(()))
            })
            .await
            .with_context(|| logs(&hosts))?;
            hosts[down] = Some(Host::start(&instances[down].config)?);

            let claims = fx.claims();
            for i in 0..4 {
                pods.delete(&format!("app-{i}"), &DeleteParams::default().grace_period(0)).await?;
                claims.delete(&format!("big-{i}"), &DeleteParams::default()).await?;
            }
            wait_for("the volumes to be deleted", WAIT, || async {
                Ok(directories(&instances[1].data).is_empty().then_some(()))
            })
            .await
            .with_context(|| logs(&hosts))?;
            for host in hosts.iter_mut().flatten() {
                host.terminate(Duration::from_secs(20))?;
            }
            anyhow::Ok(())
        }
        .await;
        let _ = drivers.delete(&driver, &DeleteParams::default()).await;
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&small_root)
            .status();
        fx.delete_nodes(&prefix, 2).await;
        result
    })
    .await;
}

/// The shipped split (`--node-local-role`): a controller that serves no node leads and
/// writes, and the node instances run with a token that may only read the Lease. Every
/// volume is still made and deleted on its own node, and that token cannot create a PV.
#[tokio::test]
async fn a_controller_and_read_only_node_instances_provision_on_each_node() {
    scenario("node-roles", async |fx| {
        const SPLIT_NODES: usize = 2;
        const SPLIT_PODS: usize = 8;
        let prefix = format!("nr-{}", fx.ctx.namespace);
        let result = async {
            fx.install_module("hostpath", "hostpath");
            // The node instances' ServiceAccount (test_nodes makes it) may read the
            // Lease, and list the StorageClasses (a new module version is checked
            // against them before it serves), and nothing else: deploy/node-local's.
            let mut instances = instances(fx, &prefix, SPLIT_NODES, &["--node-local-role=node"]).await?;
            let lease = fx.provisioner.replace('/', "-");
            let role: Role = serde_json::from_value(json!({
                "metadata": { "name": "wasm-provisioner-node" },
                "rules": [{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                            "resourceNames": [lease], "verbs": ["get", "list", "watch"] }],
            }))?;
            let binding: RoleBinding = serde_json::from_value(json!({
                "metadata": { "name": "wasm-provisioner-node" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wasm-provisioner-node" },
                "subjects": [{ "kind": "ServiceAccount", "name": INSTANCE_ACCOUNT, "namespace": fx.ctx.namespace }],
            }))?;
            let client = fx.ctx.client.clone();
            Api::<Role>::namespaced(client.clone(), &fx.ctx.namespace).create(&PostParams::default(), &role).await?;
            Api::<RoleBinding>::namespaced(client.clone(), &fx.ctx.namespace)
                .create(&PostParams::default(), &binding)
                .await?;
            let classes_role = format!("wasm-provisioner-node-{}", fx.ctx.namespace);
            let cluster_role: ClusterRole = serde_json::from_value(json!({
                "metadata": { "name": classes_role },
                "rules": [{ "apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                            "verbs": ["get", "list", "watch"] }],
            }))?;
            let cluster_binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": { "name": classes_role },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": classes_role },
                "subjects": [{ "kind": "ServiceAccount", "name": INSTANCE_ACCOUNT, "namespace": fx.ctx.namespace }],
            }))?;
            Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &cluster_role).await?;
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&PostParams::default(), &cluster_binding)
                .await?;
            let token = service_account_token(&client, &fx.ctx.namespace, INSTANCE_ACCOUNT).await?;
            let node_kubeconfig = fx.root.join("node.kubeconfig");
            kubeconfig::write_with_token(&admin_kubeconfig(), &token, &node_kubeconfig)?;
            for instance in &mut instances {
                instance.config.kubeconfig = node_kubeconfig.clone();
            }
            // That token cannot make a PV.
            let node_client = kube::Client::try_from(
                kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(&node_kubeconfig)?,
                    &Default::default(),
                )
                .await?,
            )?;
            let forged: PersistentVolume = serde_json::from_value(json!({
                "metadata": { "name": format!("forged-{}", fx.ctx.namespace) },
                "spec": { "capacity": { "storage": "1Mi" }, "accessModes": ["ReadWriteOnce"],
                          "hostPath": { "path": "/" } },
            }))?;
            match Api::<PersistentVolume>::all(node_client).create(&PostParams::default(), &forged).await {
                Err(kube::Error::Api(status)) if status.code == 403 => {}
                other => anyhow::bail!("a node instance's token must not create a PV: {other:?}"),
            }

            // The controller: no node, its own address for enrolment.
            // A DaemonSet's port: the same on every pod.
            let port = instances[0].port;
            let flags = controller_flags("127.0.0.100", port);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let controller_config = fx.host_config(&flags);
            let mut hosts: Vec<Option<Host>> = vec![Some(Host::start(&controller_config)?)];
            for instance in &instances {
                hosts.push(Some(Host::start(&instance.config)?));
            }
            wait_for("the controller to lead", WAIT, || async {
                Ok((leader(&hosts).ok() == Some(0)).then_some(()))
            })
            .await
            .with_context(|| logs(&hosts))?;

            let class = fx
                .class(
                    "hostpath",
                    &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                    json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &fx.ctx.namespace);
            for i in 0..SPLIT_PODS {
                let node = &instances[i % SPLIT_NODES].node;
                fx.claim(&format!("data-{i}"), &class, "1Mi", json!({})).await?;
                pods.create(&PostParams::default(), &app_pod(fx, &format!("app-{i}"), &format!("data-{i}"), Some(node))?)
                    .await?;
            }
            let mut per_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for i in 0..SPLIT_PODS {
                let node = instances[i % SPLIT_NODES].node.clone();
                let pv = fx.wait_bound(&format!("data-{i}")).await.with_context(|| logs(&hosts))?;
                ensure!(
                    pv.annotations().get("wasm-provisioner.dev/node") == Some(&node),
                    "claim data-{i} is on {node}, its PV records {:?}",
                    pv.annotations().get("wasm-provisioner.dev/node")
                );
                per_node.entry(node).or_default().push(pv.name_any());
            }
            // Every call went over the channel: the controller made nothing itself.
            let sent = hosts[0]
                .as_ref()
                .and_then(|host| host.metric(r#"wasm_provisioner_node_call_duration_seconds_count{outcome="ok"}"#))
                .unwrap_or(0.0);
            ensure!(
                sent >= (2 * SPLIT_PODS) as f64,
                "the controller sent {sent} calls; each claim needs at least two (should-provision, provision)"
            );
            // What each costs the API server: the node instances hold one watch, of the
            // Lease, and are enrolled; the controller watches claims and PVs.
            for host in hosts.iter().skip(1).flatten() {
                ensure!(
                    host.metric("wasm_provisioner_node_enrolled") == Some(1.0),
                    "a node instance is not enrolled with the controller:\n{}",
                    host.log_text()
                );
                let watches = host_watches(host)?;
                ensure!(
                    watches.open == BTreeMap::from([("leases".to_string(), 1.0)]) && watches.bytes > 0.0,
                    "a node instance holds these watches (it must hold the Lease's alone): {watches:?}"
                );
            }
            let controller = host_watches(hosts[0].as_ref().context("the controller runs")?)?;
            ensure!(
                ["persistentvolumeclaims", "persistentvolumes"]
                    .iter()
                    .all(|resource| controller.open.get(*resource) == Some(&1.0))
                    && controller.bytes > 0.0,
                "the controller's watches: {controller:?}"
            );
            for instance in &instances {
                let mut expected = per_node.get(&instance.node).cloned().unwrap_or_default();
                expected.sort();
                ensure!(
                    directories(&instance.data) == expected,
                    "node {}: its data directory holds {:?}, its volumes are {expected:?}",
                    instance.node,
                    directories(&instance.data)
                );
            }
            let claims = fx.claims();
            for i in 0..SPLIT_PODS {
                pods.delete(&format!("app-{i}"), &DeleteParams::default().grace_period(0)).await?;
                claims.delete(&format!("data-{i}"), &DeleteParams::default()).await?;
            }
            for volume in per_node.values().flatten() {
                fx.wait_volume_gone(volume).await.with_context(|| logs(&hosts))?;
            }
            for instance in &instances {
                ensure!(
                    directories(&instance.data).is_empty(),
                    "node {} still holds {:?}",
                    instance.node,
                    directories(&instance.data)
                );
            }
            for host in hosts.iter_mut().flatten() {
                host.terminate(Duration::from_secs(20))?;
            }
            anyhow::Ok(())
        }
        .await;
        fx.delete_nodes(&prefix, SPLIT_NODES).await;
        let classes_role = format!("wasm-provisioner-node-{}", fx.ctx.namespace);
        let _ = Api::<ClusterRoleBinding>::all(fx.ctx.client.clone())
            .delete(&classes_role, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(fx.ctx.client.clone())
            .delete(&classes_role, &DeleteParams::default())
            .await;
        result
    })
    .await;
}
