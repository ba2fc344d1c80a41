//! The command line's arguments: every flag, its environment variable
//! (`WASM_PROVISIONER_...`) and its named default; docs/configuration.md lists them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use wasm_provisioner_rules::backoff::{self, RetryPolicy};
use wasm_provisioner_rules::names;
use wasm_provisioner_runtime::{Grants, GrantsError, RuntimeConfig};

use crate::controller::faults::Step;
use crate::controller::gone_nodes::Policy;
use crate::controller::{self, Faults, Settings};
use crate::leader;

/// Default modules directory (where the modules ConfigMap or volume is mounted).
pub const DEFAULT_MODULES_DIR: &str = "/etc/wasm-provisioner/modules";
/// Default log filter (tracing `EnvFilter` syntax).
pub const DEFAULT_LOG_FILTER: &str = "info";

#[derive(Debug, Parser)]
#[command(
    name = "wasm-provisioner",
    version,
    about = "Kubernetes volume provisioner with WebAssembly plugins"
)]
pub struct Cli {
    /// Log filter, such as `info` or `wasm_provisioner=debug,guest=trace`.
    #[arg(long, global = true, env = "WASM_PROVISIONER_LOG", default_value = DEFAULT_LOG_FILTER)]
    pub log: String,

    /// Log format: plain or json.
    #[arg(long, global = true, env = "WASM_PROVISIONER_LOG_FORMAT", default_value = "plain", value_parser = ["plain", "json"])]
    pub log_format: String,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the provisioner controller against the cluster.
    Run(RunArgs),
    /// Run one plugin call offline, without a cluster: see what a module would do.
    Guest(GuestArgs),
    /// Internal: compile one module read from stdin, bounded, and write the compiled
    /// component to stdout. The host runs itself with it; never run it by hand.
    #[command(name = wasm_provisioner_runtime::compile::SUBCOMMAND, hide = true)]
    CompileModule(wasm_provisioner_runtime::compile::CompileChildArgs),
}

/// Where plugins come from and what they may touch: shared by `run` and `guest`.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// Directory of plugin modules: module NAME is the file NAME.wasm.
    #[arg(long, env = "WASM_PROVISIONER_MODULES", default_value = DEFAULT_MODULES_DIR)]
    pub modules: PathBuf,

    /// Grants file (YAML): directories, outbound HTTP and limits per module. Without
    /// it, modules get no capabilities and the default limits.
    #[arg(long, env = "WASM_PROVISIONER_GRANTS")]
    pub grants: Option<PathBuf>,

    /// Directory for precompiled modules, writable by this process only. Without it,
    /// modules are compiled at every start.
    #[arg(long, env = "WASM_PROVISIONER_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Bytes of log (the `log` import, stdout and stderr together) one plugin call may
    /// write; the rest is dropped, counted, and reported once at the end of the call.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_LOG_BYTES_PER_CALL", default_value_t = wasm_provisioner_runtime::limits::DEFAULT_GUEST_LOG_BYTES_PER_CALL)]
    pub guest_log_bytes_per_call: usize,

    /// Largest module file read, in bytes: a larger one (or one that turns out larger
    /// while it is read) is refused like a broken version.
    #[arg(long, env = "WASM_PROVISIONER_MAX_MODULE_BYTES", default_value_t = wasm_provisioner_runtime::DEFAULT_MAX_MODULE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_module_bytes: u64,

    /// Guest instances alive at once, every module together: the size of the pool
    /// each call's instance comes from (and 4 linear memories and 4 tables per
    /// instance). Each module reserves its share at load, what one call defines times
    /// its maxConcurrentCalls; a module version that does not fit beside the others is
    /// refused at load. 0: no pool, the on-demand allocator (each call maps its memory
    /// afresh, nothing to share), as when the pool's address space cannot be reserved.
    #[arg(long, env = "WASM_PROVISIONER_MAX_GUEST_INSTANCES", default_value_t = wasm_provisioner_runtime::engine::DEFAULT_MAX_GUEST_INSTANCES, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub max_guest_instances: u32,

    /// Longest one module's compile may take (wall clock). Each module missing from
    /// the cache is compiled in a child process, killed at this timeout; the version is
    /// then refused until its bytes change or the host restarts.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_TIMEOUT", default_value = DEFAULT_COMPILE_TIMEOUT, value_parser = positive_duration)]
    pub compile_timeout: std::time::Duration,

    /// Most memory one module's compile may use, in bytes (the compile child's
    /// RLIMIT_DATA); a compile needing more is stopped and the version refused.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_MEMORY_BYTES", default_value_t = wasm_provisioner_runtime::compile::DEFAULT_COMPILE_MEMORY_BYTES, value_parser = clap::value_parser!(u64).range(MIN_COMPILE_MEMORY_BYTES..))]
    pub compile_memory_bytes: u64,
}

