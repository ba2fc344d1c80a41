//! The node-local benchmark (`bash bench/nodes.sh`): N pods with WaitForFirstConsumer
//! claims of hostpath, placed by kube-scheduler over K nodes, provisioned first by one
//! host in Deployment mode and then by K instances in node-local mode (one process per
//! "node", each with its own data directory standing for its disk). Prints, per run:
//! claims/s, the leader's API requests per volume (and its CSIStorageCapacity writes
//! apart), 409 conflicts, the leader→instance call time (p50, p99), RSS per instance,
//! what the other instances asked of the API, and the watches each instance holds and
//! the bytes they brought during the run (the other instances should hold no watch of
//! claims or PVs). Needs a control plane with kube-scheduler (KUBECONFIG; bench/nodes.sh
//! starts one).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::host::{Host, HostConfig};
use wasm_provisioner_tests::metrics::{
    Requests, Watches, host_requests, host_watches, is_write, parse_samples, settled_requests,
};
use wasm_provisioner_tests::nodes::{
    INSTANCE_LABEL, TestNode, app_pod, controller_flags, hostpath_grants, test_nodes,
};

#[derive(Parser, Debug)]
struct Args {
    /// Node counts to run, in order (one node-local run each, and one Deployment-mode run
    /// over as many nodes).
    #[arg(long, value_delimiter = ',', default_value = "3")]
    nodes: Vec<usize>,

    /// Pods (each with its claim) created at once per run.
    #[arg(long, default_value_t = 150)]
    claims: usize,

    /// Where the table goes (also printed).
    #[arg(long, default_value = "nodes-results")]
    out: PathBuf,

    /// Keep each run's files (every host's log) under `<out>/<mode>-<nodes>/`.
    #[arg(long)]
    keep: bool,
}

/// What one run measured.
struct Figures {
    mode: String,
    nodes: usize,
    claims: usize,
    bound_s: f64,
    deleted_s: f64,
    /// The leader's requests while provisioning (until they settled).
    leader: Requests,
    /// The leader's guest calls to other nodes: (p50, p99) seconds, bucket bounds.
    node_calls: Option<(f64, f64, f64)>,
    rss_mib: Vec<f64>,
    /// Every other instance's requests, summed (watches included).
    others: Requests,
    /// The leader's watch bytes during the run.
    leader_watch_bytes: f64,
    /// The watches the leader holds at the end of the run, by resource.
    leader_watches: BTreeMap<String, f64>,
    /// The other instances: the most watch bytes one received during the run, and the
    /// watches they hold at its end (by resource, the most one instance holds).
    others_watch_bytes_max: f64,
    others_watches: BTreeMap<String, f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let mut figures = Vec::new();
    for &nodes in &args.nodes {
        for mode in [Mode::Deployment, Mode::NodeLocalAll, Mode::NodeLocalSplit] {
            let keep = args
                .keep
                .then(|| args.out.join(format!("{}-{nodes}", mode.slug())));
            figures.push(run(nodes, args.claims, mode, keep).await?);
        }
    }
    let table = table(&figures);
    println!("{table}");
    std::fs::write(args.out.join("nodes.md"), &table)?;
    Ok(())
}

/// How the hosts of a run are deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One host, every call in its process.
    Deployment,
    /// An instance per node, every one a candidate (`--node-local-role=all`).
    NodeLocalAll,
    /// A controller that serves no node and an instance per node that never elects
    /// (`--node-local-role=controller` and `node`: the shipped manifests).
    NodeLocalSplit,
}

impl Mode {
    /// The mode as a directory name.
    fn slug(self) -> &'static str {
        match self {
            Mode::Deployment => "deployment",
            Mode::NodeLocalAll => "node-local-all",
            Mode::NodeLocalSplit => "node-local-split",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Deployment => "deployment",
            Mode::NodeLocalAll => "node-local, role all",
            Mode::NodeLocalSplit => "node-local, controller + nodes",
        }
    }
}

