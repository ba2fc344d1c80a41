//! Pod networking on this one machine, as a CNI plugin (a bridge plugin with host-local
//! IPAM) would give it: a Linux bridge in the machine's network namespace with a /24 of
//! its own, and for each pod a network namespace with a veth pair (one end on the
//! bridge, `eth0` with the pod's IP in the pod), `lo` up and a default route via the
//! bridge. Pods on one network reach each other, and the machine reaches them, over
//! the bridge; two pods may listen on the same ports.
//!
//! The test API server listens on the machine's loopback only (with a certificate for
//! 127.0.0.1), where in a cluster the pod would reach the `kubernetes` Service: each
//! pod's namespace gets a forwarder, a listener on the API server's loopback address
//! made inside the pod's namespace that relays every connection to the same address in
//! the machine's namespace, so `KUBERNETES_SERVICE_HOST`/`_PORT` stay what the
//! kubeconfig says.
//!
//! Names are unique per network (a random id), the /24 is a random free one of
//! 10.213.0.0/16, so test processes side by side never collide. Everything goes on
//! drop: a pod's forwarder, namespace and veth pair with the pod, the bridge with the
//! last pod and the [`Network`] itself. It needs root.

use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context as _, bail, ensure};

use crate::cluster::random_suffix;

/// The range each network takes a /24 of.
const RANGE: [u8; 2] = [10, 213];

/// Runs `ip ARGS...`; a failure names the command and shows its stderr.
fn run_ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    ensure!(
        output.status.success(),
        "ip {} failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// A bridge with its /24: the pods' network.
#[derive(Debug)]
pub struct Network {
    id: String,
    bridge: String,
    /// The bridge's address, `10.213.X.1`: the pods' default route.
    pub gateway: Ipv4Addr,
    /// The last pod address given out (`.2` is the first).
    last: AtomicU32,
}

impl Network {
    /// Makes the bridge on a random free /24 of 10.213.0.0/16.
    pub fn new() -> anyhow::Result<Arc<Network>> {
        let id = random_suffix();
        let bridge = format!("wpk{id}");
        let taken = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .context("running ip (iproute2)")?;
        let taken = String::from_utf8_lossy(&taken.stdout).into_owned();
        let mut seed = u32::from_str_radix(&id, 16).unwrap_or_default();
        let mut third = None;
        for _ in 0..64 {
            let candidate = (seed & 0xff) as u8;
            let prefix = format!(" {}.{}.{candidate}.", RANGE[0], RANGE[1]);
            if !taken.contains(&prefix) {
                third = Some(candidate);
                break;
            }
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345) >> 8;
        }
        let third = third.context("no free /24 in 10.213.0.0/16")?;
        let gateway = Ipv4Addr::new(RANGE[0], RANGE[1], third, 1);
        let network = Network {
            id,
            bridge,
            gateway,
            last: AtomicU32::new(1),
        };
        // From here on, drop removes the bridge, made or not.
        run_ip(&["link", "add", &network.bridge, "type", "bridge"])?;
        run_ip(&[
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            &network.bridge,
        ])?;
        run_ip(&["link", "set", &network.bridge, "up"])?;
        Ok(Arc::new(network))
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// A pod's network namespace on this network, with the next free address, and a
    /// forwarder to the API server at `api_server` (a loopback address) in it.
    pub fn attach(self: &Arc<Self>, api_server: SocketAddr) -> anyhow::Result<PodNetwork> {
        ensure!(
            api_server.ip().is_loopback(),
            "the pod network relays only to an API server on the machine's loopback, not {api_server}"
        );
        let index = self.last.fetch_add(1, Ordering::Relaxed) + 1;
        ensure!(index < 255, "the network's /24 is full");
        let [a, b, c, _] = self.gateway.octets();
        let ip = Ipv4Addr::new(a, b, c, index as u8);
        let mut pod = PodNetwork {
            netns: format!("wpk-{}-{index}", self.id),
            host_veth: format!("wpk{}v{index}", self.id),
            address: ip,
            forwarder: None,
            network: self.clone(),
        };
        // From here on, drop removes what was made.
        let ns = pod.netns.clone();
        run_ip(&["netns", "add", &ns])?;
        run_ip(&[
            "link",
            "add",
            &pod.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &ns,
        ])?;
        run_ip(&["link", "set", &pod.host_veth, "master", &self.bridge])?;
        run_ip(&["link", "set", &pod.host_veth, "up"])?;
        run_ip(&["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        run_ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        run_ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        run_ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &self.gateway.to_string(),
        ])?;
        pod.forwarder = Some(Forwarder::start(&pod.path(), api_server)?);
        Ok(pod)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run_ip(&["link", "del", &self.bridge]);
    }
}

/// One pod's network namespace on a [`Network`].
#[derive(Debug)]
pub struct PodNetwork {
    /// The namespace's name (`ip netns`).
    pub netns: String,
    host_veth: String,
    address: Ipv4Addr,
    forwarder: Option<Forwarder>,
    /// Kept so the bridge outlives the pod.
    network: Arc<Network>,
}

impl PodNetwork {
    /// The namespace's file, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.netns)
    }

    /// The pod's IP.
    pub fn ip(&self) -> IpAddr {
        self.address.into()
    }

    /// The network the pod is on.
    pub fn network(&self) -> &Arc<Network> {
        &self.network
    }
}

