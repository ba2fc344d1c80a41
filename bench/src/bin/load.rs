//! The load benchmark (`bash bench/load.sh --claims 500`, see docs/benchmarks.md, "Load
//! benchmark"): N claims created at once against a real control plane (the embedded local
//! one, or the cluster `KUBECONFIG` names), for each run: the time until all are Bound and
//! until all are deleted, claims/s, latencies, the provisioner's own API requests per
//! volume (its client's counter) and the API server's (`apiserver_request_total`, this
//! benchmark's own requests removed), the host's CPU and peak RSS, and the guest's share
//! of the claim-to-volume time.
//!
//! Runs: `ceiling` (no provisioner: the benchmark creates each claim's bound PV itself,
//! with the same concurrency, and deletes it), `defaults` (the host at its defaults),
//! `unthrottled` (client limits off), `unthrottled-no-finalizer` (the same with the
//! host's PV finalizer off, as the Go library ships), `go-defaults` (the host at the Go
//! library's limits: QPS 5, burst 10, 4 workers), `QPS/BURST/THREADS` (such as
//! `100/200/8`), and the Go library itself (sig-storage-lib-external-provisioner,
//! `bench/golib`) in `go-library` (client limits off), `go-library-finalizer` (the same
//! with its AddFinalizer on, as the host's PV finalizer) and `go-library-defaults` (its
//! defaults). Every host run uses the `hostpath` guest and the Go library's provisioner
//! is a hostpath one, so each volume is a real directory made and removed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use wasm_provisioner::cli::args::{DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS, DEFAULT_THREADS};
use wasm_provisioner_bench::cpu::{CpuSample, process_cpu_seconds};
use wasm_provisioner_bench::load::{self, GO_LIBRARY, GoLibrary, Provisioner, RunFigures};
use wasm_provisioner_tests::cluster::{admin_config, admin_kubeconfig};
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::host::{Host, HostConfig, proc_status_bytes};
use wasm_provisioner_tests::metrics::{self, Requests, parse_samples};

#[derive(Debug, Parser)]
#[command(about = "Provisioning load benchmark against a real control plane")]
struct Args {
    /// Claims created at once per run (the sizes docs/benchmarks.md reports: 100, 500, 2000, 5000).
    #[arg(long, default_value_t = 100)]
    claims: usize,

    /// Runs, in order: ceiling, defaults, unthrottled, unthrottled-no-finalizer,
    /// go-defaults, start, QPS/BURST/THREADS (the host), go-library,
    /// go-library-finalizer, go-library-defaults (the Go library).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ceiling,defaults,unthrottled"
    )]
    runs: Vec<String>,

    /// Makes the runs this many times over, interleaved, and adds a summary: each run's
    /// median claims/s and its share of the ceiling's median (one run of each is noisy
    /// on a small machine).
    #[arg(long, default_value_t = 1)]
    repeat: usize,

    /// Workers (`--threads`) of the unthrottled and go-library runs; default: the host's
    /// default.
    #[arg(long)]
    threads: Option<u16>,

    /// The Go library's provisioner binary (`bash bench/golib/build.sh` prints it;
    /// `bench/load.sh` sets it); default: built by that script when a go-library run is
    /// asked for.
    #[arg(long, env = "WASM_PROVISIONER_GO_LIBRARY")]
    go_library: Option<PathBuf>,

    /// Requests the benchmark has in flight at once (creates, deletes).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,

    /// Give up waiting for a phase (all Bound, all deleted) after this many seconds.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,

    /// Where the table, the per-request breakdown and the PNG go.
    #[arg(long, default_value = "load-results")]
    out: PathBuf,
}

/// One run to make.
#[derive(Clone, Debug, PartialEq)]
struct RunSpec {
    name: String,
    kind: Kind,
    settings: String,
}

/// Who provisions in a run.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    /// No provisioner: the ceiling.
    Ceiling,
    /// The host, with these flags.
    Host(Vec<String>),
    /// The Go library's provisioner (`bench/golib`), with these flags.
    GoLibrary(Vec<String>),
}