/// Default of `--compile-timeout` ([`DEFAULT_COMPILE_TIMEOUT`](wasm_provisioner_runtime::compile::DEFAULT_COMPILE_TIMEOUT)).
pub const DEFAULT_COMPILE_TIMEOUT: &str = "120s";
/// Least `--compile-memory-bytes`: below it not even the compile child's engine starts.
pub const MIN_COMPILE_MEMORY_BYTES: u64 = 32 << 20;

fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be more than 0s".into()),
        Err(error) => Err(error.to_string()),
    }
}

impl PluginArgs {
    /// The plugin runtime's configuration, grants file read: built here only, for `run`
    /// and the offline runner alike.
    pub fn runtime_config(&self) -> Result<RuntimeConfig, GrantsError> {
        let grants = match &self.grants {
            Some(path) => Grants::load(path)?,
            None => Grants::none(),
        };
        Ok(RuntimeConfig {
            grants,
            cache_dir: self.cache_dir.clone(),
            guest_log_bytes_per_call: self.guest_log_bytes_per_call,
            max_module_bytes: self.max_module_bytes,
            max_guest_instances: self.max_guest_instances,
            compiler: Some(self.compiler()),
        })
    }

    /// How `run` and the offline runner compile: in a child process of this binary,
    /// bounded by `--compile-timeout` and `--compile-memory-bytes`.
    pub fn compiler(&self) -> wasm_provisioner_runtime::CompilerConfig {
        wasm_provisioner_runtime::CompilerConfig::this_binary(
            self.compile_timeout,
            self.compile_memory_bytes,
        )
    }
}

/// Arguments of `run` (the controller).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    #[command(flatten)]
    pub sources: SourceArgs,

    #[command(flatten)]
    pub controller: ControllerArgs,
}

/// Default of `--module-store`: beside the compile cache, on the Deployment's cache volume.
pub const DEFAULT_MODULE_STORE: &str = "/var/cache/wasm-provisioner/modules";
/// Default of `--module-poll-interval`.
pub const DEFAULT_MODULE_POLL_INTERVAL: &str = "5m";

/// Modules from OCI registries (the grants file's `source.oci`, docs/modules.md).
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The module store: what was pulled from registries, by sha256 (an OCI image
    /// layout), so a restart or a replica sharing it does not download again. Pre-fill it
    /// (`oras copy --to-oci-layout`) for an air-gapped cluster. Used only when a module
    /// has an OCI source.
    #[arg(long, env = "WASM_PROVISIONER_MODULE_STORE", default_value = DEFAULT_MODULE_STORE)]
    pub module_store: PathBuf,

    /// How often a module named by tag is resolved again (a new digest is pulled and
    /// hot-reloaded), and a failed pull tried again. A module named by digest is never
    /// resolved again.
    #[arg(long, env = "WASM_PROVISIONER_MODULE_POLL_INTERVAL", default_value = DEFAULT_MODULE_POLL_INTERVAL, value_parser = positive_duration)]
    pub module_poll_interval: std::time::Duration,
}

impl SourceArgs {
    pub fn source_config(&self) -> wasm_provisioner_runtime::SourceConfig {
        wasm_provisioner_runtime::SourceConfig {
            store_dir: self.module_store.clone(),
            poll_interval: self.module_poll_interval,
        }
    }
}

#[derive(Debug, Args)]
pub struct GuestArgs {
    #[command(subcommand)]
    pub command: GuestCommand,
}

#[derive(Debug, Subcommand)]
pub enum GuestCommand {
    /// Provision a claim with a module and print the PersistentVolume (YAML) the
    /// controller would create. The backend work really happens (inside the grants).
    Provision(GuestProvisionArgs),
    /// Delete the backend volume of a PersistentVolume with a module.
    Delete(GuestDeleteArgs),
    /// Check a StorageClass with a module's `validate-class` (capability
    /// validate-class): exits 0 when the module accepts it, 1 with its reason when not.
    Validate(GuestValidateArgs),
    /// Ask a module for the backend capacity of a StorageClass (capability
    /// report-capacity) and print it (YAML).
    Capacity(GuestCapacityArgs),
    /// Grow the backend volume of a PersistentVolume with a module (capability expand)
    /// and print the PV (YAML) with its new capacity.
    Expand(GuestExpandArgs),
    /// Create a new guest project (Rust, Python or JavaScript) outside this repository:
    /// the WIT at this host's version, a plugin, build.sh, test.sh and a README.
    New(GuestNewArgs),
}

