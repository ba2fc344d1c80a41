//! One end-to-end scenario: a namespace, a provisioner name of its own (so tests running
//! side by side never act on each other's claims), a modules directory, a granted data
//! directory and a grants file, plus helpers to make classes and claims and wait for
//! what the host does to them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::json;

use crate::cluster::{TestContext, admin_kubeconfig, random_suffix, wait_for};
use crate::guests;
use crate::host::{Host, HostConfig};

/// How long a test waits for the host to act.
pub const WAIT: Duration = Duration::from_secs(60);

/// The `volumes` grant of every module [`Fixture::write_grants`] names: the node paths
/// the tests' classes publish volumes in (their `nodePath`s, the echo guest's `/echo`),
/// each standing for the module's `/volumes` grant, and `nfs.example.com`.
pub const TEST_VOLUME_GRANTS: &str = "    volumes:
      hostPath:
        - { pathPrefix: /echo, directory: /volumes }
        - { pathPrefix: /srv/volumes, directory: /volumes }
        - { pathPrefix: /srv/x, directory: /volumes }
        - { pathPrefix: /srv/economy, directory: /volumes }
        - { pathPrefix: /srv/economy-trickle, directory: /volumes }
        - { pathPrefix: /srv/load, directory: /volumes }
        - { pathPrefix: /srv/slow, directory: /volumes }
        - { pathPrefix: /srv/minimal, directory: /volumes }
        - { pathPrefix: /var/lib/wasm-provisioner/hostpath, directory: /volumes }
        - { pathPrefix: /var/lib/wasm-provisioner/quota, directory: /volumes }
      local:
        - { pathPrefix: /srv/volumes, directory: /volumes }
        - { pathPrefix: /srv/x, directory: /volumes }
        - { pathPrefix: /var/lib/wasm-provisioner/hostpath, directory: /volumes }
      nfs: [{ server: nfs.example.com, pathPrefix: / }]
";

/// The label of a scenario's schedulable Nodes: its namespace.
pub const SCENARIO_LABEL: &str = "test.wasm-provisioner.dev/scenario";

/// kube-controller-manager's PV binder, as it reports its Events.
const BINDER: &str = "persistentvolume-controller";

pub struct Fixture {
    pub ctx: TestContext,
    pub provisioner: String,
    /// Root of this scenario's files; removed on drop.
    pub root: PathBuf,
    pub modules: PathBuf,
    /// Granted to modules: `data/<module>` is mapped to the guest path `/volumes`.
    pub data: PathBuf,
    pub grants: PathBuf,
    classes: Vec<String>,
}

