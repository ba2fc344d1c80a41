//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager from upstream, started by our launcher in
//! `tests/controlplane/`.
//!
//! One control plane serves a whole test process. When `KUBECONFIG` is set the tests use
//! that cluster instead. Otherwise the first test to ask builds the launcher (cached
//! outside the repo, keyed on go.sum) and starts `controlplane run`, which watches this
//! process and tears everything down, by PID, when it exits.
//!
//! kube `Client`s are tied to the tokio runtime that made them, and every `#[tokio::test]`
//! has its own runtime: so this module shares the kubeconfig, never a client.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The repository root (this crate lives in `tests/`).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The Kubernetes release the launcher is pinned to, read from its go.mod.
pub fn pinned_kubernetes_version() -> String {
    let go_mod = std::fs::read_to_string(repo_root().join("tests/controlplane/go.mod"))
        .expect("tests/controlplane/go.mod is readable");
    go_mod
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("k8s.io/kubernetes "))
        .map(|version| version.trim().to_string())
        .expect("tests/controlplane/go.mod requires k8s.io/kubernetes")
}

/// Where the cluster the tests run against is, and the process we started, if any.
struct ControlPlane {
    kubeconfig: PathBuf,
    /// The `controlplane run` child; it stops its components when this process exits.
    _launcher: Option<Mutex<Child>>,
}

static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();

fn control_plane() -> &'static ControlPlane {
    CONTROL_PLANE.get_or_init(|| match std::env::var_os("KUBECONFIG") {
        Some(path) if !path.is_empty() => ControlPlane {
            kubeconfig: PathBuf::from(path),
            _launcher: None,
        },
        _ => start_control_plane().unwrap_or_else(|error| panic!("{error:#}")),
    })
}

/// Builds (or finds in the cache) the launcher binary and returns its path.
pub fn launcher_binary() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("tests/controlplane/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "building the control-plane launcher failed ({}); run `bash tests/controlplane/build.sh` to see why",
            output.status
        );
    }
    let path = String::from_utf8(output.stdout)?
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    if path.is_empty() || !Path::new(&path).exists() {
        bail!("tests/controlplane/build.sh printed no launcher path");
    }
    Ok(PathBuf::from(path))
}

fn start_control_plane() -> anyhow::Result<ControlPlane> {
    let launcher = launcher_binary()?;
    let started = Instant::now();
    let mut command = Command::new(&launcher);
    command
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // In a process group of its own, so a terminal's Ctrl-C reaches this process (the
    // demo cleans up through the API first), not the control plane; the launcher stops
    // its components when this process exits, however it exits.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", launcher.display()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let kubeconfig = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(path) = line.strip_prefix("kubeconfig: ") {
                    break PathBuf::from(path.trim());
                }
            }
            _ => {
                let status = child.wait()?;
                bail!(
                    "the control plane exited before it was ready ({status}); its stderr is above"
                );
            }
        }
    };
    // Keep draining the launcher's stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    eprintln!(
        "control plane ready in {:.1}s; KUBECONFIG={}",
        started.elapsed().as_secs_f64(),
        kubeconfig.display()
    );
    Ok(ControlPlane {
        kubeconfig,
        _launcher: Some(Mutex::new(child)),
    })
}

/// The admin kubeconfig of the test cluster (starting the control plane if needed).
pub fn admin_kubeconfig() -> PathBuf {
    control_plane().kubeconfig.clone()
}

/// A client config for the test cluster as admin.
pub async fn admin_config() -> anyhow::Result<Config> {
    let path = admin_kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// An admin client for the test cluster, bound to the calling test's runtime.
pub async fn admin_client() -> anyhow::Result<Client> {
    Ok(Client::try_from(admin_config().await?)?)
}

/// A client that authenticates with `token` instead of the admin token.
pub async fn client_with_token(token: &str) -> anyhow::Result<Client> {
    let mut config = admin_config().await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Ok(Client::try_from(config)?)
}

/// Mints a short-lived token for ServiceAccount `namespace/name` (creating the account if
/// it does not exist), so a test can act with exactly that account's RBAC.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    if accounts.get_opt(name).await?.is_none() {
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        accounts.create(&PostParams::default(), &account).await?;
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let response = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    response
        .status
        .map(|status| status.token)
        .ok_or_else(|| anyhow!("TokenRequest for {namespace}/{name} returned no token"))
}

/// One test's view of the cluster: an admin client and a namespace of its own.
pub struct TestContext {
    pub client: Client,
    pub namespace: String,
}

impl TestContext {
    /// Connects as admin and creates a fresh namespace named after `test` plus a random
    /// suffix, so tests never see each other's objects.
    pub async fn new(test: &str) -> anyhow::Result<Self> {
        let client = admin_client().await?;
        let namespace = format!("{}-{}", sanitize(test), random_suffix());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let object = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating namespace {namespace}"))?;
        Ok(Self { client, namespace })
    }

    /// Deletes the namespace (best effort; the namespace controller finishes it).
    pub async fn cleanup(self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}

fn sanitize(test: &str) -> String {
    let name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.trim_matches('-')
        .chars()
        .take(40)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

/// A short random suffix from the clock, the process id and a counter (no extra
/// dependency needed): unique within a process, and across processes in practice.
pub fn random_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
        .unwrap_or_default();
    let mixed = nanos
        .wrapping_mul(6364136223846793005)
        .wrapping_add(std::process::id() as u64)
        .wrapping_add(count << 44);
    format!("{:06x}", (mixed >> 20) & 0xff_ffff)
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout` with
/// `what` in the message.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    wait_for_every(what, timeout, Duration::from_millis(200), check).await
}

/// [`wait_for`], polling every `interval`: for a test whose next step must follow the
/// awaited state closely.
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        if Instant::now() >= deadline {
            return Err(match last_error {
                Some(error) => {
                    error.context(format!("timed out after {timeout:?} waiting for {what}"))
                }
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(interval).await;
    }
}
