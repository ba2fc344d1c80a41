//! The load benchmark's arithmetic and output (`bench/src/bin/load.rs` runs it):
//! percentiles, the figures table and the bound-claims-over-time plot; and the Go
//! library's provisioner (`bench/golib`) as a child process, measured as the host is.
//! The Prometheus text format and the request counts by verb and resource are the
//! tests' too (`wasm_provisioner_tests::metrics`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use wasm_provisioner_tests::host::{Host, free_port, http_get};
use wasm_provisioner_tests::metrics::{Kind, MetricsEndpoint, Requests, Sample};

/// The `q` quantile (0..=1) of `values` (nearest rank), or 0 when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The sum of a histogram's `_sum` samples whose labels pass `keep`.
pub fn histogram_sum(
    samples: &[Sample],
    histogram: &str,
    keep: impl Fn(&BTreeMap<String, String>) -> bool,
) -> f64 {
    let name = format!("{histogram}_sum");
    samples
        .iter()
        .filter(|s| s.name == name && keep(&s.labels))
        .map(|s| s.value)
        .sum()
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct RunFigures {
    pub run: String,
    /// Client limits and workers, as given to the host ("-" for the ceiling).
    pub settings: String,
    pub claims: usize,
    pub bound: usize,
    /// Seconds from the first create to the last claim Bound.
    pub all_bound_s: f64,
    /// Each claim's create-to-Bound seconds.
    pub latencies: Vec<f64>,
    /// Seconds from the first delete to the last claim and PV gone.
    pub all_deleted_s: f64,
    pub deleted: usize,
    /// The provisioner's own requests (its client's count), the run only.
    pub own: Requests,
    /// The part of `own` made while provisioning: from the first create until every
    /// claim is Bound and the provisioner's requests settled (the rest is deletion's).
    pub own_provisioning: Requests,
    /// The API server's count of the run, this benchmark's own requests removed: the
    /// provisioner's, the controller-manager's.
    pub server: Requests,
    pub cpu_s: Option<f64>,
    /// Where the CPU went from the first create until every claim was Bound.
    pub cpu_provisioning: Option<crate::cpu::CpuUse>,
    pub peak_rss_bytes: Option<u64>,
    /// Guest seconds (should-provision + provision) / claim-to-volume seconds.
    pub guest_share: Option<f64>,
    /// Bound claims over time: seconds since the first create, sorted (drawn; the PVs
    /// dashed).
    pub bound_at: Vec<f64>,
    /// The stages before Bound, the same way: claims announced to their provisioner by
    /// the controller-manager (its storage-provisioner annotation; none in the ceiling,
    /// whose PVs are there first), and claims whose PV exists.
    pub announced_at: Vec<f64>,
    pub published_at: Vec<f64>,
    /// The start run: the host started over N bound claims and PVs.
    pub start: Option<StartFigures>,
}

/// A host started over N bound claims and PVs of its own.
#[derive(Clone, Debug, Default)]
pub struct StartFigures {
    /// Seconds from the process start until `/readyz` said ready (caches synced).
    pub ready_s: f64,
    /// Its requests from the start until they settled (lists only, if it reads nothing
    /// the caches hold).
    pub requests: Requests,
    /// Resident memory once settled.
    pub rss_bytes: Option<u64>,
}

/// The start runs' table.
pub fn start_table(runs: &[RunFigures]) -> String {
    let mut out = String::from(
        "| run | claims and PVs | ready in | requests while starting (by verb and resource) | RSS after start |\n\
         |---|---|---|---|---|\n",
    );
    for run in runs {
        let Some(start) = &run.start else { continue };
        let mut requests: Vec<String> = start
            .requests
            .by_kind()
            .iter()
            .map(|((verb, resource), (count, _))| format!("{count:.0} {verb} {resource}"))
            .collect();
        if requests.is_empty() {
            requests.push("none".into());
        }
        let rss = |bytes: u64| format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0));
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s | {} | {} |",
            run.run,
            run.claims,
            start.ready_s,
            requests.join(", "),
            start.rss_bytes.map(rss).unwrap_or_else(|| "-".into()),
        );
    }
    out
}

impl RunFigures {
    /// "writes / reads / 409s" per volume.
    pub fn requests_per_volume(&self, requests: &Requests) -> String {
        format!(
            "{:.1} / {:.1} / {:.2}",
            self.per_volume(requests.writes()),
            self.per_volume(requests.reads()),
            self.per_volume(requests.conflicts())
        )
    }

