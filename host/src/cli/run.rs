//! `wasm-provisioner run`: wires the client, the plugin runtime with hot reload, the
//! metrics endpoint, leader election and the controllers, and shuts them down in order
//! on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::{self, RetryPolicy};
use crate::controller::faults::Step;
use crate::controller::{self, Faults, Settings};
use crate::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::names;
use crate::plugin::{DirectoryWatcher, Grants, Runtime, RuntimeConfig};
use crate::server::{self, Health};

/// Defaults, named once; docs/configuration.md lists them.
pub const DEFAULT_THREADS: u16 = 8;
pub const DEFAULT_RESYNC: &str = "15m";
pub const DEFAULT_KUBE_API_QPS: u32 = 200;
pub const DEFAULT_KUBE_API_BURST: u32 = 300;
pub const DEFAULT_PV_SAVE_RETRIES: u32 = 5;
pub const DEFAULT_PV_SAVE_INTERVAL: &str = "10s";
pub const DEFAULT_EVENT_MAX_DELAY: &str = "30s";

/// The controller's flags (the plugin flags are in `PluginArgs`).
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Name of this provisioner: StorageClasses name it in `provisioner`, PVs carry it in
    /// `pv.kubernetes.io/provisioned-by`, the leader Lease is named after it.
    #[arg(long, env = "WASM_PROVISIONER_PROVISIONER_NAME", default_value = names::DEFAULT_PROVISIONER_NAME)]
    pub provisioner_name: String,

    /// Kubeconfig file; without it, $KUBECONFIG, then the in-cluster service account.
    #[arg(long, env = "WASM_PROVISIONER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Workers per controller (claims, volumes).
    #[arg(long, env = "WASM_PROVISIONER_THREADS", default_value_t = DEFAULT_THREADS)]
    pub threads: u16,

    /// Every claim and volume is reconciled again after this long without events.
    #[arg(long, env = "WASM_PROVISIONER_RESYNC_PERIOD", default_value = DEFAULT_RESYNC, value_parser = humantime::parse_duration)]
    pub resync_period: Duration,

    /// Double the retry delay after each failure (else a fixed --retry-interval-start).
    #[arg(long, env = "WASM_PROVISIONER_EXPONENTIAL_BACKOFF", default_value_t = true, action = clap::ArgAction::Set)]
    pub exponential_backoff_on_failure: bool,

    /// First retry delay after a failure.
    #[arg(long, env = "WASM_PROVISIONER_RETRY_INTERVAL_START", default_value = "15s", value_parser = humantime::parse_duration)]
    pub retry_interval_start: Duration,

    /// Longest retry delay; also the slow retry of infeasible requests.
    #[arg(long, env = "WASM_PROVISIONER_RETRY_INTERVAL_MAX", default_value = "1000s", value_parser = humantime::parse_duration)]
    pub retry_interval_max: Duration,

    /// Failed provision attempts before giving up on a claim (with a Warning Event); 0
    /// retries forever.
    #[arg(long, env = "WASM_PROVISIONER_FAILED_PROVISION_THRESHOLD", default_value_t = backoff::DEFAULT_FAILURE_THRESHOLD)]
    pub failed_provision_threshold: u32,

    /// Failed delete attempts before giving up on a volume (with a Warning Event); 0
    /// retries forever.
    #[arg(long, env = "WASM_PROVISIONER_FAILED_DELETE_THRESHOLD", default_value_t = backoff::DEFAULT_FAILURE_THRESHOLD)]
    pub failed_delete_threshold: u32,

    /// Tries to save a provisioned PV before deleting the backend volume.
    #[arg(long, env = "WASM_PROVISIONER_PV_SAVE_RETRIES", default_value_t = DEFAULT_PV_SAVE_RETRIES)]
    pub pv_save_retries: u32,

    /// Pause between tries to save a PV.
    #[arg(long, env = "WASM_PROVISIONER_PV_SAVE_INTERVAL", default_value = DEFAULT_PV_SAVE_INTERVAL, value_parser = humantime::parse_duration)]
    pub pv_save_interval: Duration,

    /// Add `external-provisioner.volume.kubernetes.io/finalizer` to our Bound PVs with
    /// reclaim policy Delete, so deleting the PV object first never orphans the volume.
    #[arg(long, env = "WASM_PROVISIONER_VOLUME_FINALIZER", default_value_t = true, action = clap::ArgAction::Set)]
    pub volume_protection_finalizer: bool,

    /// Provision a claim of one of our classes as soon as it is seen, before
    /// kube-controller-manager's binder announces it (its storage-provisioner
    /// annotation), unless an existing PV may be the claim's (an unclaimed PV of its
    /// class, or one whose claimRef names it): the binder then binds at once instead of
    /// announcing first. `false` waits for the announcement, as the Go library does.
    #[arg(long, env = "WASM_PROVISIONER_PROVISION_BEFORE_BINDER", default_value_t = true, action = clap::ArgAction::Set)]
    pub provision_before_binder: bool,

    /// The longest a Normal Event (Provisioning, ProvisioningSucceeded) waits while a
    /// provisioning storm is on (claims being provisioned, or our PVs not yet Bound), so
    /// that Events never compete with the writes the claims wait for; 0 writes them at
    /// once. Warnings never wait.
    #[arg(long, env = "WASM_PROVISIONER_EVENT_MAX_DELAY", default_value = DEFAULT_EVENT_MAX_DELAY, value_parser = humantime::parse_duration)]
    pub event_max_delay: Duration,

    /// Average Kubernetes API requests per second of this process.
    #[arg(long, env = "WASM_PROVISIONER_KUBE_API_QPS", default_value_t = DEFAULT_KUBE_API_QPS)]
    pub kube_api_qps: u32,

    /// Kubernetes API requests allowed in a burst.
    #[arg(long, env = "WASM_PROVISIONER_KUBE_API_BURST", default_value_t = DEFAULT_KUBE_API_BURST)]
    pub kube_api_burst: u32,

    /// Take part in leader election; only the leader works. Off for a single replica.
    #[arg(long, env = "WASM_PROVISIONER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// The host's own namespace, where its provisioning journal (a ConfigMap) and its
    /// leader Lease live; default: this pod's namespace, else `default`.
    #[arg(long, env = "WASM_PROVISIONER_NAMESPACE")]
    pub namespace: Option<String>,

    /// Namespace of the leader Lease; default: `--namespace`.
    #[arg(long, env = "WASM_PROVISIONER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// How long a leader's lease is valid without renewal.
    #[arg(long, env = "WASM_PROVISIONER_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// The leader stops all work when its last successful renewal started this long ago;
    /// the rest of the lease duration is the margin before a standby may take over.
    #[arg(long, env = "WASM_PROVISIONER_LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often the leader renews its lease and a standby tries to take it.
    #[arg(long, env = "WASM_PROVISIONER_LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Address for /metrics, /healthz and /readyz, such as 0.0.0.0:8080; off when empty.
    #[arg(long, env = "WASM_PROVISIONER_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,

    /// Test hook: exit (status 137, as kill -9) right after these steps. Never use it in
    /// production.
    #[arg(
        long,
        env = "WASM_PROVISIONER_FAULT_EXIT_AFTER",
        hide = true,
        value_enum,
        value_delimiter = ','
    )]
    pub fault_exit_after: Vec<Step>,

    /// Test hook: the chance of exiting at each `--fault-exit-after` step.
    #[arg(
        long,
        env = "WASM_PROVISIONER_FAULT_EXIT_PROBABILITY",
        hide = true,
        default_value_t = 1.0
    )]
    pub fault_exit_probability: f64,
}

