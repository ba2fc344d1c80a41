//! The renew-deadline rule on a real API server: a leader cut off from the API server
//! (its connection stalls, as in a network partition) stops every fenced step when its
//! renew deadline passes, counted from the start of its last successful renewal, and
//! exits; a standby takes the Lease only after the Lease duration, so the two never lead
//! at once (client-go's contract, `host/src/leader`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasm_provisioner::leader::{self, Leadership, Settings};
use wasm_provisioner::metrics::Metrics;
use wasm_provisioner_tests::cluster::{TestContext, admin_config};

const LEASE: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_secs(1);

/// A TCP proxy to the API server that can be cut: once `cut`, no byte goes either way
/// and new connections are held unanswered, so requests hang as in a partition.
struct Partition {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Partition {
    async fn start(upstream: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let cut = cutting.clone();
                tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        // Held open, never answered.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        drop(client);
                        return;
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(pipe(client_read, server_write, cut.clone()));
                    tokio::spawn(pipe(server_read, client_write, cut));
                });
            }
        });
        Ok(Partition { port, cut })
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// Copies bytes one way until the partition is cut; then holds them.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

fn settings(namespace: &str, identity: &str) -> Settings {
    Settings {
        namespace: namespace.to_string(),
        lease_name: "fence-test".to_string(),
        identity: identity.to_string(),
        lease_duration: LEASE,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY,
        annotations: Default::default(),
        observed: None,
    }
}

/// The work of an elected process: a fenced step every 20 ms; records when it started
/// and when its last step was allowed to finish.
fn work(
    log: Arc<Mutex<Steps>>,
) -> impl FnOnce(Leadership, CancellationToken) -> futures::future::BoxFuture<'static, ()> {
    move |leadership, stop| {
        Box::pin(async move {
            log.lock().await.led_from = Some(Instant::now());
            while !stop.is_cancelled() {
                let step = leadership
                    .fenced("test step", tokio::time::sleep(Duration::from_millis(20)))
                    .await;
                match step {
                    Ok(()) => log.lock().await.last_step = Some(Instant::now()),
                    Err(_) => {
                        log.lock().await.fenced = true;
                        return;
                    }
                }
            }
        })
    }
}

#[derive(Default)]
struct Steps {
    led_from: Option<Instant>,
    last_step: Option<Instant>,
    fenced: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_a_standby_leads() -> anyhow::Result<()> {
    let ctx = TestContext::new("leader-fence").await?;
    let config = admin_config().await?;
    let upstream = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .ok_or_else(|| anyhow::anyhow!("no API server address in the kubeconfig"))?;
    let partition = Partition::start(upstream).await?;
    let mut through = config.clone();
    through.cluster_url = format!("https://127.0.0.1:{}", partition.port).parse()?;
    let leader_client = kube::Client::try_from(through)?;
    let standby_client = kube::Client::try_from(config)?;

    // The leader first, through the partition.
    let leader_steps = Arc::new(Mutex::new(Steps::default()));
    let leader_run = tokio::spawn(leader::run_as_leader(
        leader_client,
        settings(&ctx.namespace, "leader"),
        Arc::new(Metrics::new()),
        CancellationToken::new(),
        work(leader_steps.clone()),
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while leader_steps.lock().await.last_step.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "the first host never led");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A standby, directly connected, tries every retry period.
    let standby_steps = Arc::new(Mutex::new(Steps::default()));
    let standby_stop = CancellationToken::new();
    let standby_run = tokio::spawn(leader::run_as_leader(
        standby_client,
        settings(&ctx.namespace, "standby"),
        Arc::new(Metrics::new()),
        standby_stop.clone(),
        work(standby_steps.clone()),
    ));
    // Let a few renewals succeed, then cut the leader off.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    partition.cut();
    let cut_at = Instant::now();

    let lost = tokio::time::timeout(Duration::from_secs(20), leader_run)
        .await
        .map_err(|_| anyhow::anyhow!("the cut-off leader never gave up"))??;
    let gave_up = Instant::now();
    let why = lost
        .expect_err("a leader that cannot renew loses")
        .to_string();
    assert!(why.contains("renew deadline"), "{why}");
    // Its last successful renewal started before the cut, so its fence closed within
    // the renew deadline of the cut (plus a second of scheduling slack on a busy CI
    // machine: still before the Lease duration, when a standby could first lead).
    let since_cut = gave_up - cut_at;
    assert!(
        since_cut <= RENEW_DEADLINE + Duration::from_secs(1),
        "the leader gave up {since_cut:?} after the cut; the renew deadline is {RENEW_DEADLINE:?}"
    );
    let (last_step, fenced) = {
        let steps = leader_steps.lock().await;
        (steps.last_step.expect("the leader stepped"), steps.fenced)
    };
    assert!(
        fenced || last_step <= gave_up,
        "the leader's work was stopped"
    );

    // The standby leads, but only after the leader's last step, with margin.
    let deadline = Instant::now() + Duration::from_secs(20);
    let standby_from = loop {
        if let Some(from) = standby_steps.lock().await.led_from {
            break from;
        }
        anyhow::ensure!(Instant::now() < deadline, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        standby_from > last_step,
        "two leaders at once: the standby led {:?} before the old leader's last step",
        last_step - standby_from
    );
    let margin = standby_from - last_step;
    assert!(
        margin >= LEASE - RENEW_DEADLINE - RETRY,
        "the standby led {margin:?} after the old leader's last step; the rule guarantees about {:?}",
        LEASE - RENEW_DEADLINE
    );
    let at = |t: Instant| {
        if t >= cut_at {
            (t - cut_at).as_secs_f64()
        } else {
            -(cut_at - t).as_secs_f64()
        }
    };
    eprintln!(
        "cut at 0 s; the leader's last step at {:.2} s, gave up at {:.2} s; the standby led from {:.2} s ({margin:?} after the last step)",
        at(last_step),
        at(gave_up),
        at(standby_from)
    );
    standby_stop.cancel();
    let _ = standby_run.await;
    ctx.cleanup().await;
    Ok(())
}