#[derive(Debug, Clone, Args)]
pub struct GuestNewArgs {
    /// The module name (a DNS label): the project, the crate or package, and the
    /// module file `NAME.wasm` are named after it.
    pub name: String,

    /// The language of the guest.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_LANG", value_enum)]
    pub lang: crate::cli::guest_new::Lang,

    /// The directory to create (it must not exist, or be empty); default `./NAME`.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_DIR")]
    pub dir: Option<PathBuf>,

    /// Rust only: depend on the SDK crate at this path (a clone's `guests/sdk`) instead
    /// of the git tag of this host's version.
    #[arg(long, env = "WASM_PROVISIONER_SDK_PATH")]
    pub sdk_path: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct GuestProvisionArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// StorageClass YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: PathBuf,

    /// PersistentVolumeClaim YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLAIM")]
    pub claim: PathBuf,

    /// Node YAML file: the node selected for a WaitForFirstConsumer claim.
    #[arg(long, env = "WASM_PROVISIONER_NODE")]
    pub node: Option<PathBuf>,

    /// Provisioner name recorded on the PV (`pv.kubernetes.io/provisioned-by`).
    #[arg(long, env = "WASM_PROVISIONER_PROVISIONER_NAME", default_value = names::DEFAULT_PROVISIONER_NAME)]
    pub provisioner_name: String,
}

#[derive(Debug, Clone, Args)]
pub struct GuestDeleteArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter, then to the
    /// PV's `wasm-provisioner.dev/module` annotation.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// PersistentVolume YAML file.
    #[arg(long, env = "WASM_PROVISIONER_VOLUME")]
    pub volume: PathBuf,

    /// StorageClass YAML file (its parameters go to the plugin).
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct GuestValidateArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// StorageClass YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct GuestCapacityArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// StorageClass YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: PathBuf,

    /// Node YAML file: the node whose capacity is asked (node-local mode).
    #[arg(long, env = "WASM_PROVISIONER_NODE")]
    pub node: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct GuestExpandArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter, then to the
    /// PV's `wasm-provisioner.dev/module` annotation.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// PersistentVolume YAML file (such as what `guest provision` printed).
    #[arg(long, env = "WASM_PROVISIONER_VOLUME")]
    pub volume: PathBuf,

    /// StorageClass YAML file (its parameters go to the plugin).
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: Option<PathBuf>,

    /// The size to grow to, a quantity such as `2Gi`: the claim's new request. It must
    /// be larger than the PV's capacity.
    #[arg(long, env = "WASM_PROVISIONER_SIZE")]
    pub size: String,
}

/// Defaults, named once; docs/configuration.md lists them.
pub const DEFAULT_THREADS: u16 = 8;
pub const DEFAULT_RESYNC: &str = "15m";
pub const DEFAULT_KUBE_API_QPS: u32 = 200;
pub const DEFAULT_KUBE_API_BURST: u32 = 300;
pub const DEFAULT_PV_SAVE_RETRIES: u32 = 5;
pub const DEFAULT_PV_SAVE_INTERVAL: &str = "10s";
pub const DEFAULT_EVENT_MAX_DELAY: &str = "30s";
pub const DEFAULT_CAPACITY_POLL_INTERVAL: &str = "60s";
pub const DEFAULT_NODE_ADDRESS: &str = "0.0.0.0:9443";
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/wasm-provisioner/token";
pub const DEFAULT_INSTANCE_SELECTOR: &str = "app=wasm-provisioner-node";
pub const DEFAULT_NODE_GONE_GRACE: &str = "1h";

/// How the host is deployed (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Deployment,
    NodeLocal,
}