impl ControllerArgs {
    fn settings(&self) -> Settings {
        Settings {
            provisioner_name: self.provisioner_name.clone(),
            threads: self.threads.max(1),
            resync_period: self.resync_period,
            retry: RetryPolicy {
                base_delay: self.retry_interval_start,
                max_delay: self.retry_interval_max,
                exponential: self.exponential_backoff_on_failure,
                ..RetryPolicy::default()
            },
            failed_provision_threshold: self.failed_provision_threshold,
            failed_delete_threshold: self.failed_delete_threshold,
            pv_save_retries: self.pv_save_retries,
            pv_save_interval: self.pv_save_interval,
            volume_protection_finalizer: self.volume_protection_finalizer,
            provision_before_binder: self.provision_before_binder,
            event_max_delay: self.event_max_delay,
            faults: Faults {
                steps: self.fault_exit_after.clone(),
                probability: self.fault_exit_probability,
            },
            identity: String::new(),
            journal_namespace: self.own_namespace(),
            journal_name: controller::journal_name(&leader::lease_name(&self.provisioner_name)),
        }
    }

    /// `--namespace`, else this pod's namespace, else `default`.
    fn own_namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(pod_namespace)
            .unwrap_or_else(|| "default".to_string())
    }
}

/// The in-cluster namespace of this pod, if running in one.
fn pod_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

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
pub async fn run(plugins: &crate::cli::PluginArgs, args: &ControllerArgs) -> anyhow::Result<()> {
    let config = client_config(args).await?;
    // The Lease gets its own client without the QPS limit: renewals must never wait
    // behind a provisioning storm.
    let lease_client = Client::try_from(config.clone())?;
    let client = crate::client::rate_limited(config, args.kube_api_qps, args.kube_api_burst)?;
    let grants = match &plugins.grants {
        Some(path) => Grants::load(path)?,
        None => Grants::none(),
    };
    let runtime = Runtime::new(RuntimeConfig {
        grants,
        cache_dir: plugins.cache_dir.clone(),
        guest_log_bytes_per_call: plugins.guest_log_bytes_per_call,
        max_module_bytes: plugins.max_module_bytes,
        max_guest_instances: plugins.max_guest_instances,
        compiler: Some(plugins.compiler()),
    })?;
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

    let metrics = Arc::new(Metrics::new());
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
    let work = {
        let client = client.clone();
        let metrics = metrics.clone();
        let health = health.clone();
        move |leadership: Leadership, stop: CancellationToken| {
            controller::run(client, settings, runtime, metrics, health, leadership, stop)
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