    /// Whether other work took more than [`DISTURBED_SHARE`] of the machine while this
    /// run provisioned (its claims/s then says more about the machine than the run).
    pub fn disturbed(&self) -> bool {
        self.cpu_provisioning
            .as_ref()
            .and_then(crate::cpu::CpuUse::outside_share)
            .is_some_and(|share| share > DISTURBED_SHARE)
    }

    pub fn claims_per_s(&self) -> f64 {
        rate(self.bound, self.all_bound_s)
    }

    pub fn deletes_per_s(&self) -> f64 {
        rate(self.deleted, self.all_deleted_s)
    }

    fn per_volume(&self, value: f64) -> f64 {
        // + 0.0: an empty sum is -0.0
        value / self.claims.max(1) as f64 + 0.0
    }
}

fn rate(count: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The kinds of run (`ceiling`, `unthrottled`, ...) in order of first appearance.
fn kinds(runs: &[RunFigures]) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for run in runs {
        if !kinds.contains(&run.run.as_str()) {
            kinds.push(&run.run);
        }
    }
    kinds
}

/// Repeated runs: each run's claims/s, their median, and its share of the ceiling's
/// median (the first run named `ceiling`).
pub fn summary_table(runs: &[RunFigures]) -> String {
    let names = kinds(runs);
    let ceiling_rates: Vec<f64> = runs
        .iter()
        .filter(|run| run.run == "ceiling")
        .map(RunFigures::claims_per_s)
        .collect();
    let ceiling = quantile(&ceiling_rates, 0.5);
    let mut out = String::from(
        "Summary of the repeated runs: claims/s\n\
         | run | each | median | of the ceiling's median |\n\
         |---|---|---|---|\n",
    );
    let mut disturbed_any = false;
    for name in names {
        let each: Vec<&RunFigures> = runs.iter().filter(|run| run.run == name).collect();
        let rates: Vec<f64> = each.iter().map(|run| run.claims_per_s()).collect();
        let median = quantile(&rates, 0.5);
        let share = if ceiling > 0.0 {
            format!("{:.0}%", median / ceiling * 100.0)
        } else {
            "-".into()
        };
        let marked: Vec<String> = each
            .iter()
            .zip(&rates)
            .map(|(run, rate)| {
                let disturbed = run.disturbed();
                disturbed_any |= disturbed;
                format!("{rate:.1}{}", if disturbed { "*" } else { "" })
            })
            .collect();
        let _ = writeln!(
            out,
            "| {name} | {} | {median:.1} | {share} |",
            marked.join(", ")
        );
    }
    if disturbed_any {
        let _ = writeln!(
            out,
            "\n\\* disturbed: while it provisioned, more than {:.0}% of the machine went to \
             neither the control plane, the provisioner nor the benchmark (`rest` and `stolen` \
             in the CPU table: another process, or the hypervisor's other guests)",
            DISTURBED_SHARE * 100.0
        );
    }
    out
}

/// The share of the machine's cores going to other work (another process, the
/// hypervisor's other guests) above which a run's figures are marked as disturbed.
pub const DISTURBED_SHARE: f64 = 0.05;

/// When each stage reached 1%, half and all of the claims, seconds since the first
/// create: the controller-manager's announcement, the PV, Bound. Shows which side of the
/// provisioner a storm waits on.
pub fn stages_table(runs: &[RunFigures]) -> String {
    let mut out = String::from(
        "Stages, seconds since the first create when 1% / half / all of the claims got there\n\
         | run | N | announced to the provisioner | PV exists | Bound |\n\
         |---|---|---|---|---|\n",
    );
    for run in runs {
        let stage = |at: &[f64]| {
            if at.is_empty() {
                return "-".to_string();
            }
            let when = |share: f64| {
                let rank = (share * run.claims as f64).ceil().max(1.0) as usize;
                at.get(rank - 1)
                    .map_or_else(|| "-".to_string(), |t| format!("{t:.2}"))
            };
            format!("{} / {} / {}", when(0.01), when(0.5), when(1.0))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            run.run,
            run.claims,
            stage(&run.announced_at),
            stage(&run.published_at),
            stage(&run.bound_at)
        );
    }
    out
}

/// Where the CPU went while provisioning (from the first create until every claim was
/// Bound), one row per run that measured it.
pub fn cpu_table(runs: &[RunFigures]) -> String {
    let mut out = String::from(
        "CPU while provisioning (first create to all Bound), ms per volume\n\
         | run | N | machine busy | etcd | kube-apiserver | kube-controller-manager | host | Go library | benchmark | rest | stolen | all |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for run in runs {
        let Some(cpu) = &run.cpu_provisioning else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            run.run,
            run.claims,
            cpu.cells(run.claims).join(" | ")
        );
    }
    out
}