impl RunSpec {
    fn parse(text: &str, threads: Option<u16>) -> anyhow::Result<RunSpec> {
        let host = |flags: &[String], settings: String| RunSpec {
            name: text.to_string(),
            kind: Kind::Host(flags.to_vec()),
            settings,
        };
        let go_library = |flags: Vec<String>, settings: &str| RunSpec {
            name: text.to_string(),
            kind: Kind::GoLibrary(flags),
            settings: format!("Go library ({GO_LIBRARY}), {settings}"),
        };
        let limits = |qps: u32, burst: u32, threads: u16| {
            vec![
                format!("--kube-api-qps={qps}"),
                format!("--kube-api-burst={burst}"),
                format!("--threads={threads}"),
            ]
        };
        // The Go library's flags (bench/golib/main.go): a QPS of 0 or less is no limit.
        let limits_go = |qps: i32, burst: u32, threads: u16| {
            vec![
                format!("--kube-api-qps={qps}"),
                format!("--kube-api-burst={burst}"),
                format!("--threads={threads}"),
            ]
        };
        Ok(match text {
            "ceiling" => RunSpec {
                name: text.into(),
                kind: Kind::Ceiling,
                settings: "no provisioner".into(),
            },
            "defaults" => host(
                &[],
                format!(
                    "QPS {DEFAULT_KUBE_API_QPS}, burst {DEFAULT_KUBE_API_BURST}, {DEFAULT_THREADS} threads"
                ),
            ),
            "unthrottled" => {
                let threads = threads.unwrap_or(DEFAULT_THREADS);
                host(
                    &limits(100_000, 100_000, threads),
                    format!("no client limit, {threads} threads"),
                )
            }
            // The same with the host's PV finalizer off: its deletion makes the Go
            // library's one write (the PV delete), the like-for-like comparison with
            // `go-library` (a PV deleted by hand then loses its backend volume).
            "unthrottled-no-finalizer" => {
                let threads = threads.unwrap_or(DEFAULT_THREADS);
                let mut flags = limits(100_000, 100_000, threads);
                flags.push("--volume-protection-finalizer=false".into());
                host(
                    &flags,
                    format!("no client limit, {threads} threads, PV finalizer off"),
                )
            }
            // The host, not the library: the host at the library's limits.
            "go-defaults" => host(
                &limits(5, 10, 4),
                "host at the Go library's limits: QPS 5, burst 10, 4 threads".into(),
            ),
            // The Go library itself: QPS -1 turns client-go's limiter off.
            "go-library" => {
                let threads = threads.unwrap_or(DEFAULT_THREADS);
                go_library(
                    limits_go(-1, 0, threads),
                    &format!("unthrottled, {threads} threads"),
                )
            }
            // The same, with the library's AddFinalizer on: its PVs carry the PV
            // finalizer, as the host's do by default, so deleting one costs the same
            // two writes (the like-for-like comparison of CPU per volume).
            "go-library-finalizer" => {
                let threads = threads.unwrap_or(DEFAULT_THREADS);
                let mut flags = limits_go(-1, 0, threads);
                flags.push("--add-finalizer=true".into());
                go_library(
                    flags,
                    &format!("unthrottled, {threads} threads, AddFinalizer on"),
                )
            }
            "go-library-defaults" => go_library(
                limits_go(5, 10, 4),
                "its defaults: QPS 5, burst 10, 4 threads",
            ),
            // N claims Bound to PVs as this host publishes them exist before the host
            // starts (its defaults): its time to ready and its requests while starting.
            "start" => host(
                &[],
                format!(
                    "host started over N bound claims and PVs; QPS {DEFAULT_KUBE_API_QPS}, burst {DEFAULT_KUBE_API_BURST}, {DEFAULT_THREADS} threads"
                ),
            ),
            custom => {
                let parts: Vec<&str> = custom.split('/').collect();
                let [qps, burst, threads] = parts.as_slice() else {
                    bail!(
                        "unknown run {custom:?}: ceiling, defaults, unthrottled, unthrottled-no-finalizer, go-defaults, start, QPS/BURST/THREADS, go-library, go-library-finalizer or go-library-defaults"
                    );
                };
                let (qps, burst, threads) = (qps.parse()?, burst.parse()?, threads.parse()?);
                host(
                    &limits(qps, burst, threads),
                    format!("QPS {qps}, burst {burst}, {threads} threads"),
                )
            }
        })
    }
}