/// Node-local mode: what this process does (`--node-local-role`). The shipped manifests
/// run `controller` (a Deployment under the ServiceAccount that may write) and `node` (the
/// DaemonSet, under one that may only read the Lease), so a compromised node holds no
/// credential that creates or deletes PVs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeLocalRole {
    /// Elects, leads, and serves its own node's calls (one ServiceAccount for all).
    All,
    /// Elects and leads; serves no node: every call for a node goes to its instance.
    Controller,
    /// Serves its node's calls; never elects, makes no API write, reads only the Lease.
    Node,
}

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

    /// How often the leader asks the module of each class of ours that reports capacity
    /// (`get-capacity`) for its backend's space, exported as
    /// wasm_provisioner_backend_capacity_bytes.
    #[arg(long, env = "WASM_PROVISIONER_CAPACITY_POLL_INTERVAL", default_value = DEFAULT_CAPACITY_POLL_INTERVAL, value_parser = humantime::parse_duration)]
    pub capacity_poll_interval: Duration,

    /// The node this host runs on (the manifests set it from the downward API's
    /// `spec.nodeName`). Guests get it as their call's node (`call-context.node`), so a
    /// guest that makes volumes on its own node (hostpath) refuses a volume for another
    /// node instead of making it on the wrong machine. Unset: guests are told no node.
    #[arg(long, env = "WASM_PROVISIONER_NODE_NAME")]
    pub node_name: Option<String>,

    /// `deployment`: one elected replica makes every guest call in its own process.
    /// `node-local`: the host runs as a DaemonSet; the elected instance still does all
    /// the API work, and sends each guest call to the instance on the call's node (the
    /// claim's selected node, the node recorded on the PV) over mutual TLS
    /// (docs/install.md, "Node-local mode").
    #[arg(long, env = "WASM_PROVISIONER_MODE", value_enum, default_value_t = Mode::Deployment)]
    pub mode: Mode,

    /// Node-local mode: `all` (every instance elects; the leader serves its own node in
    /// process), `controller` (elects and leads, serves no node) or `node` (serves its
    /// node's calls, never elects, reads only the Lease) (docs/install.md, "Node-local
    /// mode").
    #[arg(long, env = "WASM_PROVISIONER_NODE_LOCAL_ROLE", value_enum, default_value_t = NodeLocalRole::All)]
    pub node_local_role: NodeLocalRole,

    /// Node-local mode: this pod's IP (the manifests set it from `status.podIP`); the
    /// leader advertises it, with the channel's port, for the instances to enrol.
    #[arg(long, env = "WASM_PROVISIONER_POD_IP")]
    pub pod_ip: Option<std::net::IpAddr>,

    /// Node-local mode: where this instance serves the node channel (mutual TLS).
    #[arg(long, env = "WASM_PROVISIONER_NODE_ADDRESS", default_value = DEFAULT_NODE_ADDRESS)]
    pub node_address: SocketAddr,

    /// Node-local mode: this pod's projected ServiceAccount token (audience
    /// `wasm-provisioner`), with which it enrols with the leader.
    #[arg(long, env = "WASM_PROVISIONER_TOKEN_FILE", default_value = DEFAULT_TOKEN_FILE)]
    pub token_file: PathBuf,

    /// Node-local mode: the label selector of the instances' pods (the DaemonSet's) in
    /// the host's namespace; the leader finds each node's instance among them.
    #[arg(long, env = "WASM_PROVISIONER_INSTANCE_SELECTOR", default_value = DEFAULT_INSTANCE_SELECTOR)]
    pub instance_selector: String,

    /// Node-local mode: what becomes of the PVs of a Node that was deleted (their data
    /// is on its disk; no other node deletes it). `keep`: a Warning Event, and the PVs
    /// stay for the admin. `remove`: after --node-gone-grace, the PV objects are removed
    /// without cleaning the backend, with a Warning Event saying so.
    #[arg(long, env = "WASM_PROVISIONER_NODE_GONE_POLICY", value_enum, default_value_t = Policy::Keep)]
    pub node_gone_policy: Policy,

    /// Node-local mode: how long a Node must be gone before `--node-gone-policy=remove`
    /// removes its PVs.
    #[arg(long, env = "WASM_PROVISIONER_NODE_GONE_GRACE", default_value = DEFAULT_NODE_GONE_GRACE, value_parser = humantime::parse_duration)]
    pub node_gone_grace: Duration,

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
    pub fn settings(&self) -> Settings {
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
            node_name: self.node_name.clone().filter(|name| !name.is_empty()),
            node_gone_policy: self.node_gone_policy,
            node_gone_grace: self.node_gone_grace,
            // A zero interval would poll in a busy loop.
            capacity_poll_interval: self
                .capacity_poll_interval
                .max(std::time::Duration::from_secs(1)),
            faults: Faults {
                steps: self.fault_exit_after.clone(),
                probability: self.fault_exit_probability,
            },
            identity: String::new(),
            journal_namespace: self.own_namespace(),
            journal_name: controller::journal_name(&leader::lease_name(&self.provisioner_name)),
        }
    }

    /// Node-local mode's settings; `None` in Deployment mode. Refuses a node-local
    /// configuration that lacks what it needs.
    pub fn node_local(&self) -> anyhow::Result<Option<crate::nodes::Settings>> {
        use crate::nodes::NodeRole;
        if self.mode != Mode::NodeLocal {
            return Ok(None);
        }
        let role = match self.node_local_role {
            NodeLocalRole::All => NodeRole::All,
            NodeLocalRole::Controller => NodeRole::Controller,
            NodeLocalRole::Node => NodeRole::Node,
        };
        let node_name = self.node_name.clone().filter(|name| !name.is_empty());
        if role != NodeRole::Controller && node_name.is_none() {
            anyhow::bail!(
                "--mode=node-local needs --node-name (WASM_PROVISIONER_NODE_NAME, from the downward API's spec.nodeName), unless --node-local-role=controller"
            );
        }
        if role.elects() && self.pod_ip.is_none() {
            anyhow::bail!(
                "--mode=node-local needs --pod-ip (WASM_PROVISIONER_POD_IP, from the downward API's status.podIP) in a process that may lead (--node-local-role all or controller)"
            );
        }
        if role.elects() && !self.leader_elect {
            anyhow::bail!(
                "--mode=node-local needs --leader-elect=true: one instance leads (--node-local-role all or controller)"
            );
        }
        let namespace = self.own_namespace();
        Ok(Some(crate::nodes::Settings {
            role,
            node_name,
            pod_ip: self.pod_ip,
            address: self.node_address,
            token_file: self.token_file.clone(),
            instance_selector: self.instance_selector.clone(),
            lease: (
                self.leader_election_namespace
                    .clone()
                    .unwrap_or_else(|| namespace.clone()),
                leader::lease_name(&self.provisioner_name),
            ),
            namespace,
        }))
    }

    /// `--namespace`, else this pod's namespace, else `default`.
    pub(crate) fn own_namespace(&self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        fn walk(command: &clap::Command, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if arg.get_long().is_some() && !builtin && arg.get_env().is_none() {
                    missing.push(format!(
                        "{} --{}",
                        command.get_name(),
                        arg.get_long().unwrap()
                    ));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), &mut missing);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }

    #[test]
    fn guest_provision_parses() {
        let cli = Cli::try_parse_from([
            "wasm-provisioner",
            "guest",
            "provision",
            "--modules",
            "/m",
            "--module",
            "hostpath",
            "--class",
            "sc.yaml",
            "--claim",
            "pvc.yaml",
        ])
        .unwrap();
        let Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) = cli.command
        else {
            panic!("not guest provision");
        };
        assert_eq!(args.module.as_deref(), Some("hostpath"));
        assert_eq!(args.provisioner_name, names::DEFAULT_PROVISIONER_NAME);
        assert!(args.plugins.grants.is_none());
        assert_eq!(args.plugins.max_module_bytes, 64 * 1024 * 1024);
    }

    #[test]
    fn guest_capability_commands_parse() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let Command::Guest(GuestArgs {
            command: GuestCommand::Validate(args),
        }) = parse(&[
            "wasm-provisioner",
            "guest",
            "validate",
            "--class",
            "sc.yaml",
        ])
        .unwrap()
        .command
        else {
            panic!("not guest validate");
        };
        assert_eq!(args.class, PathBuf::from("sc.yaml"));
        let Command::Guest(GuestArgs {
            command: GuestCommand::Capacity(args),
        }) = parse(&[
            "wasm-provisioner",
            "guest",
            "capacity",
            "--class",
            "sc.yaml",
            "--node",
            "node.yaml",
        ])
        .unwrap()
        .command
        else {
            panic!("not guest capacity");
        };
        assert_eq!(args.node, Some(PathBuf::from("node.yaml")));
        let Command::Guest(GuestArgs {
            command: GuestCommand::Expand(args),
        }) = parse(&[
            "wasm-provisioner",
            "guest",
            "expand",
            "--volume",
            "pv.yaml",
            "--size",
            "2Gi",
        ])
        .unwrap()
        .command
        else {
            panic!("not guest expand");
        };
        assert_eq!(args.size, "2Gi");
        assert!(args.class.is_none());
        // --size is required.
        assert!(parse(&["wasm-provisioner", "guest", "expand", "--volume", "pv.yaml"]).is_err());
    }

    #[test]
    fn max_module_bytes_is_a_positive_byte_count_for_run_and_guest() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let plugins = |cli: Cli| match cli.command {
            Command::Run(args) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Provision(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Delete(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Validate(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Capacity(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Expand(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::New(_),
            })
            | Command::CompileModule(_) => unreachable!("no plugin arguments"),
        };
        let cli = parse(&["wasm-provisioner", "run", "--max-module-bytes", "1048576"]).unwrap();
        assert_eq!(plugins(cli).max_module_bytes, 1 << 20);
        let cli = parse(&[
            "wasm-provisioner",
            "guest",
            "delete",
            "--volume",
            "pv.yaml",
            "--max-module-bytes=4096",
        ])
        .unwrap();
        assert_eq!(plugins(cli).max_module_bytes, 4096);
        assert!(parse(&["wasm-provisioner", "run", "--max-module-bytes", "0"]).is_err());
        assert!(parse(&["wasm-provisioner", "run", "--max-module-bytes", "64MiB"]).is_err());
    }

    #[test]
    fn compile_limits_are_flags_of_run_and_guest_with_defaults() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let Command::Run(args) = parse(&["wasm-provisioner", "run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            wasm_provisioner_runtime::compile::DEFAULT_COMPILE_TIMEOUT
        );
        assert_eq!(
            args.plugins.compile_memory_bytes,
            wasm_provisioner_runtime::compile::DEFAULT_COMPILE_MEMORY_BYTES
        );
        let Command::Run(args) = parse(&[
            "wasm-provisioner",
            "run",
            "--compile-timeout=3s",
            "--compile-memory-bytes=268435456",
        ])
        .unwrap()
        .command
        else {
            panic!("not run");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            std::time::Duration::from_secs(3)
        );
        assert_eq!(args.plugins.compile_memory_bytes, 256 << 20);
        assert!(parse(&["wasm-provisioner", "run", "--compile-timeout=0s"]).is_err());
        assert!(parse(&["wasm-provisioner", "run", "--compile-memory-bytes=1024"]).is_err());
        let Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) = parse(&[
            "wasm-provisioner",
            "guest",
            "provision",
            "--class=c",
            "--claim=p",
            "--compile-timeout=1m",
        ])
        .unwrap()
        .command
        else {
            panic!("not guest provision");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            std::time::Duration::from_secs(60)
        );
    }

    #[test]
    fn node_local_roles_need_what_they_use() {
        let settings = |extra: &[&str]| {
            let mut argv = vec![
                "wasm-provisioner",
                "run",
                "--mode=node-local",
                "--namespace=ns",
            ];
            argv.extend_from_slice(extra);
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not run");
            };
            args.controller.node_local()
        };
        // all: a node and a pod IP.
        assert!(settings(&["--pod-ip=10.0.0.1"]).is_err());
        assert!(settings(&["--node-name=a"]).is_err());
        let all = settings(&["--node-name=a", "--pod-ip=10.0.0.1"])
            .unwrap()
            .unwrap();
        assert_eq!(all.role, crate::nodes::NodeRole::All);
        // controller: a pod IP, no node needed; it elects.
        let controller = settings(&["--node-local-role=controller", "--pod-ip=10.0.0.1"])
            .unwrap()
            .unwrap();
        assert_eq!(controller.node_name, None);
        assert!(controller.role.elects());
        assert!(settings(&["--node-local-role=controller", "--node-name=a"]).is_err());
        assert!(
            settings(&[
                "--node-local-role=controller",
                "--pod-ip=10.0.0.1",
                "--leader-elect=false"
            ])
            .is_err()
        );
        // node: a node, no pod IP; it never elects, and follows the provisioner's Lease.
        assert!(settings(&["--node-local-role=node"]).is_err());
        let node = settings(&[
            "--node-local-role=node",
            "--node-name=a",
            "--leader-elect=false",
        ])
        .unwrap()
        .unwrap();
        assert!(!node.role.elects());
        assert_eq!(node.pod_ip, None);
        assert_eq!(
            node.lease,
            (
                "ns".to_string(),
                names::DEFAULT_PROVISIONER_NAME.replace('/', "-")
            )
        );
    }
}