/// One run: K nodes, N pods with claims, provisioned by one host or by an instance
/// per node (and a controller); then everything deleted.
async fn run(k: usize, n: usize, mode: Mode, keep: Option<PathBuf>) -> anyhow::Result<Figures> {
    eprintln!("run: {}, {k} nodes, {n} claims", mode.label());
    let mut fx = Fixture::new(&format!("bench-nodes-{k}")).await?;
    let prefix = format!("bn-{}", fx.ctx.namespace);
    let result = async {
        let nodes = test_nodes(&fx, &prefix, k).await?;
        fx.install_module("hostpath", "hostpath");
        let cache = fx.root.join("cwasm");
        std::fs::create_dir_all(&cache)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700))?;
        let mut hosts = Vec::new();
        if mode == Mode::NodeLocalSplit {
            // A DaemonSet's port: the controller calls every instance on its own.
            let port = nodes[0].port;
            let mut flags = controller_flags("127.0.0.254", port);
            flags.push(format!("--cache-dir={}", cache.display()));
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let config = fx.host_config(&flags);
            hosts.push(Host::spawn(&config)?);
        }
        if mode != Mode::Deployment {
            for node in &nodes {
                let mut config = instance_config(&fx, node, &cache)?;
                if mode == Mode::NodeLocalSplit {
                    config.args.push("--node-local-role=node".into());
                }
                hosts.push(Host::spawn(&config)?);
            }
        } else {
            let data = fx.root.join("data-deployment").join("hostpath");
            let grants = fx.root.join("grants-deployment.yaml");
            hostpath_grants(&grants, &data)?;
            let mut config = fx.host_config(&[&format!("--cache-dir={}", cache.display())]);
            config.grants = Some(grants);
            hosts.push(Host::spawn(&config)?);
        }
        for host in &hosts {
            host.wait_ready(Duration::from_secs(300))?;
        }
        // Ready is before the module's first compile ends: wait for it on every host,
        // so the run measures provisioning, not compiling.
        for host in &hosts {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let loaded = host
                    .metric("wasm_provisioner_module_compiles_total")
                    .unwrap_or(0.0)
                    + host
                        .metric("wasm_provisioner_compile_cache_hits_total")
                        .unwrap_or(0.0);
                if loaded >= 1.0 {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "hostpath not loaded after 300 s; the log:\n{}",
                        host.log_text()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let leader = wait_leader(&hosts).await?;
        if mode != Mode::Deployment {
            wait_enrolled(&hosts, leader).await?;
        }
        let class = fx
            .class(
                "hostpath",
                &[("nodePath", "/srv/volumes"), ("pvType", "local")],
                json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
            )
            .await?;
        // Node-local: the first CSIStorageCapacity poll is not waited for (no CSIDriver
        // here: the scheduler does not consult them).
        let before = host_requests(&hosts[leader])?;
        let others_before: Vec<Requests> = hosts
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, h)| host_requests(h))
            .collect::<Result<_, _>>()?;
        let watches_before: Vec<Watches> =
            hosts.iter().map(host_watches).collect::<Result<_, _>>()?;
        let started = Instant::now();
        create(&fx, &class, n).await?;
        wait_bound(&fx, n).await?;
        let bound_s = started.elapsed().as_secs_f64();
        let leader_requests = settled_requests(&hosts[leader], Duration::from_secs(3))
            .await?
            .since(&before);
        let node_calls = node_call_quantiles(&hosts[leader])?;
        let mut writes: BTreeMap<String, f64> = BTreeMap::new();
        for ((verb, resource, _), value) in &leader_requests.0 {
            if is_write(verb) {
                *writes.entry(format!("{verb} {resource}")).or_default() += value;
            }
        }
        eprintln!(
            "{} over {k} nodes: the leader's writes {writes:?}",
            mode.label()
        );
        let rss_mib = hosts
            .iter()
            .filter_map(|h| h.rss_bytes())
            .map(|b| b as f64 / (1024.0 * 1024.0))
            .collect();
        let mut others = Requests::default();
        for ((_, host), earlier) in hosts
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .zip(&others_before)
        {
            for (key, value) in host_requests(host)?.since(earlier).0 {
                *others.0.entry(key).or_default() += value;
            }
        }
        let mut leader_watch_bytes = 0.0;
        let mut leader_watches = BTreeMap::new();
        let mut others_watch_bytes_max: f64 = 0.0;
        let mut others_watches: BTreeMap<String, f64> = BTreeMap::new();
        for (i, (host, before)) in hosts.iter().zip(&watches_before).enumerate() {
            let now = host_watches(host)?;
            let bytes = now.bytes - before.bytes;
            if i == leader {
                leader_watch_bytes = bytes;
                leader_watches = now.open;
            } else {
                others_watch_bytes_max = others_watch_bytes_max.max(bytes);
                for (resource, open) in now.open {
                    let most = others_watches.entry(resource).or_default();
                    *most = most.max(open);
                }
            }
        }
        let started = Instant::now();
        delete(&fx, n).await?;
        let deleted_s = started.elapsed().as_secs_f64();
        for host in &mut hosts {
            let _ = host.terminate(Duration::from_secs(20));
        }
        anyhow::Ok(Figures {
            mode: mode.label().into(),
            nodes: k,
            claims: n,
            bound_s,
            deleted_s,
            leader: leader_requests,
            node_calls,
            rss_mib,
            others,
            leader_watch_bytes,
            leader_watches,
            others_watch_bytes_max,
            others_watches,
        })
    }
    .await;
    fx.delete_nodes(&prefix, k).await;
    if let Some(keep) = keep {
        let _ = std::fs::remove_dir_all(&keep);
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(&fx.root)
            .arg(&keep)
            .status()?;
        anyhow::ensure!(
            copied.success(),
            "copying {} to {}",
            fx.root.display(),
            keep.display()
        );
        eprintln!("files of the run kept in {}", keep.display());
    }
    if result.is_ok() {
        fx.cleanup().await;
    }
    result
}