/// What the watches saw of one run's claims and volumes.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    /// Claims the controller-manager announced to their provisioner (its
    /// storage-provisioner annotation), by name.
    announced: HashMap<String, Instant>,
    /// Claims whose PV exists (first seen), by claim name.
    published: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
    claims_gone: HashMap<String, Instant>,
    /// PVs whose claimRef is in the run's namespace.
    volumes: HashSet<String>,
    volumes_gone: HashMap<String, Instant>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let specs: Vec<RunSpec> = args
        .runs
        .iter()
        .map(|r| RunSpec::parse(r, args.threads))
        .collect::<anyhow::Result<_>>()?;
    // The Go library's provisioner, built (or found) before the first run.
    let go_library = specs
        .iter()
        .any(|spec| matches!(spec.kind, Kind::GoLibrary(_)))
        .then(|| load::go_library_binary(args.go_library.as_deref()))
        .transpose()?;
    // Counts this benchmark's own requests, to take them out of the API server's count.
    let client =
        wasm_provisioner::client::rate_limited(admin_config().await?, 1_000_000, 1_000_000)?;
    let version = client.apiserver_version().await?.git_version;
    let machine = machine();
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    eprintln!(
        "load benchmark: {} claims per run, runs {:?}; cluster {version} (KUBECONFIG={}); {machine}",
        args.claims,
        args.runs,
        admin_kubeconfig().display()
    );

    let mut figures = Vec::new();
    let mut fixtures = Vec::new();
    let rounds = std::iter::repeat_n(&specs, args.repeat.max(1)).flatten();
    for spec in rounds {
        let mut fixture = Fixture::new(&format!("load-{}", spec.name)).await?;
        let result = run(&args, spec, go_library.as_deref(), &client, &mut fixture).await;
        fixtures.push(fixture);
        let run = result.with_context(|| format!("run {}", spec.name))?;
        eprintln!(
            "{}: all Bound in {:.2} s ({:.1} claims/s), all deleted in {:.2} s",
            run.run,
            run.all_bound_s,
            run.claims_per_s(),
            run.all_deleted_s
        );
        figures.push(run);
    }
    // Namespaces go last: their deletion would count in a later run's API figures.
    for fixture in fixtures {
        fixture.cleanup().await;
    }

    let mut report = format!(
        "Load benchmark, {date}: {} claims per run; {machine}; Kubernetes {version} (embedded control plane unless KUBECONFIG was set)\n\n",
        args.claims
    );
    report.push_str(&load::table(&figures));
    if figures.iter().any(|run| run.start.is_some()) {
        report.push('\n');
        report.push_str(&load::start_table(&figures));
    }
    if args.repeat > 1 {
        report.push('\n');
        report.push_str(&load::summary_table(&figures));
    }
    report.push('\n');
    report.push_str(&load::stages_table(&figures));
    if figures.iter().any(|run| run.cpu_provisioning.is_some()) {
        report.push('\n');
        report.push_str(&load::cpu_table(&figures));
    }
    for run in &figures {
        report.push('\n');
        report.push_str(&load::breakdown(run));
    }
    println!("{report}");
    std::fs::create_dir_all(&args.out)?;
    let stem = args.out.join(format!("load-{}", args.claims));
    std::fs::write(stem.with_extension("md"), &report)?;
    let png = stem.with_extension("png");
    load::plot(
        &png,
        &format!(
            "{} claims created at once: claims Bound over time ({date})",
            args.claims
        ),
        &figures,
    )?;
    eprintln!(
        "wrote {} and {}",
        stem.with_extension("md").display(),
        png.display()
    );
    for run in &figures {
        if run.bound < run.claims || run.deleted < run.claims {
            bail!(
                "run {}: {} of {} claims Bound, {} deleted",
                run.run,
                run.bound,
                run.claims,
                run.deleted
            );
        }
    }
    Ok(())
}