/// The figures as a Markdown table, one row per run.
pub fn table(runs: &[RunFigures]) -> String {
    let mut out = String::from(
        "| run | settings | N | all Bound in | claims/s | latency p50 / p99 | all deleted in | deletes/s | own writes / reads / 409s per volume: provisioning; deletion | API server requests per volume (all but the benchmark) | CPU ms per volume | peak RSS | guest share |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for run in runs {
        let bound = if run.bound == run.claims {
            format!("{:.2} s", run.all_bound_s)
        } else {
            format!("{}/{} in {:.1} s", run.bound, run.claims, run.all_bound_s)
        };
        let deletion = run.own.minus(&run.own_provisioning);
        let own = format!(
            "{}; {}",
            run.requests_per_volume(&run.own_provisioning),
            run.requests_per_volume(&deletion)
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {:.2} / {:.2} s | {:.2} s | {:.1} | {} | {:.1} | {} | {} | {} |",
            run.run,
            run.settings,
            run.claims,
            bound,
            run.claims_per_s(),
            quantile(&run.latencies, 0.5),
            quantile(&run.latencies, 0.99),
            run.all_deleted_s,
            run.deletes_per_s(),
            own,
            run.per_volume(run.server.total()),
            run.cpu_s
                .map(|s| format!("{:.1}", run.per_volume(s * 1000.0)))
                .unwrap_or_else(|| "-".into()),
            run.peak_rss_bytes
                .map(|b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
                .unwrap_or_else(|| "-".into()),
            run.guest_share
                .map(|s| format!("{:.2}%", s * 100.0))
                .unwrap_or_else(|| "-".into()),
        );
    }
    out
}

/// Requests per volume by verb and resource: the provisioner's own, and the API
/// server's count without the benchmark's requests.
pub fn breakdown(run: &RunFigures) -> String {
    let own = run.own.by_kind();
    let server = run.server.by_kind();
    let mut kinds: Vec<&Kind> = own.keys().chain(server.keys()).collect();
    kinds.sort();
    kinds.dedup();
    let mut out = format!(
        "{} ({}): requests per volume, watches not counted\n\
         | verb | resource | provisioner (409s) | API server, all but the benchmark (409s) |\n\
         |---|---|---|---|\n",
        run.run, run.settings
    );
    for kind in kinds {
        let cell = |map: &BTreeMap<Kind, (f64, f64)>| match map.get(kind) {
            Some((n, conflicts)) => format!(
                "{:.2} ({:.2})",
                run.per_volume(*n),
                run.per_volume(*conflicts)
            ),
            None => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            kind.0,
            kind.1,
            cell(&own),
            cell(&server)
        );
    }
    out
}

/// Fonts tried for the plot's text, in order (DejaVu ships with most Linux systems).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers the first font found for plotters' "sans-serif"; false if none (the plot
/// is then drawn without text).
fn register_font() -> bool {
    use std::sync::OnceLock;
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(
                    "sans-serif",
                    plotters::style::FontStyle::Normal,
                    bytes,
                )
                .is_ok()
                {
                    return true;
                }
            }
        }
        false
    })
}