fn instance_config(
    fx: &Fixture,
    node: &TestNode,
    cache: &std::path::Path,
) -> anyhow::Result<HostConfig> {
    let grants = node.dir.join("grants.yaml");
    hostpath_grants(&grants, &node.dir.join("data").join("hostpath"))?;
    let mut args = node.flags();
    args.push(format!("--cache-dir={}", cache.display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut config = fx.host_config(&args);
    config.grants = Some(grants);
    config.log_dir = node.dir.join("logs");
    Ok(config)
}

/// Waits until every instance but the leader is enrolled with the leader's term, as a
/// DaemonSet is long before claims come (without it the first claims of a node whose
/// instance is still enrolling wait for a retry, with a Warning Event each).
async fn wait_enrolled(hosts: &[Host], leader: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: Vec<usize> = (0..hosts.len())
            .filter(|&i| {
                i != leader && hosts[i].metric("wasm_provisioner_node_enrolled") != Some(1.0)
            })
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("instances {waiting:?} not enrolled with the leader after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_leader(hosts: &[Host]) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(i) = hosts
            .iter()
            .position(|h| h.metric("wasm_provisioner_leader") == Some(1.0))
        {
            return Ok(i);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("no host leads after 60 s")
}

/// N claims and N pods that use them, 64 requests in flight.
async fn create(fx: &Fixture, class: &str, n: usize) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let claim = format!("data-{i}");
                fx.claim(&claim, class, "1Mi", json!({})).await?;
                let pod = app_pod(fx, &format!("app-{i}"), &claim, None)?;
                pods.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .map(drop)
}

async fn wait_bound(fx: &Fixture, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    while Instant::now() < deadline {
        let bound = fx
            .claims()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c: &&PersistentVolumeClaim| {
                c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            })
            .count();
        if bound >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("not every claim Bound within 900 s")
}

async fn delete(fx: &Fixture, n: usize) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    // The application pods, not the instances' pods (deleting those would leave each
    // node without the instance its PVs' deletes go to).
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels(&format!("{}!={}", INSTANCE_LABEL.0, INSTANCE_LABEL.1)),
    )
    .await?;
    fx.claims()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let provisioner = fx.provisioner.clone();
    let deadline = Instant::now() + Duration::from_secs(900);
    while Instant::now() < deadline {
        let left = fx
            .volumes()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pv| {
                pv.annotations().get("pv.kubernetes.io/provisioned-by") == Some(&provisioner)
            })
            .count();
        if left == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("{n} volumes not all deleted within 900 s")
}

/// The leader's leader→instance call time: p50 and p99 (the upper bounds of their
/// histogram buckets) and the count, from `wasm_provisioner_node_call_duration_seconds`.
fn node_call_quantiles(leader: &Host) -> anyhow::Result<Option<(f64, f64, f64)>> {
    let samples = parse_samples(&leader.get("/metrics")?.1);
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| {
            s.name == "wasm_provisioner_node_call_duration_seconds_bucket"
                && s.labels.get("outcome").map(String::as_str) == Some("ok")
        })
        .filter_map(|s| Some((s.labels.get("le")?.parse::<f64>().ok()?, s.value)))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(_, count)) = buckets.last() else {
        return Ok(None);
    };
    if count == 0.0 {
        return Ok(None);
    }
    let quantile = |q: f64| {
        buckets
            .iter()
            .find(|(_, cumulative)| *cumulative >= q * count)
            .map(|(le, _)| *le)
            .unwrap_or(f64::INFINITY)
    };
    Ok(Some((quantile(0.5), quantile(0.99), count)))
}