async fn run(
    args: &Args,
    spec: &RunSpec,
    go_library: Option<&Path>,
    client: &Client,
    fixture: &mut Fixture,
) -> anyhow::Result<RunFigures> {
    let namespace = fixture.ctx.namespace.clone();
    let parameters = [("nodePath", "/srv/load")];
    // The ceiling's class names this fixture's provisioner too, which no host serves:
    // the controller-manager treats its claims as it treats the provisioned ones. The Go
    // library serves the same class (it reads no parameter) under the same name.
    let class = fixture.class("hostpath", &parameters, json!({})).await?;
    let host_flags = match &spec.kind {
        Kind::Host(flags) => Some(flags),
        _ => None,
    };
    let host_config = host_flags.map(|flags| {
        fixture.install_module("hostpath", "hostpath");
        let mut host_args: Vec<String> = vec!["--leader-elect=false".into(), "--log=info".into()];
        host_args.extend(flags.iter().cloned());
        HostConfig {
            kubeconfig: admin_kubeconfig(),
            provisioner_name: fixture.provisioner.clone(),
            modules: fixture.modules.clone(),
            grants: Some(fixture.grants.clone()),
            log_dir: fixture.root.join("logs"),
            args: host_args,
        }
    });
    // The start run creates the bound claims and PVs first, then starts the host.
    let starting = spec.name == "start";
    // The provisioner: the host, or the Go library's (its volumes under the fixture's
    // data directory, its log beside the host's).
    let mut host: Option<Box<dyn Provisioner>> = match (&spec.kind, &host_config) {
        (_, Some(config)) if !starting => Some(Box::new(Host::start(config)?)),
        (Kind::GoLibrary(flags), _) => Some(Box::new(GoLibrary::start(
            go_library.context("no Go library binary")?,
            &admin_kubeconfig(),
            &fixture.provisioner,
            &fixture.data.join("go-library"),
            &fixture.root.join("logs"),
            flags,
        )?)),
        _ => None,
    };
    eprintln!(
        "run {} ({}): namespace {namespace}",
        spec.name, spec.settings
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    let watches = watch(client, &namespace, seen.clone()).await?;

    let mut host_before = host.as_deref().map(metrics::host_requests).transpose()?;
    let mut cpu_before = host.as_deref().and_then(|h| process_cpu_seconds(h.pid()));
    let server_before = apiserver_requests(client).await?;
    let own_before = own_requests();

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let ceiling = spec.kind == Kind::Ceiling;
    // Bound PVs made by the benchmark: the ceiling's, and the start run's (published as
    // the host would have).
    let published_by = starting.then(|| fixture.provisioner.clone());
    let names: Vec<String> = (0..args.claims).map(|i| format!("load-{i:05}")).collect();

    // Create every claim (and, for the ceiling, its bound PV) at once.
    let cpu_process = |host: &Option<Box<dyn Provisioner>>| {
        host.as_deref().map(|host| (host.cpu_name(), host.pid()))
    };
    let cpu_started = CpuSample::take(cpu_process(&host));
    let started = Instant::now();
    let progress = progress(&spec.name, args.claims, seen.clone(), started);
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let (claims, volumes, seen, class, published_by) = (
                claims.clone(),
                volumes.clone(),
                seen.clone(),
                class.clone(),
                published_by.clone(),
            );
            async move {
                seen.lock()
                    .unwrap()
                    .created
                    .insert(name.clone(), Instant::now());
                let claim = claims
                    .create(
                        &PostParams::default(),
                        &claim(&name, &class, published_by.as_deref())?,
                    )
                    .await?;
                if ceiling || published_by.is_some() {
                    let volume = bound_volume(&claim, &class, published_by.as_deref())?;
                    volumes.create(&PostParams::default(), &volume).await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    let timeout = Duration::from_secs(args.timeout);
    wait(&format!("{}: all claims Bound", spec.name), timeout, || {
        seen.lock().unwrap().bound.len() >= args.claims
    })
    .await;
    let cpu_provisioning = CpuSample::take(cpu_process(&host)).since(&cpu_started);
    // The start run: the host starts now, over N bound claims and PVs.
    let mut start = None;
    if starting && let Some(config) = &host_config {
        let spawned = Instant::now();
        let started_host = Host::start(config)?;
        let ready_s = spawned.elapsed().as_secs_f64();
        let requests = metrics::settled_requests(&started_host, Duration::from_secs(1)).await?;
        start = Some(load::StartFigures {
            ready_s,
            requests: requests.clone(),
            rss_bytes: started_host.rss_bytes(),
        });
        eprintln!(
            "start: ready in {ready_s:.2} s over {} bound claims and PVs",
            args.claims
        );
        host_before = Some(requests);
        cpu_before = process_cpu_seconds(started_host.pid());
        host = Some(Box::new(started_host));
    }
    // The provisioner's requests while provisioning: a claim is Bound as soon as its PV
    // exists, a moment before the provisioner's last edit of it, so wait until its
    // count stops moving.
    let own_provisioning = match (&host, &host_before) {
        (Some(host), Some(before)) => metrics::settled_requests(&**host, Duration::from_secs(1))
            .await?
            .since(before),
        _ => own_requests().since(&own_before),
    };

    // Delete them all at once (the ceiling deletes its PVs itself).
    let delete_started = Instant::now();
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let (claims, volumes, namespace) = (claims.clone(), volumes.clone(), namespace.clone());
            async move {
                claims.delete(&name, &DeleteParams::default()).await?;
                if ceiling {
                    let volume = ceiling_volume_name(&namespace, &name);
                    volumes.delete(&volume, &DeleteParams::default()).await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    wait(
        &format!("{}: all claims and PVs deleted", spec.name),
        timeout,
        || {
            let seen = seen.lock().unwrap();
            seen.claims_gone.len() >= args.claims && seen.volumes_gone.len() >= seen.volumes.len()
        },
    )
    .await;
    progress.abort();
    watches.abort();

    let server = apiserver_requests(client)
        .await?
        .since(&server_before)
        .minus(&own_requests().since(&own_before));
    let mut figures = RunFigures {
        run: spec.name.clone(),
        settings: spec.settings.clone(),
        claims: args.claims,
        server,
        own_provisioning,
        start,
        cpu_provisioning: Some(cpu_provisioning),
        ..Default::default()
    };
    {
        let seen = seen.lock().unwrap();
        let since_started = |times: &HashMap<String, Instant>| {
            let mut at: Vec<f64> = times
                .values()
                .map(|t| t.saturating_duration_since(started).as_secs_f64())
                .collect();
            at.sort_by(f64::total_cmp);
            at
        };
        let bound_at = since_started(&seen.bound);
        figures.announced_at = since_started(&seen.announced);
        figures.published_at = since_started(&seen.published);
        figures.bound = bound_at.len();
        figures.all_bound_s = bound_at.last().copied().unwrap_or_default();
        figures.bound_at = bound_at;
        figures.latencies = seen
            .bound
            .iter()
            .filter_map(|(name, bound)| {
                Some(bound.duration_since(*seen.created.get(name)?).as_secs_f64())
            })
            .collect();
        // a volume is deleted when both its claim and its PV are gone
        figures.deleted = seen.claims_gone.len().min(seen.volumes_gone.len());
        figures.all_deleted_s = seen
            .claims_gone
            .values()
            .chain(seen.volumes_gone.values())
            .map(|t| t.saturating_duration_since(delete_started).as_secs_f64())
            .fold(0.0, f64::max);
    }
    if let Some(mut host) = host {
        let samples = parse_samples(&host.get("/metrics")?.1);
        figures.own = Requests::from_client(&samples).since(&host_before.unwrap_or_default());
        figures.cpu_s = process_cpu_seconds(host.pid())
            .zip(cpu_before)
            .map(|(after, before)| after - before);
        figures.peak_rss_bytes = proc_status_bytes(host.pid(), "VmHWM");
        let guest = load::histogram_sum(
            &samples,
            "wasm_provisioner_guest_call_duration_seconds",
            |labels| {
                matches!(
                    labels.get("call").map(String::as_str),
                    Some("provision" | "should-provision")
                )
            },
        );
        let end_to_end =
            load::histogram_sum(&samples, "wasm_provisioner_claim_to_volume_seconds", |_| {
                true
            });
        // none for the Go library, which has no guest: "-"
        figures.guest_share = (end_to_end > 0.0).then(|| guest / end_to_end);
        let status = host.terminate(Duration::from_secs(30))?;
        if !status.success() {
            eprintln!("{}: the provisioner exited with {status}", spec.name);
        }
    } else {
        // The ceiling's "provisioner" is this benchmark's PV requests: 1 create and 1
        // delete per volume.
        let volumes_only = |mut requests: Requests| {
            requests
                .0
                .retain(|(_, resource, _), _| resource == "persistentvolumes");
            requests
        };
        figures.own = volumes_only(own_requests().since(&own_before));
        figures.own_provisioning = volumes_only(std::mem::take(&mut figures.own_provisioning));
    }
    Ok(figures)
}

/// The name of the ceiling's PV for claim `name`.
fn ceiling_volume_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// A claim of `class`; for the start run, already announced to the provisioner, as
/// the binder does.
fn claim(
    name: &str,
    class: &str,
    provisioner: Option<&str>,
) -> anyhow::Result<PersistentVolumeClaim> {
    let annotations = match provisioner {
        Some(provisioner) => json!({ "volume.kubernetes.io/storage-provisioner": provisioner }),
        None => json!({}),
    };
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))?)
}

/// The ceiling's PV: bound to `claim` by claimRef (uid included), as a provisioner would
/// create it; Retain, since no provisioner deletes it (the benchmark does). For the start
/// run (`published_by`), the PV as the host publishes it: its name, annotations,
/// finalizer and policy Delete, so the host deletes it when its claim goes.
fn bound_volume(
    claim: &PersistentVolumeClaim,
    class: &str,
    published_by: Option<&str>,
) -> anyhow::Result<PersistentVolume> {
    let name = claim.name_any();
    let (metadata, policy, path) = match published_by {
        Some(provisioner) => {
            let volume = format!("pvc-{}", claim.uid().unwrap_or_default());
            (
                json!({
                    "name": volume,
                    "annotations": {
                        "pv.kubernetes.io/provisioned-by": provisioner,
                        "wasm-provisioner.dev/module": "hostpath",
                    },
                    "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
                }),
                "Delete",
                format!("/srv/load/{volume}"),
            )
        }
        None => (
            json!({ "name": ceiling_volume_name(&claim.namespace().unwrap_or_default(), &name) }),
            "Retain",
            format!("/srv/load/{name}"),
        ),
    };
    Ok(serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": { "storage": "1Gi" },
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": policy,
            "hostPath": { "path": path },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim.namespace(),
                "name": name,
                "uid": claim.uid(),
            },
        },
    }))?)
}

