//! Leader election on a coordination.k8s.io Lease, with client-go's contract: only the
//! leader runs the controllers, and it stops changing anything before another process
//! can lead.
//!
//! - The leader renews every `retry-period`, with its own unthrottled client (renewals
//!   never queue behind reconcile traffic).
//! - The renew deadline counts from the start of the last *successful* renewal; when it
//!   passes, the [`Leadership`] fence closes: in-flight guest calls and API writes are
//!   cancelled, no new one starts, and the process exits non-zero (as the Go library does), so
//!   the replica restarts and rejoins the election cleanly.
//! - A standby takes the Lease only after seeing its record unchanged for the Lease's
//!   duration, on its own clock ([`lease`]).
//! - A graceful shutdown keeps renewing while in-flight operations finish, then releases
//!   the Lease so a standby takes over at once.
//!
//! kube-lease-manager was used before: it renews only near expiry and does not expose
//! when a renewal succeeded, so it cannot give the fence.

mod fence;
mod lease;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;
pub use fence::{Leadership, NotLeader};
use lease::{Attempt, Elector};

/// Seed defaults: lease 15 s, renew deadline 10 s, retry 2 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader election settings are invalid: {0}")]
    Settings(String),
    #[error(
        "lost the leader lease {namespace}/{name} ({why}); exiting so this replica restarts and rejoins the election"
    )]
    Lost {
        namespace: String,
        name: String,
        why: String,
    },
}

/// How to take part in the election.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby tries to take the lease.
    pub retry_period: Duration,
    /// Annotations the leader writes on the Lease (node-local mode's advert).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Where each Lease seen is published (node-local mode's instances follow it).
    pub observed: Option<Arc<watch::Sender<Option<Lease>>>>,
}

/// The Lease name for a provisioner name: `/` is not allowed in object names.
pub fn lease_name(provisioner_name: &str) -> String {
    provisioner_name.replace('/', "-")
}

/// The Go library's identity format: `<hostname>_<uuid>`.
pub fn identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

impl Settings {
    /// client-go's rules: lease duration > renew deadline > retry period (> 0), whole
    /// seconds for the Lease object.
    fn validate(&self) -> Result<(), Error> {
        let duration = self.lease_duration;
        let renew = self.renew_deadline;
        let retry = self.retry_period;
        if retry.is_zero() || renew <= retry || duration <= renew || duration.as_secs() == 0 {
            return Err(Error::Settings(format!(
                "need lease duration ({duration:?}) > renew deadline ({renew:?}) > retry period ({retry:?}) > 0, the lease duration in whole seconds"
            )));
        }
        Ok(())
    }

    fn lost(&self, why: impl Into<String>) -> Error {
        Error::Lost {
            namespace: self.namespace.clone(),
            name: self.lease_name.clone(),
            why: why.into(),
        }
    }
}

/// Waits to become leader, then runs `work` with the [`Leadership`] fence and a token
/// cancelled on shutdown. On shutdown it keeps renewing until `work` returns, then
/// releases the lease. Returns `Err(Error::Lost)` when the lease was lost: by then the
/// fence is closed and `work` has been aborted.
///
/// `client` should be unthrottled: renewals must not wait behind reconcile traffic.
pub async fn run_as_leader<W, F>(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    work: W,
) -> Result<(), Error>
where
    W: FnOnce(Leadership, CancellationToken) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    settings.validate()?;
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut elector = Elector::new(
        api,
        &settings.lease_name,
        &settings.identity,
        settings.lease_duration,
    )
    .advertising(settings.annotations.clone(), settings.observed.clone());
    info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "waiting to become leader");
    let mut ticker = tokio::time::interval(settings.retry_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Standby: every retry period, try to take the Lease.
    let mut valid_until = loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let started = Instant::now();
        match tokio::time::timeout(settings.retry_period, elector.try_acquire_or_renew()).await {
            Ok(Ok(Attempt::Held)) => break started + settings.renew_deadline,
            Ok(Ok(Attempt::HeldBy(_) | Attempt::Conflict)) | Err(_) => {}
            Ok(Err(error)) => {
                warn!(%error, lease = %settings.lease_name, namespace = %settings.namespace, "leader election: cannot read or take the Lease; check the host's RBAC on coordination.k8s.io leases; retrying")
            }
        }
    };

    info!(lease = %settings.lease_name, identity = %settings.identity, "became leader");
    metrics.leader.set(1);
    let (fence, fence_until) = watch::channel(Some(valid_until));
    let work_token = CancellationToken::new();
    let term = elector.term();
    let mut task = tokio::spawn(work(
        Leadership::elected(fence_until, term),
        work_token.clone(),
    ));
    let lost = loop {
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(valid_until) => {
                break Some(format!("not renewed within the renew deadline of {:?}", settings.renew_deadline));
            }
            _ = &mut task => break None,
            _ = shutdown.cancelled(), if !work_token.is_cancelled() => {
                info!("shutting down: letting in-flight operations finish (the lease is still renewed)");
                work_token.cancel();
            }
            _ = ticker.tick() => {
                let started = Instant::now();
                let renewal = tokio::time::timeout(
                    valid_until.saturating_duration_since(started),
                    elector.try_acquire_or_renew(),
                );
                match renewal.await {
                    Ok(Ok(Attempt::Held)) => {
                        valid_until = started + settings.renew_deadline;
                        let _ = fence.send(Some(valid_until));
                    }
                    Ok(Ok(Attempt::HeldBy(holder))) => break Some(format!("now held by {holder}")),
                    Ok(Ok(Attempt::Conflict)) => {}
                    Ok(Err(error)) => warn!(%error, lease = %settings.lease_name, "cannot renew the leader lease"),
                    Err(_) => warn!(lease = %settings.lease_name, "renewing the leader lease timed out"),
                }
            }
        }
    };
    if let Some(why) = lost {
        // Close the fence first: fenced steps return at once, no new one starts.
        let _ = fence.send(None);
        metrics.leader.set(0);
        warn!(lease = %settings.lease_name, identity = %settings.identity, %why, "lost the leader lease: stopping all work now");
        work_token.cancel();
        task.abort();
        let _ = task.await;
        return Err(settings.lost(why));
    }
    metrics.leader.set(0);
    if let Err(error) = elector.release().await {
        warn!(%error, lease = %settings.lease_name, "could not release the leader lease; a standby takes over when it expires");
    } else {
        info!(lease = %settings.lease_name, "released the leader lease");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(duration: u64, renew: u64) -> Settings {
        Settings {
            namespace: "default".into(),
            lease_name: "x".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(renew),
            retry_period: DEFAULT_RETRY_PERIOD,
            annotations: Default::default(),
            observed: None,
        }
    }

    #[test]
    fn lease_is_named_after_the_provisioner() {
        assert_eq!(lease_name("example.com/nfs"), "example.com-nfs");
        assert_eq!(lease_name("wasm-provisioner.dev"), "wasm-provisioner.dev");
    }

    #[test]
    fn durations_must_nest() {
        assert!(settings(15, 10).validate().is_ok());
        assert!(settings(10, 10).validate().is_err());
        assert!(
            settings(10, 2).validate().is_err(),
            "renew deadline = retry period"
        );
        assert!(settings(10, 0).validate().is_err());
    }

    #[test]
    fn identity_is_host_and_uuid() {
        let id = identity();
        let (_, uuid) = id.rsplit_once('_').expect("hostname_uuid");
        assert_eq!(uuid.len(), 36);
    }
}