fn table(figures: &[Figures]) -> String {
    let mut out = String::from(
        "| mode | nodes | claims | all Bound | claims/s | leader writes/volume | leader reads/volume | CSIStorageCapacity writes | 409s | leader→instance calls (p50 / p99, count) | RSS per instance (median / max) | other instances' requests | watches held (leader; each other instance) | watch bytes in the run (leader / other instance, most) | all deleted |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in figures {
        let n = f.claims as f64;
        let capacity = f.leader.writes_to("csistoragecapacities") + 0.0;
        let mut rss = f.rss_mib.clone();
        rss.sort_by(f64::total_cmp);
        let median = rss.get(rss.len() / 2).copied().unwrap_or(0.0);
        let max = rss.last().copied().unwrap_or(0.0);
        let calls = match f.node_calls {
            Some((p50, p99, count)) => {
                format!("≤ {} ms / ≤ {} ms, {count:.0}", p50 * 1e3, p99 * 1e3)
            }
            None => "-".into(),
        };
        let mut others: BTreeMap<String, f64> = BTreeMap::new();
        for ((verb, resource, _), value) in &f.others.0 {
            *others.entry(format!("{verb} {resource}")).or_default() += value;
        }
        let others = if others.is_empty() {
            "none".to_string()
        } else {
            others
                .iter()
                .map(|(kind, count)| format!("{count:.0} {kind}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let watches = |open: &BTreeMap<String, f64>| {
            if open.is_empty() {
                "none".to_string()
            } else {
                open.iter()
                    .map(|(resource, count)| format!("{count:.0} {resource}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let held = format!(
            "{}; {}",
            watches(&f.leader_watches),
            if f.mode != "deployment" {
                watches(&f.others_watches)
            } else {
                "-".to_string()
            }
        );
        let watch_bytes = format!(
            "{:.0} KiB / {:.1} KiB",
            f.leader_watch_bytes / 1024.0,
            f.others_watch_bytes_max / 1024.0
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} s | {:.1} | {:.2} | {:.2} | {capacity:.0} | {:.0} | {calls} | {median:.0} / {max:.0} MiB | {others} | {held} | {watch_bytes} | {:.1} s |",
            f.mode,
            f.nodes,
            f.claims,
            f.bound_s,
            n / f.bound_s,
            // `+ 0.0`: a difference of zeros may be -0, printed "-0".
            (f.leader.writes() - capacity) / n + 0.0,
            f.leader.reads() / n + 0.0,
            f.leader.conflicts() + 0.0,
            f.deleted_s,
        );
    }
    out
}
