//! `wasm-provisioner run`: wires the client, the plugin runtime with hot reload, the
//! metrics endpoint, leader election and the controllers, and shuts them down in order
//! on SIGTERM or Ctrl-C.

use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::args::{ControllerArgs, PluginArgs, SourceArgs};
use crate::controller::classes::{ClassChecks, ClassGate};
use crate::controller::{self, Settings};
use crate::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::nodes::{Backends, NodeLocal, NodeRole};
use crate::server::{self, Health};
use wasm_provisioner_runtime::{DirectoryWatcher, Runtime, SourceWatcher};

/// The API client configuration from the flags.
async fn client_config(args: &ControllerArgs) -> anyhow::Result<kube::Config> {
    Ok(match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?
        }
        None => kube::Config::infer()
            .await
            .context("no cluster: set --kubeconfig or KUBECONFIG, or run in a pod")?,
    })
}

/// Waits for SIGTERM or SIGINT.
async fn termination() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: shutting down"),
    }
}

/// Runs the controller until SIGTERM/SIGINT (graceful) or a lost lease (error).
pub async fn run(
    plugins: &PluginArgs,
    sources: &SourceArgs,
    args: &ControllerArgs,
) -> anyhow::Result<()> {
    let config = client_config(args).await?;
    // The Lease gets its own client without the QPS limit: renewals must never wait
    // behind a provisioning storm.
    let lease_client = Client::try_from(config.clone())?;
    let client =
        crate::client::rate_limited(config.clone(), args.kube_api_qps, args.kube_api_burst)?;
    // Node-local mode's CSIStorageCapacity updates have a budget of their own, low.
    let capacity_client = crate::client::rate_limited(
        config,
        crate::controller::storage_capacity::QPS,
        crate::controller::storage_capacity::BURST,
    )?;
    let runtime = Runtime::new(plugins.runtime_config()?)?;
    let metrics = Arc::new(Metrics::new());
    // The verdicts on the classes, and the gate every replacement module version must
    // pass (it must accept the classes the version in service accepts): set before the
    // first scan, so no reload goes unchecked.
    let class_checks = ClassChecks::new(
        args.provisioner_name.clone(),
        runtime.clone(),
        metrics.clone(),
        client.clone(),
    );
    runtime.set_version_gate(Arc::new(ClassGate(class_checks.clone())));
    // Modules load in the background (each compile in a bounded child process): the
    // endpoint and the controllers start at once, and a claim of a module still loading
    // waits for it without a failure.
    let _watcher = DirectoryWatcher::start_in_background(runtime.clone(), plugins.modules.clone())
        .with_context(|| {
            format!(
                "watching the modules directory {}",
                plugins.modules.display()
            )
        })?;
    info!(dir = %plugins.modules.display(), "loading modules in the background");
    // Modules from OCI registries, pulled in the background the same way.
    let _sources = SourceWatcher::start(runtime.clone(), sources.source_config())
        .context("opening the module store (--module-store)")?;

    metrics.register_runtime(runtime.clone());
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            termination().await;
            shutdown.cancel();
        });
    }
    let server_task = match args.metrics_address {
        Some(address) => {
            let stop = shutdown.clone();
            // The endpoint outlives the controllers by a moment so a final scrape works.
            let (bound, task) =
                server::serve(address, metrics.clone(), health.clone(), async move {
                    stop.cancelled().await;
                })
                .await
                .with_context(|| format!("binding the metrics address {address}"))?;
            info!(%bound, "serving /metrics, /healthz and /readyz");
            Some(task)
        }
        None => None,
    };

    let identity = leader::identity();
    let settings = Settings {
        identity: identity.clone(),
        ..args.settings()
    };
    let runtime = Arc::new(runtime);
    // Node-local mode: every instance serves its node's calls from the start.
    let node_local = match args.node_local()? {
        Some(node_settings) => Some(Arc::new(
            NodeLocal::start(
                node_settings,
                runtime.clone(),
                identity.clone(),
                args.leader_election_retry_period,
                shutdown.clone(),
            )
            .await?,
        )),
        None => None,
    };
    // A node-role instance never leads: it serves its node's calls and follows the
    // Lease, with no controller and no election (and no permission for either).
    if let Some(node_local) = node_local.as_ref().filter(|n| n.role() == NodeRole::Node) {
        health
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        node_local.follow_lease(client, shutdown.clone()).await;
        shutdown.cancel();
        if let Some(task) = server_task
            && let Err(error) = task.await
        {
            warn!(%error, "metrics endpoint task failed");
        }
        return Ok(());
    }
    let work = {
        let client = client.clone();
        let metrics = metrics.clone();
        let health = health.clone();
        let node_local = node_local.clone();
        let capacity_client = capacity_client.clone();
        move |leadership: Leadership, stop: CancellationToken| async move {
            let backends = match &node_local {
                Some(node_local) => {
                    let term = leadership.term();
                    match node_local
                        .lead(
                            client.clone(),
                            capacity_client.clone(),
                            term,
                            metrics.clone(),
                            stop.clone(),
                        )
                        .await
                    {
                        Ok(backends) => backends,
                        Err(error) => {
                            error!(%error, "node-local mode: cannot lead the node channel; stopping");
                            return;
                        }
                    }
                }
                None => Backends::deployment(settings.node_name.clone()),
            };
            controller::run(
                client,
                settings,
                runtime,
                Arc::new(backends),
                metrics,
                health,
                leadership,
                class_checks,
                stop,
            )
            .await
        }
    };
    let result = if args.leader_elect {
        let lease = leader::Settings {
            namespace: args
                .leader_election_namespace
                .clone()
                .unwrap_or_else(|| args.own_namespace()),
            lease_name: leader::lease_name(&args.provisioner_name),
            identity,
            lease_duration: args.leader_election_lease_duration,
            renew_deadline: args.leader_election_renew_deadline,
            retry_period: args.leader_election_retry_period,
            annotations: node_local
                .as_ref()
                .map(|node_local| node_local.lease_annotations())
                .unwrap_or_default(),
            observed: node_local.as_ref().map(|node_local| node_local.leases()),
        };
        // A standby is ready: it serves its endpoint and stands by to lead.
        health
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        leader::run_as_leader(lease_client, lease, metrics.clone(), shutdown.clone(), work)
            .await
            .map_err(anyhow::Error::from)
    } else {
        // A single replica leads by definition.
        metrics.leader.set(1);
        work(Leadership::unelected(), shutdown.clone()).await;
        metrics.leader.set(0);
        Ok(())
    };
    shutdown.cancel();
    if let Some(task) = server_task
        && let Err(error) = task.await
    {
        warn!(%error, "metrics endpoint task failed");
    }
    result
}