/// Draws bound claims over time, one line per run (a colour and a legend entry per kind
/// of run), into the PNG `path`.
pub fn plot(path: &Path, title: &str, runs: &[RunFigures]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let text = register_font();
    let x_max = runs
        .iter()
        .flat_map(|r| r.bound_at.last().copied())
        .fold(1.0_f64, f64::max)
        * 1.05;
    let y_max = runs.iter().map(|r| r.claims).max().unwrap_or(1).max(1) as f64 * 1.05;
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(title, ("sans-serif", 22))
            .x_label_area_size(45)
            .y_label_area_size(65);
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("seconds since the claims were created")
            .y_desc("claims Bound (dashed: their PVs exist)")
            .label_style(("sans-serif", 15));
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    let colors = [&BLUE, &RED, &GREEN, &MAGENTA, &CYAN, &BLACK];
    // (seconds, how many so far) from sorted times, starting at the origin.
    let cumulative = |at: &[f64]| -> Vec<(f64, f64)> {
        std::iter::once((0.0, 0.0))
            .chain(at.iter().enumerate().map(|(i, t)| (*t, (i + 1) as f64)))
            .collect()
    };
    // One colour per kind of run (its repetitions share it), in order of appearance.
    let kinds = kinds(runs);
    for (index, run) in runs.iter().enumerate() {
        let kind = kinds.iter().position(|k| *k == run.run).unwrap_or(0);
        let color = colors[kind % colors.len()];
        let points = cumulative(&run.bound_at);
        // The PVs as they appear, thin, under the run's Bound line.
        chart.draw_series(DashedLineSeries::new(
            cumulative(&run.published_at),
            6,
            4,
            color.stroke_width(1),
        ))?;
        let series = chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
        // One legend entry per kind, at its first run.
        let first = runs[..index].iter().all(|r| r.run != run.run);
        if text && first {
            let repeats = runs.iter().filter(|r| r.run == run.run).count();
            let label = if repeats > 1 {
                format!("{} ({}), {repeats} runs", run.run, run.settings)
            } else {
                format!("{} ({})", run.run, run.settings)
            };
            series
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// A provisioner process the benchmark measures: the host or the Go library's. Its
/// metrics endpoint ([`MetricsEndpoint::get`]) serves its request count.
pub trait Provisioner: MetricsEndpoint {
    /// Its process id (CPU time and memory from `/proc`).
    fn pid(&self) -> u32;
    /// Its name in the CPU table ([`crate::cpu::PROVISIONERS`]).
    fn cpu_name(&self) -> &'static str;
    /// SIGTERM, then wait up to `timeout` for the exit status.
    fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus>;
}

impl Provisioner for Host {
    fn pid(&self) -> u32 {
        Host::pid(self)
    }

    fn cpu_name(&self) -> &'static str {
        crate::cpu::HOST
    }

    fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        Host::terminate(self, timeout)
    }
}

/// The Go library the `go-library` runs measure, as `bench/golib/go.mod` requires it.
pub const GO_LIBRARY: &str = "sig-storage-lib-external-provisioner v13.1.0";

/// The Go library's provisioner binary: `explicit` (`--go-library`, or
/// `WASM_PROVISIONER_GO_LIBRARY` as `bench/load.sh` sets it), else built (or found in
/// its cache) by `bench/golib/build.sh`.
pub fn go_library_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(path.is_file(), "no Go library binary at {}", path.display());
        return Ok(path.to_path_buf());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("golib/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout.lines().last().unwrap_or_default().trim();
    Ok(PathBuf::from(path))
}

/// The Go library's hostpath provisioner (`bench/golib`) running: its flags are those of
/// `main.go`. Killed (SIGKILL) when dropped, unless it already exited.
pub struct GoLibrary {
    child: Child,
    metrics_port: u16,
    log: PathBuf,
}

impl GoLibrary {
    /// Starts `binary` for `provisioner` (the StorageClass's provisioner name), making
    /// volumes under `dir`, with `args` (client limits, threads), its log in `log_dir`;
    /// waits until its `/readyz` answers 200 (its informers' caches synced).
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        provisioner: &str,
        dir: &Path,
        log_dir: &Path,
        args: &[String],
    ) -> anyhow::Result<GoLibrary> {
        let metrics_port = free_port();
        std::fs::create_dir_all(dir)?;
        std::fs::create_dir_all(log_dir)?;
        let log = log_dir.join(format!("go-library-{metrics_port}.log"));
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--provisioner={provisioner}"))
            .arg(format!("--dir={}", dir.display()))
            .arg(format!("--metrics-address=127.0.0.1:{metrics_port}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut library = GoLibrary {
            child,
            metrics_port,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if library.get("/readyz").is_ok_and(|(code, _)| code == 200) {
                return Ok(library);
            }
            let exited = library.child.try_wait()?;
            if exited.is_some() || Instant::now() >= deadline {
                anyhow::bail!(
                    "the Go library's provisioner is not ready ({}); its log:\n{}",
                    exited.map_or("after 60 s".into(), |status| status.to_string()),
                    std::fs::read_to_string(&library.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl MetricsEndpoint for GoLibrary {
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.metrics_port, path)
    }
}

impl Provisioner for GoLibrary {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn cpu_name(&self) -> &'static str {
        crate::cpu::GO_LIBRARY
    }

    fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                anyhow::bail!("the Go library's provisioner still runs after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for GoLibrary {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_provisioner_tests::metrics::parse_samples;

    #[test]
    fn the_go_librarys_counter_reads_as_the_hosts() {
        // as bench/golib/main.go renders it
        let text = "# TYPE wasm_provisioner_kube_api_requests_total counter\n\
            wasm_provisioner_kube_api_requests_total{code=\"201\",resource=\"persistentvolumes\",verb=\"create\"} 3\n\
            wasm_provisioner_kube_api_requests_total{code=\"200\",resource=\"events\",verb=\"patch\"} 2\n\
            wasm_provisioner_kube_api_requests_total{code=\"409\",resource=\"persistentvolumeclaims\",verb=\"update\"} 1\n\
            wasm_provisioner_kube_api_requests_total{code=\"200\",resource=\"persistentvolumes\",verb=\"list\"} 1\n\
            wasm_provisioner_kube_api_requests_total{code=\"200\",resource=\"persistentvolumes\",verb=\"watch\"} 1\n";
        let requests = Requests::from_client(&parse_samples(text));
        assert_eq!(requests.writes(), 6.0);
        assert_eq!(requests.reads(), 1.0, "watches are not counted");
        assert_eq!(requests.conflicts(), 1.0);
    }

    #[test]
    fn the_go_library_named_is_the_one_its_module_requires() {
        let go_mod = include_str!("../golib/go.mod");
        let (name, version) = GO_LIBRARY.split_once(' ').unwrap();
        let required = format!("sigs.k8s.io/{name}/v13 {version}");
        assert!(
            go_mod.lines().any(|line| line.trim() == required),
            "bench/golib/go.mod does not require {required}"
        );
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&values, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_table_has_a_row_per_run() {
        let run = RunFigures {
            run: "ceiling".into(),
            settings: "-".into(),
            claims: 2,
            bound: 2,
            all_bound_s: 1.0,
            latencies: vec![0.5, 1.0],
            bound_at: vec![0.5, 1.0],
            ..Default::default()
        };
        let text = table(std::slice::from_ref(&run));
        assert_eq!(text.lines().count(), 3);
        assert!(
            text.contains("| ceiling | - | 2 | 1.00 s | 2.0 |"),
            "{text}"
        );
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("plot.png");
        plot(&png, "test", &[run]).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }

    fn run_binding(name: &str, claims: usize, all_bound_s: f64) -> RunFigures {
        RunFigures {
            run: name.into(),
            claims,
            bound: claims,
            all_bound_s,
            ..Default::default()
        }
    }

    #[test]
    fn the_summary_compares_medians_with_the_ceilings() {
        let runs = [
            run_binding("ceiling", 100, 1.0),
            run_binding("unthrottled", 100, 2.0),
            run_binding("ceiling", 100, 2.0),
            run_binding("unthrottled", 100, 1.25),
            run_binding("ceiling", 100, 0.5),
            run_binding("unthrottled", 100, 4.0),
        ];
        let text = summary_table(&runs);
        assert!(
            text.contains("| ceiling | 100.0, 50.0, 200.0 | 100.0 | 100% |"),
            "{text}"
        );
        assert!(
            text.contains("| unthrottled | 50.0, 80.0, 25.0 | 50.0 | 50% |"),
            "{text}"
        );
    }

    #[test]
    fn a_run_other_work_disturbed_is_marked() {
        let cpu = |busy: f64, stolen: f64| crate::cpu::CpuUse {
            wall_s: 1.0,
            cores: 2,
            machine_busy_s: Some(busy),
            stolen_s: Some(stolen),
            processes: [("kube-apiserver".to_string(), 1.0)].into(),
        };
        let mut quiet = run_binding("unthrottled", 100, 1.0);
        quiet.cpu_provisioning = Some(cpu(1.05, 0.0));
        let mut stolen = run_binding("unthrottled", 100, 2.0);
        stolen.cpu_provisioning = Some(cpu(1.0, 0.3));
        let mut busy = run_binding("ceiling", 100, 1.0);
        busy.cpu_provisioning = Some(cpu(1.5, 0.0));
        assert!(!quiet.disturbed() && stolen.disturbed() && busy.disturbed());
        let text = summary_table(&[busy, quiet, stolen]);
        assert!(
            text.contains("| ceiling | 100.0* | 100.0 | 100% |"),
            "{text}"
        );
        assert!(text.contains("| unthrottled | 100.0, 50.0* |"), "{text}");
        assert!(text.contains("* disturbed"), "{text}");
        let quiet_only = summary_table(&[run_binding("ceiling", 100, 1.0)]);
        assert!(!quiet_only.contains("disturbed"), "{quiet_only}");
    }

    #[test]
    fn stages_say_when_1_percent_half_and_all_got_there() {
        let mut run = run_binding("unthrottled", 4, 4.0);
        run.announced_at = vec![0.1, 0.2, 0.3, 0.4];
        run.published_at = vec![1.0, 2.0, 3.0];
        run.bound_at = vec![1.5, 2.5, 3.5, 4.0];
        let text = stages_table(&[run]);
        assert!(
            text.contains(
                "| unthrottled | 4 | 0.10 / 0.20 / 0.40 | 1.00 / 2.00 / - | 1.50 / 2.50 / 4.00 |"
            ),
            "{text}"
        );
    }
}
