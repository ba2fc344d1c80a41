//! The main job in one command (`bash tests/demo.sh`): the host against a real control
//! plane (the embedded local one, or the cluster `KUBECONFIG` names), with example
//! StorageClasses for both guests and a sample claim of each, shown Bound. Runs until
//! Ctrl-C, then deletes what it made (the PVs go through the guests' delete) and tears
//! everything down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};
use wasm_provisioner_tests::cluster::{admin_client, admin_kubeconfig, wait_for};
use wasm_provisioner_tests::guests;
use wasm_provisioner_tests::host::{Host, HostConfig};

const NAMESPACE: &str = "wasm-provisioner-demo";
const PROVISIONER: &str = "demo.wasm-provisioner.dev";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut stop = StopSignals::listen()?;
    let kubeconfig = admin_kubeconfig();
    let client = admin_client().await?;
    println!(
        "cluster: {} (KUBECONFIG={})",
        client.apiserver_version().await?.git_version,
        kubeconfig.display()
    );

    let root = std::env::temp_dir().join(format!("wasm-provisioner-demo-{}", std::process::id()));
    let modules = root.join("modules");
    let data = root.join("data");
    for dir in [&modules, &data.join("hostpath"), &data.join("nfs-export")] {
        std::fs::create_dir_all(dir)?;
    }
    for module in ["hostpath", "nfs-subdir"] {
        std::fs::copy(
            guests::module(module),
            modules.join(format!("{module}.wasm")),
        )?;
    }
    let grants = root.join("grants.yaml");
    std::fs::write(
        &grants,
        format!(
            "allow:\n  directories: [{data}]\nmodules:\n  hostpath:\n    directories:\n      - {{ host: {data}/hostpath, guest: /volumes, mode: read-write }}\n    volumes:\n      hostPath: [{{ pathPrefix: /var/lib/wasm-provisioner/hostpath, directory: /volumes }}]\n  nfs-subdir:\n    directories:\n      - {{ host: {data}/nfs-export, guest: /export, mode: read-write }}\n    volumes:\n      nfs: [{{ server: nfs.example.com, pathPrefix: /exports }}]\n",
            data = data.display()
        ),
    )?;

    let mut config = HostConfig {
        kubeconfig: kubeconfig.clone(),
        provisioner_name: PROVISIONER.into(),
        modules: modules.clone(),
        grants: Some(grants),
        log_dir: root.join("logs"),
        args: HostConfig::fast_retries(),
    };
    config.args.push("--leader-elect=false".into());
    let mut host = Host::start_in_own_process_group(&config)?;
    println!(
        "host running: metrics on http://127.0.0.1:{}/metrics, log {}",
        host.metrics_port,
        host.log.display()
    );
    println!(
        "modules: {}   backend data: {}",
        modules.display(),
        data.display()
    );

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } }))?,
        )
        .await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let examples = [
        (
            "demo-hostpath",
            json!({ "module": "hostpath", "nodePath": "/var/lib/wasm-provisioner/hostpath" }),
        ),
        (
            "demo-nfs-subdir",
            json!({ "module": "nfs-subdir", "server": "nfs.example.com", "share": "/exports",
                    "pathPattern": "${.PVC.namespace}/${.PVC.name}" }),
        ),
    ];
    for (name, parameters) in &examples {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": { "name": name },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "parameters": parameters,
        }))?;
        let _ = classes.delete(name, &DeleteParams::default()).await;
        classes
            .create(&PostParams::default(), &class)
            .await
            .with_context(|| format!("creating class {name}"))?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    for (class, _) in &examples {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": { "name": format!("{class}-claim") },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": { "requests": { "storage": "1Gi" } },
            },
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
    }

    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for (class, _) in &examples {
        let name = format!("{class}-claim");
        wait_for(
            &format!("claim {NAMESPACE}/{name} to be Bound"),
            Duration::from_secs(120),
            || async {
                let claim = claims.get(&name).await?;
                Ok((claim.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
            },
        )
        .await
        .with_context(|| format!("host log: {}", host.log.display()))?;
    }
    println!();
    println!(
        "{:<45} {:<32} {:<16} {:<8} {:<7} SOURCE",
        "VOLUME", "CLAIM", "CLASS", "SIZE", "STATUS"
    );
    for volume in volumes.list(&Default::default()).await?.items {
        let Some(spec) = &volume.spec else { continue };
        if volume
            .annotations()
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str)
            != Some(PROVISIONER)
        {
            continue;
        }
        let claim = spec
            .claim_ref
            .as_ref()
            .map(|r| {
                format!(
                    "{}/{}",
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default()
                )
            })
            .unwrap_or_default();
        let size = spec
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_default();
        let source = match (&spec.host_path, &spec.nfs) {
            (Some(h), _) => format!("hostPath {}", h.path),
            (_, Some(n)) => format!("nfs {}:{}", n.server, n.path),
            _ => "other".into(),
        };
        println!(
            "{:<45} {:<32} {:<16} {:<8} {:<7} {}",
            volume.name_any(),
            claim,
            spec.storage_class_name.clone().unwrap_or_default(),
            size,
            volume.status.and_then(|s| s.phase).unwrap_or_default(),
            source
        );
    }
    println!();
    println!("backend directories made by the guests:");
    for dir in [
        data.join("hostpath"),
        data.join("nfs-export").join(NAMESPACE),
    ] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            println!("  {}", entry.path().display());
        }
    }
    println!();
    println!("Running. Ctrl-C to delete the demo claims and stop.");
    stop.requested().await;

    println!("deleting the demo claims; the guests delete their backend volumes...");
    let mut published = BTreeMap::new();
    for (class, _) in &examples {
        let name = format!("{class}-claim");
        if let Some(volume) = claims
            .get(&name)
            .await
            .ok()
            .and_then(|c| c.spec.and_then(|s| s.volume_name))
        {
            published.insert(name.clone(), volume);
        }
        let _ = claims.delete(&name, &DeleteParams::default()).await;
    }
    for volume in published.values() {
        let gone = wait_for(
            &format!("volume {volume} to be deleted"),
            Duration::from_secs(60),
            || async { Ok(volumes.get_opt(volume).await?.is_none().then_some(())) },
        )
        .await;
        match gone {
            Ok(()) => println!("  {volume}: deleted"),
            Err(error) => println!("  {volume}: {error:#}"),
        }
    }
    for (name, _) in &examples {
        let _ = classes.delete(name, &DeleteParams::default()).await;
    }
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
    let status = host.terminate(Duration::from_secs(30))?;
    println!("host stopped ({status})");
    let _ = std::fs::remove_dir_all(PathBuf::from(&root));
    Ok(())
}

/// Ctrl-C, SIGTERM or SIGHUP (a `kill`, `timeout`, a closed terminal): each gets the
/// same clean-up, so the demo never leaves its claims, classes and namespace in the
/// cluster `KUBECONFIG` names, nor its backend directories behind. Listened for from the
/// start, so a signal that comes before the demo is ready waits for the clean-up too.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    fn listen() -> anyhow::Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn requested(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => println!("SIGTERM"),
            _ = self.hangup.recv() => println!("SIGHUP"),
        }
    }
}