/// Watches the run's claims and the PVs bound to them, recording when each claim is
/// Bound and when each claim and PV is gone. Returns once both watches listed.
async fn watch(
    client: &Client,
    namespace: &str,
    seen: Arc<Mutex<Seen>>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(2);
    let namespace = namespace.to_string();
    let claims_seen = seen.clone();
    let claims_ready = ready_tx.clone();
    let claim_watch = async move {
        let mut stream = watcher(claims, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            match event {
                Ok(watcher::Event::InitDone) => {
                    let _ = claims_ready.send(()).await;
                }
                Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
                    if claim
                        .annotations()
                        .contains_key("volume.kubernetes.io/storage-provisioner")
                    {
                        claims_seen
                            .lock()
                            .unwrap()
                            .announced
                            .entry(claim.name_any())
                            .or_insert(now);
                    }
                    if phase == Some("Bound") {
                        claims_seen
                            .lock()
                            .unwrap()
                            .bound
                            .entry(claim.name_any())
                            .or_insert(now);
                    }
                }
                Ok(watcher::Event::Delete(claim)) => {
                    claims_seen
                        .lock()
                        .unwrap()
                        .claims_gone
                        .entry(claim.name_any())
                        .or_insert(now);
                }
                Ok(watcher::Event::Init) => {}
                Err(error) => eprintln!("claim watch: {error}"),
            }
        }
    };
    let volume_watch = async move {
        let mut stream = watcher(volumes, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let ours = |volume: &PersistentVolume| {
                volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|r| r.namespace.as_deref())
                    == Some(namespace.as_str())
            };
            match event {
                Ok(watcher::Event::InitDone) => {
                    let _ = ready_tx.send(()).await;
                }
                Ok(watcher::Event::Apply(volume) | watcher::Event::InitApply(volume)) => {
                    if ours(&volume) {
                        let mut seen = seen.lock().unwrap();
                        seen.volumes.insert(volume.name_any());
                        let claim = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                        if let Some(claim) = claim.and_then(|c| c.name.clone()) {
                            seen.published.entry(claim).or_insert(now);
                        }
                    }
                }
                Ok(watcher::Event::Delete(volume)) => {
                    if ours(&volume) {
                        let mut seen = seen.lock().unwrap();
                        seen.volumes.insert(volume.name_any());
                        seen.volumes_gone.entry(volume.name_any()).or_insert(now);
                    }
                }
                Ok(watcher::Event::Init) => {}
                Err(error) => eprintln!("volume watch: {error}"),
            }
        }
    };
    let handle = tokio::spawn(async move {
        tokio::join!(claim_watch, volume_watch);
    });
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(60), ready_rx.recv())
            .await
            .context("the watches did not list within 60 s")?;
    }
    Ok(handle)
}

