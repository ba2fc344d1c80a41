//! Where the CPU goes during a load run: the machine's busy time (`/proc/stat`) and each
//! process's (`/proc/PID/stat`): the embedded control plane's etcd, kube-apiserver and
//! kube-controller-manager (found by the launcher's command line), the provisioner (the
//! host, or the Go library's provisioner of `bench/golib`), and the benchmark itself. On
//! two cores the control plane, the host and the benchmark share the machine, so a run's
//! claims/s follows the CPU every volume costs all of them together.

use std::collections::BTreeMap;
use std::time::Instant;

/// The control plane's components, as the launcher names them (its first argument).
pub const COMPONENTS: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

/// The provisioners' names in a sample, each a column of its own: the host, and the Go
/// library's provisioner (`bench/golib`).
pub const PROVISIONERS: [&str; 2] = [HOST, GO_LIBRARY];
pub const HOST: &str = "host";
pub const GO_LIBRARY: &str = "go-library";

/// CPU seconds so far: of the whole machine (busy, all cores), and of each watched
/// process by name.
#[derive(Clone, Debug)]
pub struct CpuSample {
    at: Instant,
    machine_busy_s: Option<f64>,
    stolen_s: Option<f64>,
    processes: BTreeMap<String, f64>,
}

/// CPU used between two samples.
#[derive(Clone, Debug, Default)]
pub struct CpuUse {
    pub wall_s: f64,
    pub cores: usize,
    /// Busy CPU seconds of the whole machine (every process, the kernel's too).
    pub machine_busy_s: Option<f64>,
    /// CPU seconds the hypervisor gave to other guests while this virtual machine had
    /// work (`steal` in `/proc/stat`): the run was slowed by something outside it.
    pub stolen_s: Option<f64>,
    /// CPU seconds by process name (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `host` or `go-library`, `benchmark`); a process missing from either sample is left
    /// out.
    pub processes: BTreeMap<String, f64>,
}

impl CpuSample {
    /// Now: the machine, the local control plane's components (none when the cluster
    /// is not the embedded one), the provisioner (if any: its name in [`PROVISIONERS`]
    /// and its pid) and this process.
    pub fn take(provisioner: Option<(&str, u32)>) -> CpuSample {
        let mut pids: Vec<(String, u32)> = control_plane_pids();
        pids.extend(provisioner.map(|(name, pid)| (name.to_string(), pid)));
        pids.push(("benchmark".to_string(), std::process::id()));
        let processes = pids
            .into_iter()
            .filter_map(|(name, pid)| Some((name, process_cpu_seconds(pid)?)))
            .collect();
        let machine = machine_seconds();
        CpuSample {
            at: Instant::now(),
            machine_busy_s: machine.map(|(busy, _)| busy),
            stolen_s: machine.map(|(_, stolen)| stolen),
            processes,
        }
    }

    /// What was used from `before` to this sample.
    pub fn since(&self, before: &CpuSample) -> CpuUse {
        let processes = self
            .processes
            .iter()
            .filter_map(|(name, now)| Some((name.clone(), now - before.processes.get(name)?)))
            .collect();
        CpuUse {
            wall_s: self.at.duration_since(before.at).as_secs_f64(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            machine_busy_s: self
                .machine_busy_s
                .zip(before.machine_busy_s)
                .map(|(now, then)| now - then),
            stolen_s: self
                .stolen_s
                .zip(before.stolen_s)
                .map(|(now, then)| now - then),
            processes,
        }
    }
}

impl CpuUse {
    /// The machine's busy share of all its cores over the interval.
    pub fn machine_busy_share(&self) -> Option<f64> {
        let capacity = self.wall_s * self.cores as f64;
        self.machine_busy_s
            .filter(|_| capacity > 0.0)
            .map(|busy| busy / capacity)
    }

    /// The share of the machine's cores that went to neither the control plane, the
    /// provisioner nor the benchmark (other processes, or the hypervisor's other guests):
    /// above a few percent the run's figures were disturbed from outside.
    pub fn outside_share(&self) -> Option<f64> {
        let capacity = self.wall_s * self.cores as f64;
        let outside = self.rest_s()? + self.stolen_s.unwrap_or(0.0);
        (capacity > 0.0).then(|| outside / capacity)
    }

    /// Busy CPU seconds of the machine that none of the sampled processes account for.
    fn rest_s(&self) -> Option<f64> {
        let named: f64 = self.processes.values().sum();
        self.machine_busy_s.map(|busy| (busy - named).max(0.0))
    }

