//! The `wasm-provisioner` binary as a child process, the way it runs in a cluster:
//! `run` against the test control plane, with its own modules directory, grants file,
//! provisioner name and metrics port.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The built host binary in the same `<target>/<profile>` directory as this executable
/// (a test in `deps/`, or the demo or the load benchmark beside it). `bash tests/run.sh`
/// builds it first. `WASM_PROVISIONER_TEST_HOST_BINARY` names another (a copy of this
/// tree's build, when the target directory is shared with builds of other trees).
pub fn binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("WASM_PROVISIONER_TEST_HOST_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("executable path");
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("wasm-provisioner"))
        .collect();
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the host binary is missing (looked at {candidates:?}): build it with \
             `cargo build -p wasm-provisioner` (bash tests/run.sh does)"
            )
        })
}

/// A free loopback port for a metrics endpoint.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A plain HTTP/1.0 GET of `path` on the loopback `port`: (status code, body).
pub fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    http_get_at(std::net::Ipv4Addr::LOCALHOST.into(), port, path)
}

/// A plain HTTP/1.0 GET of `path` on `ip`'s `port` (a pod's IP, say): (status code, body).
pub fn http_get_at(ip: std::net::IpAddr, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::new(ip, port),
        Duration::from_secs(5),
    )?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// A running host. Killed (SIGKILL) when dropped, unless it already exited.
pub struct Host {
    child: Child,
    pub metrics_port: u16,
    pub log: PathBuf,
}

/// How to start a host.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub kubeconfig: PathBuf,
    pub provisioner_name: String,
    pub modules: PathBuf,
    pub grants: Option<PathBuf>,
    pub log_dir: PathBuf,
    /// Extra flags, such as short retry intervals.
    pub args: Vec<String>,
}

impl HostConfig {
    /// Flags that make retries and resyncs fast enough for tests.
    pub fn fast_retries() -> Vec<String> {
        [
            "--retry-interval-start=1s",
            "--retry-interval-max=5s",
            "--pv-save-interval=1s",
            "--resync-period=30s",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            // The debug build's compiler needs more memory than the release build's
            // default allows for the 13 MB JavaScript guest.
            "--compile-memory-bytes=536870912",
        ]
        .map(String::from)
        .to_vec()
    }
}

impl Host {
    /// Starts `wasm-provisioner run` and waits until `/readyz` answers 200 (caches
    /// synced; with leader election, that does not mean leading).
    pub fn start(config: &HostConfig) -> anyhow::Result<Host> {
        Self::start_with(config, false)
    }

    /// [`Self::start`], the host in a process group of its own: a terminal's Ctrl-C
    /// (sent to the whole foreground group) reaches only the caller, which still needs
    /// the host to delete what it made before it stops it (the demo).
    pub fn start_in_own_process_group(config: &HostConfig) -> anyhow::Result<Host> {
        Self::start_with(config, true)
    }

    fn start_with(config: &HostConfig, own_process_group: bool) -> anyhow::Result<Host> {
        let host = Self::spawn_with(config, own_process_group)?;
        host.wait_ready(Duration::from_secs(60))?;
        Ok(host)
    }

    /// Starts the host without waiting.
    pub fn spawn(config: &HostConfig) -> anyhow::Result<Host> {
        Self::spawn_with(config, false)
    }

    fn spawn_with(config: &HostConfig, own_process_group: bool) -> anyhow::Result<Host> {
        let metrics_port = free_port();
        std::fs::create_dir_all(&config.log_dir)?;
        let log = config.log_dir.join(format!(
            "host-{}-{}.log",
            config.provisioner_name.replace('/', "-"),
            metrics_port
        ));
        let log_file = std::fs::File::create(&log)?;
        let mut command = Command::new(binary());
        command
            .arg("run")
            .arg(format!("--kubeconfig={}", config.kubeconfig.display()))
            .arg(format!("--provisioner-name={}", config.provisioner_name))
            .arg(format!("--modules={}", config.modules.display()))
            .arg(format!("--metrics-address=127.0.0.1:{metrics_port}"))
            .args(&config.args)
            .env("WASM_PROVISIONER_LOG", "info,wasm_provisioner=debug")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        if let Some(grants) = &config.grants {
            command.arg(format!("--grants={}", grants.display()));
        }
        if own_process_group {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child = command.spawn().context("starting wasm-provisioner")?;
        Ok(Host {
            child,
            metrics_port,
            log,
        })
    }

    /// The process id (for its CPU time and memory in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The host's log so far (for assertion messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 60 lines of the host's log and where the whole of it is, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(60);
        format!(
            "last lines of the host log ({}):\n{}",
            self.log.display(),
            lines[start..].join("\n")
        )
    }

    pub fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self
                .get("/readyz")
                .map(|(code, _)| code == 200)
                .unwrap_or(false)
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "host not ready after {timeout:?}; its log:\n{}",
            self.log_text()
        )
    }

    /// A plain HTTP GET on the metrics endpoint: (status code, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.metrics_port, path)
    }

    /// The value of one sample of the Prometheus text exposition, such as
    /// `controller_persistentvolumeclaim_provision_total{class="x",source=""}`.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").ok()?;
        body.lines()
            .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
    }

    /// SIGTERM, then wait up to `timeout` for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        self.wait(timeout)
    }

    /// The exit status, if the host has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Resident memory (VmRSS) of the running host, from `/proc`.
    pub fn rss_bytes(&self) -> Option<u64> {
        proc_status_bytes(self.child.id(), "VmRSS")
    }

    /// SIGKILL, as `kill -9` would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the host to exit on its own.
    pub fn wait(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "host still running after {timeout:?}; its log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A memory figure of process `pid` from `/proc/PID/status` (`VmRSS`, `VmHWM`, ...), in
/// bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