impl Drop for PodNetwork {
    /// The forwarder first (its listener holds the namespace), then the namespace (its
    /// end of the veth pair goes with it) and the bridge's end, should it remain.
    fn drop(&mut self) {
        drop(self.forwarder.take());
        let _ = run_ip(&["netns", "del", &self.netns]);
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A TCP relay from a listener inside a pod's network namespace to the same address
/// in the machine's: one thread accepts, two per connection copy.
#[derive(Debug)]
struct Forwarder {
    /// A handle on the listening socket, to wake the accepting thread (shutdown).
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(netns: &Path, address: SocketAddr) -> anyhow::Result<Forwarder> {
        let listener = listen_in(netns, address)
            .with_context(|| format!("listening on {address} in {}", netns.display()))?;
        let handle = listener.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let stop = stop.clone();
            let connections = connections.clone();
            // Spawned from a thread in the machine's namespace: it connects there.
            std::thread::Builder::new()
                .name("pod-api-relay".into())
                .spawn(move || relay(listener, address, stop, connections))?
        };
        Ok(Forwarder {
            listener: handle,
            stop,
            connections,
            thread: Some(thread),
        })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // On Linux, shutdown of a listening socket wakes a blocked accept (EINVAL).
        // SAFETY: a plain syscall on a socket this struct owns.
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for stream in self
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// A listener on `address` inside the network namespace at `netns`: made by a thread
/// that enters the namespace and ends there (a socket stays in the namespace it was
/// made in).
fn listen_in(netns: &Path, address: SocketAddr) -> anyhow::Result<TcpListener> {
    let netns = netns.to_path_buf();
    std::thread::spawn(move || -> anyhow::Result<TcpListener> {
        let file = std::fs::File::open(&netns)?;
        // SAFETY: setns on this thread only, with a namespace file it holds open.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns: {}", std::io::Error::last_os_error());
        }
        Ok(TcpListener::bind(address)?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread entering the pod's namespace panicked"))?
}

fn relay(
    listener: TcpListener,
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
) {
    for incoming in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = incoming else {
            // Out of descriptors, say: not a reason to spin.
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        let Ok(upstream) = TcpStream::connect(address) else {
            continue;
        };
        let (Ok(client_read), Ok(upstream_read)) = (client.try_clone(), upstream.try_clone())
        else {
            continue;
        };
        {
            let mut open = connections.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the closed ones (a peer address fails once a socket is shut down
            // both ways, not always: good enough to keep the list short).
            open.retain(|s| s.peer_addr().is_ok());
            for stream in [&client, &upstream] {
                if let Ok(stream) = stream.try_clone() {
                    open.push(stream);
                }
            }
        }
        for (mut from, mut to) in [(client_read, upstream), (upstream_read, client)] {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.shutdown(Shutdown::Write);
            });
        }
    }
}