    /// One table row's cells: busy share, then CPU ms per volume of each component,
    /// each provisioner (the host, the Go library), the benchmark, the rest of the
    /// machine, what the hypervisor took (stolen) and the total busy.
    pub fn cells(&self, volumes: usize) -> Vec<String> {
        let per_volume = |seconds: f64| format!("{:.1}", seconds * 1000.0 / volumes.max(1) as f64);
        let mut cells = vec![
            self.machine_busy_share()
                .map(|share| format!("{:.0}%", share * 100.0))
                .unwrap_or_else(|| "-".into()),
        ];
        let processes = COMPONENTS.iter().chain(&PROVISIONERS).copied();
        for name in processes.chain(["benchmark"]) {
            cells.push(
                self.processes
                    .get(name)
                    .map_or_else(|| "-".into(), |s| per_volume(*s)),
            );
        }
        cells.push(self.rest_s().map_or_else(|| "-".into(), per_volume));
        cells.push(self.stolen_s.map_or_else(|| "-".into(), per_volume));
        cells.push(self.machine_busy_s.map_or_else(|| "-".into(), per_volume));
        cells
    }
}

/// User plus system CPU seconds of process `pid`.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_process_ticks(&stat).map(|ticks| ticks / clock_ticks_per_second())
}

/// utime + stime (clock ticks) from a `/proc/PID/stat` line.
fn parse_process_ticks(stat: &str) -> Option<f64> {
    // the fields after the command (which may hold spaces and parentheses), from field 3
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds of the whole machine since boot: busy (all but idle, iowait and steal),
/// and stolen by the hypervisor.
fn machine_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, stolen) = parse_machine_ticks(&stat)?;
    Some((
        busy / clock_ticks_per_second(),
        stolen / clock_ticks_per_second(),
    ))
}

/// The first line of `/proc/stat`: `cpu user nice system idle iowait irq softirq steal
/// guest guest_nice`; guest time is already counted in user. Busy ticks (all but idle,
/// iowait and steal) and steal ticks.
fn parse_machine_ticks(stat: &str) -> Option<(f64, f64)> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let (idle, iowait, steal) = (ticks.get(3)?, ticks.get(4)?, ticks.get(7)?);
    Some((ticks.iter().sum::<f64>() - idle - iowait - steal, *steal))
}

/// `getconf CLK_TCK`: 100 on every Linux this runs on.
fn clock_ticks_per_second() -> f64 {
    100.0
}

/// The embedded control plane's component processes: the launcher's binary
/// (`controlplane-<hash>`) run with a component's name as its first argument.
fn control_plane_pids() -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let component = control_plane_component(&cmdline)?;
            Some((component.to_string(), pid))
        })
        .collect()
}

/// The component a command line (NUL-separated) runs, if it is the launcher's.
fn control_plane_component(cmdline: &[u8]) -> Option<&'static str> {
    let mut args = cmdline.split(|b| *b == 0);
    let program = String::from_utf8_lossy(args.next()?);
    let program = program.rsplit('/').next()?;
    if !program.starts_with("controlplane-") {
        return None;
    }
    let first = String::from_utf8_lossy(args.next()?).into_owned();
    COMPONENTS.into_iter().find(|name| *name == first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ticks_are_utime_plus_stime_even_with_a_parenthesised_command() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_process_ticks(stat), Some(325.0));
    }

    #[test]
    fn machine_busy_ticks_leave_out_idle_iowait_and_steal() {
        let stat = "cpu  100 5 50 1000 20 3 2 4 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(parse_machine_ticks(stat), Some((160.0, 4.0)));
    }

    #[test]
    fn only_the_launchers_components_are_control_plane() {
        let line = |args: &[&str]| args.join("\0").into_bytes();
        assert_eq!(
            control_plane_component(&line(&[
                "/root/.cache/x/controlplane-e534a42abde3b949",
                "kube-apiserver",
                "--etcd-servers=http://127.0.0.1:1"
            ])),
            Some("kube-apiserver")
        );
        assert_eq!(
            control_plane_component(&line(&["/usr/bin/controlplane-x", "run", "--dir"])),
            None
        );
        assert_eq!(
            control_plane_component(&line(&["/usr/local/bin/etcd", "etcd"])),
            None
        );
    }

    #[test]
    fn a_row_splits_the_machine_into_components_and_the_rest() {
        let cpu = CpuUse {
            wall_s: 10.0,
            cores: 2,
            machine_busy_s: Some(15.0),
            stolen_s: Some(0.5),
            processes: [
                ("etcd".to_string(), 2.0),
                ("kube-apiserver".to_string(), 6.0),
                ("kube-controller-manager".to_string(), 2.0),
                ("host".to_string(), 1.0),
                ("benchmark".to_string(), 0.5),
            ]
            .into(),
        };
        assert_eq!(cpu.machine_busy_share(), Some(0.75));
        assert_eq!(
            cpu.cells(500),
            [
                "75%", "4.0", "12.0", "4.0", "2.0", "-", "1.0", "7.0", "1.0", "30.0"
            ]
        );
        // 3.5 s of other work and 0.5 s stolen, of 20 s of the two cores.
        assert_eq!(cpu.outside_share(), Some(0.2));
    }

    #[test]
    fn the_go_library_has_a_column_of_its_own() {
        let cpu = CpuUse {
            wall_s: 1.0,
            cores: 2,
            machine_busy_s: Some(1.0),
            stolen_s: None,
            processes: [(GO_LIBRARY.to_string(), 0.5)].into(),
        };
        assert_eq!(
            cpu.cells(100),
            ["50%", "-", "-", "-", "-", "5.0", "-", "5.0", "-", "10.0"]
        );
    }
}