/// Prints the progress every 5 s until aborted.
fn progress(
    run: &str,
    claims: usize,
    seen: Arc<Mutex<Seen>>,
    started: Instant,
) -> tokio::task::JoinHandle<()> {
    let run = run.to_string();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let seen = seen.lock().unwrap();
            eprintln!(
                "  {run} {:>6.1} s: created {}/{claims}, Bound {}/{claims}, claims deleted {}/{claims}, PVs deleted {}/{}",
                started.elapsed().as_secs_f64(),
                seen.created.len(),
                seen.bound.len(),
                seen.claims_gone.len(),
                seen.volumes_gone.len(),
                seen.volumes.len(),
            );
        }
    })
}

/// Waits until `done`, or `timeout` (then says so and goes on: the figures show it).
async fn wait(what: &str, timeout: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            eprintln!("{what}: gave up after {timeout:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The API server's own request counter.
async fn apiserver_requests(client: &Client) -> anyhow::Result<Requests> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("scraping the API server's /metrics")?;
    Ok(Requests::from_apiserver(&parse_samples(&text)))
}

/// This process's own requests so far.
fn own_requests() -> Requests {
    let text = wasm_provisioner::metrics::Metrics::new().render();
    Requests::from_client(&parse_samples(&text))
}

/// The machine's size, for the report's first line.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kib| kib / (1024.0 * 1024.0))
        .unwrap_or_default();
    format!("machine: {cores} cores, {memory_gib:.0} GiB")
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(kind: &Kind) -> &[String] {
        match kind {
            Kind::Host(flags) | Kind::GoLibrary(flags) => flags,
            Kind::Ceiling => &[],
        }
    }

    #[test]
    fn the_go_library_runs_are_the_library_and_say_so() {
        let run = RunSpec::parse("go-library", Some(16)).unwrap();
        assert!(matches!(run.kind, Kind::GoLibrary(_)));
        assert_eq!(
            flags(&run.kind),
            ["--kube-api-qps=-1", "--kube-api-burst=0", "--threads=16"]
        );
        assert_eq!(
            run.settings,
            "Go library (sig-storage-lib-external-provisioner v13.1.0), unthrottled, 16 threads"
        );
        let run = RunSpec::parse("go-library", None).unwrap();
        assert!(
            run.settings
                .ends_with(&format!("{DEFAULT_THREADS} threads"))
        );

        let run = RunSpec::parse("go-library-finalizer", Some(16)).unwrap();
        assert_eq!(
            flags(&run.kind),
            [
                "--kube-api-qps=-1",
                "--kube-api-burst=0",
                "--threads=16",
                "--add-finalizer=true"
            ]
        );
        assert!(
            run.settings.ends_with("AddFinalizer on"),
            "{}",
            run.settings
        );

        let run = RunSpec::parse("unthrottled-no-finalizer", Some(16)).unwrap();
        assert_eq!(
            flags(&run.kind),
            [
                "--kube-api-qps=100000",
                "--kube-api-burst=100000",
                "--threads=16",
                "--volume-protection-finalizer=false"
            ]
        );
        assert!(matches!(run.kind, Kind::Host(_)));

        let run = RunSpec::parse("go-library-defaults", Some(16)).unwrap();
        assert_eq!(
            flags(&run.kind),
            ["--kube-api-qps=5", "--kube-api-burst=10", "--threads=4"],
            "the library's defaults, whatever --threads says"
        );
        assert!(run.settings.starts_with("Go library ("), "{}", run.settings);
    }

    #[test]
    fn go_defaults_is_still_the_host_at_the_librarys_limits() {
        let run = RunSpec::parse("go-defaults", None).unwrap();
        assert!(matches!(run.kind, Kind::Host(_)));
        assert_eq!(
            flags(&run.kind),
            ["--kube-api-qps=5", "--kube-api-burst=10", "--threads=4"]
        );
        assert!(run.settings.starts_with("host "), "{}", run.settings);
    }

    #[test]
    fn other_runs_parse_as_before() {
        assert_eq!(RunSpec::parse("ceiling", None).unwrap().kind, Kind::Ceiling);
        let run = RunSpec::parse("100/200/8", None).unwrap();
        assert_eq!(
            run.kind,
            Kind::Host(vec![
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
                "--threads=8".into()
            ])
        );
        assert!(matches!(
            RunSpec::parse("start", None).unwrap().kind,
            Kind::Host(_)
        ));
        let error = RunSpec::parse("go-lib", None).unwrap_err().to_string();
        assert!(error.contains("go-library"), "{error}");
    }
}