/// Runs a scenario on a fresh fixture. On failure it panics while the fixture is alive,
/// so the fixture keeps its files and the host logs (and prints where they are).
pub async fn scenario<F>(test: &str, body: F)
where
    F: AsyncFnOnce(&mut Fixture) -> anyhow::Result<()>,
{
    let mut fx = Fixture::new(test).await.expect("a fixture");
    match body(&mut fx).await {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}

impl Fixture {
    pub async fn new(test: &str) -> anyhow::Result<Fixture> {
        let ctx = TestContext::new(test).await?;
        let provisioner = format!("{}.test.wasm-provisioner.dev", ctx.namespace);
        let root = std::env::temp_dir().join(format!("wasm-provisioner-{}", ctx.namespace));
        let modules = root.join("modules");
        let data = root.join("data");
        std::fs::create_dir_all(&modules)?;
        std::fs::create_dir_all(&data)?;
        let grants = root.join("grants.yaml");
        let fixture = Fixture {
            ctx,
            provisioner,
            root,
            modules,
            data,
            grants,
            classes: Vec::new(),
        };
        fixture.write_grants(&["hostpath", "nfs-subdir", "echo", "flaky"])?;
        Ok(fixture)
    }

    /// Grants each named module a read-write directory `data/<module>` as `/volumes`,
    /// and the volume sources the tests' classes publish ([`TEST_VOLUME_GRANTS`]).
    pub fn write_grants(&self, modules: &[&str]) -> anyhow::Result<()> {
        let mut text = format!(
            "allow:\n  directories: [{}]\nmodules:\n",
            self.data.display()
        );
        for module in modules {
            let dir = self.data.join(module);
            std::fs::create_dir_all(&dir)?;
            text.push_str(&format!(
                "  {module}:\n    directories:\n      - {{ host: {}, guest: /volumes, mode: read-write }}\n{TEST_VOLUME_GRANTS}",
                dir.display()
            ));
        }
        std::fs::write(&self.grants, text)?;
        Ok(())
    }

    /// Copies a built guest (`guests/dist/<built>.wasm`) into the modules directory as
    /// module `module`, atomically (write, then rename).
    pub fn install_module(&self, built: &str, module: &str) {
        let staging = self.root.join(format!(".{module}.wasm.tmp"));
        std::fs::copy(guests::module(built), &staging).expect("copy a built guest");
        std::fs::rename(&staging, self.modules.join(format!("{module}.wasm")))
            .expect("install a module");
    }

    pub fn remove_module(&self, module: &str) {
        std::fs::remove_file(self.modules.join(format!("{module}.wasm"))).expect("remove a module");
    }

    /// The host config for this scenario: fast retries, no leader election.
    pub fn host_config(&self, extra: &[&str]) -> HostConfig {
        let mut args = HostConfig::fast_retries();
        args.push("--leader-elect=false".into());
        // The host's own namespace (its journal, its Lease): the fixture's, where the
        // ServiceAccount's Role of deploy/rbac.yaml grants them.
        args.push(format!("--namespace={}", self.ctx.namespace));
        // A flag in `extra` replaces the default of the same name (the host refuses a
        // flag given twice).
        let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_string();
        let replaced: Vec<String> = extra.iter().map(|arg| flag(arg)).collect();
        args.retain(|arg| !replaced.contains(&flag(arg)));
        args.extend(extra.iter().map(|s| s.to_string()));
        HostConfig {
            kubeconfig: admin_kubeconfig(),
            provisioner_name: self.provisioner.clone(),
            modules: self.modules.clone(),
            grants: Some(self.grants.clone()),
            log_dir: self.root.join("logs"),
            args,
        }
    }

    /// Starts a host for this scenario and waits until it is ready.
    pub fn host(&self, extra: &[&str]) -> Host {
        Host::start(&self.host_config(extra)).expect("the host starts")
    }

    /// Creates a StorageClass of this provisioner; returns its (unique) name.
    pub async fn class(
        &mut self,
        module: &str,
        parameters: &[(&str, &str)],
        extra: serde_json::Value,
    ) -> anyhow::Result<String> {
        let name = format!("{}-{}-{}", module, self.ctx.namespace, random_suffix());
        let mut params: BTreeMap<String, String> = parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        params.insert("module".into(), module.into());
        let mut class = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": { "name": name },
            "provisioner": self.provisioner,
            "parameters": params,
        });
        if let (Some(target), Some(extra)) = (class.as_object_mut(), extra.as_object()) {
            for (key, value) in extra {
                target.insert(key.clone(), value.clone());
            }
        }
        let class: StorageClass = serde_json::from_value(class)?;
        Api::<StorageClass>::all(self.ctx.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .with_context(|| format!("creating StorageClass {name}"))?;
        self.classes.push(name.clone());
        Ok(name)
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.ctx.client.clone())
    }

    /// The claim UIDs in the host's provisioning journal (a ConfigMap in the fixture's
    /// namespace named after the provisioner: `<provisioner, / as ->-journal`).
    pub async fn journal_entries(&self) -> anyhow::Result<Vec<String>> {
        let name = format!("{}-journal", self.provisioner.replace('/', "-"));
        let journal = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
            self.ctx.client.clone(),
            &self.ctx.namespace,
        )
        .get_opt(&name)
        .await
        .with_context(|| format!("reading the provisioning journal {name}"))?;
        Ok(journal
            .and_then(|j| j.data)
            .map(|data| data.into_keys().collect())
            .unwrap_or_default())
    }

    /// Creates a claim of `class` for `size` (such as "1Gi"), with extra fields merged
    /// into its JSON (annotations, volumeMode, ...).
    pub async fn claim(
        &self,
        name: &str,
        class: &str,
        size: &str,
        extra: serde_json::Value,
    ) -> anyhow::Result<PersistentVolumeClaim> {
        let mut claim = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": { "name": name },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": { "requests": { "storage": size } },
            },
        });
        merge(&mut claim, extra);
        let claim: PersistentVolumeClaim = serde_json::from_value(claim)?;
        Ok(self.claims().create(&PostParams::default(), &claim).await?)
    }

    /// Waits until the claim is Bound and returns its PV.
    pub async fn wait_bound(&self, claim: &str) -> anyhow::Result<PersistentVolume> {
        let claims = self.claims();
        let volume = wait_for(&format!("claim {claim} to be Bound"), WAIT, || async {
            let claim = claims.get(claim).await?;
            let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            Ok(bound
                .then(|| claim.spec.and_then(|s| s.volume_name))
                .flatten())
        })
        .await?;
        Ok(self.volumes().get(&volume).await?)
    }

    /// Events (events.k8s.io) about the object named `name` in `namespace`, from a
    /// provisioner: (reason, note) pairs. kube-controller-manager's binder's own are left
    /// out: it says `ProvisioningFailed` too, when its class cache lags a class made a
    /// moment before the claim ("storageclass ... not found").
    pub async fn events(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), namespace);
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(|e| {
                let reporters = [
                    e.reporting_controller.as_deref(),
                    e.deprecated_source
                        .as_ref()
                        .and_then(|s| s.component.as_deref()),
                ];
                !reporters.contains(&Some(BINDER))
            })
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect())
    }

    /// Waits for an Event with `reason` on the claim `claim` from a provisioner (see
    /// [`Fixture::events`]); returns its note.
    pub async fn wait_claim_event(&self, claim: &str, reason: &str) -> anyhow::Result<String> {
        wait_for(
            &format!("Event {reason} on claim {claim}"),
            WAIT,
            || async {
                let events = self.events(&self.ctx.namespace, claim).await?;
                Ok(events
                    .into_iter()
                    .find(|(r, _)| r == reason)
                    .map(|(_, note)| note))
            },
        )
        .await
    }

    /// Waits until `check` holds for the claim (or it is gone: `None`).
    pub async fn wait_claim<F>(&self, claim: &str, what: &str, check: F) -> anyhow::Result<()>
    where
        F: Fn(Option<&PersistentVolumeClaim>) -> bool,
    {
        let claims = self.claims();
        wait_for(&format!("claim {claim}: {what}"), WAIT, || async {
            let current = claims.get_opt(claim).await?;
            Ok(check(current.as_ref()).then_some(()))
        })
        .await
    }

    /// Waits until the PV `name` is gone.
    pub async fn wait_volume_gone(&self, name: &str) -> anyhow::Result<()> {
        let volumes = self.volumes();
        wait_for(&format!("volume {name} to be deleted"), WAIT, || async {
            Ok(volumes.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// Creates a Node object (no kubelet runs; it only has to exist and carry labels).
    pub async fn node(&self, name: &str) -> anyhow::Result<()> {
        Api::<Node>::all(self.ctx.client.clone())
            .create(&PostParams::default(), &node_object(name))
            .await?;
        Ok(())
    }

    /// Creates a Node the scheduler can place pods on: Ready, with room for 110 pods
    /// (4 CPUs, 8 GiB), its `kubernetes.io/hostname` label and the label
    /// [`SCENARIO_LABEL`]`: <namespace>` (a pod of this scenario selects it, so tests
    /// running side by side never place pods on each other's nodes). No kubelet runs:
    /// pods bound to it never start. Nodes are cluster-wide: the caller deletes them.
    pub async fn schedulable_node(&self, name: &str) -> anyhow::Result<()> {
        let nodes = Api::<Node>::all(self.ctx.client.clone());
        let mut node = node_object(name);
        node.metadata
            .labels
            .get_or_insert_default()
            .insert(SCENARIO_LABEL.into(), self.ctx.namespace.clone());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {name}"))?;
        let resources = json!({ "cpu": "4", "memory": "8Gi", "pods": "110" });
        let status = json!({
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "a test node (no kubelet runs)",
                    "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                    "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                }],
            }
        });
        nodes
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .with_context(|| format!("making Node {name} Ready"))?;
        // Admission taints a new Node not-ready; the node lifecycle controller (not run
        // here) would lift it once the node reports Ready.
        nodes
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({ "spec": { "taints": null } })),
            )
            .await
            .with_context(|| format!("lifting Node {name}'s not-ready taint"))?;
        Ok(())
    }

    /// Creates the Nodes `prefix-0..n` (with their `kubernetes.io/hostname` label), 32
    /// requests in flight. Nodes are cluster-wide: the caller deletes them
    /// ([`Fixture::delete_nodes`]).
    pub async fn create_nodes(&self, prefix: &str, n: usize) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        futures::stream::iter(0..n)
            .map(|i| {
                let nodes = nodes.clone();
                let node = node_object(&format!("{prefix}-{i}"));
                async move { nodes.create(&PostParams::default(), &node).await }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await
            .context("creating the nodes")?;
        Ok(())
    }

    /// Deletes the Nodes `prefix-0..n`, whatever is left of them (errors ignored).
    pub async fn delete_nodes(&self, prefix: &str, n: usize) {
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        futures::stream::iter(0..n)
            .map(|i| {
                let nodes = nodes.clone();
                let name = format!("{prefix}-{i}");
                async move { nodes.delete(&name, &DeleteParams::default()).await }
            })
            .buffer_unordered(32)
            .for_each(|_| async {})
            .await;
    }

    /// Deletes the classes this fixture made and the namespace.
    pub async fn cleanup(self) {
        let classes: Api<StorageClass> = Api::all(self.ctx.client.clone());
        for class in &self.classes {
            let _ = classes.delete(class, &DeleteParams::default()).await;
        }
        let namespace = self.ctx.namespace.clone();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
            Api::all(self.ctx.client.clone());
        let _ = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
    }

    /// The directory a module's volumes live in on this machine.
    pub fn module_data(&self, module: &str) -> PathBuf {
        self.data.join(module)
    }
}

impl Drop for Fixture {
    /// Files go with the fixture, except after a failure: then the host logs in
    /// `<root>/logs` stay for a look, and the path is printed.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files and host logs kept in {}", self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Deep-merges `extra` into `target` (objects merge, anything else replaces).
pub fn merge(target: &mut serde_json::Value, extra: serde_json::Value) {
    match (target, extra) {
        (serde_json::Value::Object(target), serde_json::Value::Object(extra)) => {
            for (key, value) in extra {
                merge(target.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (target, extra) if !extra.is_null() => *target = extra,
        _ => {}
    }
}

/// A Node named `name`, labelled `kubernetes.io/hostname=<name>` as kubelet labels it.
fn node_object(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}
