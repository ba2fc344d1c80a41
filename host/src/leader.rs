//! Leader election on a coordination.k8s.io Lease (kube-lease-manager): only the leader
//! runs the controllers. Losing the lease stops the work and ends the process with an
//! error, as the seed does, so a restarted replica rejoins the election cleanly. A
//! graceful shutdown lets in-flight operations finish, then releases the lease so a
//! standby takes over at once instead of waiting for it to expire.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Seed defaults: lease 15 s, renew deadline 10 s, retry 2 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader election settings are invalid: {0}")]
    Settings(String),
    #[error(
        "cannot use Lease {namespace}/{name}: {source}; check the host's RBAC on coordination.k8s.io leases"
    )]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error(
        "lost the leader lease {namespace}/{name}; exiting so this replica restarts and rejoins the election"
    )]
    Lost { namespace: String, name: String },
}

/// How to take part in the election.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    /// How often a standby tries to take the lease.
    pub retry_period: Duration,
}

/// The Lease name for a provisioner name: `/` is not allowed in object names.
pub fn lease_name(provisioner_name: &str) -> String {
    provisioner_name.replace('/', "-")
}

/// The seed's identity format: `<hostname>_<uuid>`.
pub fn identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

impl Settings {
    /// kube-lease-manager renews `grace` seconds before expiry: the renew deadline's
    /// complement. Both are whole seconds in the Lease object.
    fn duration_and_grace(&self) -> Result<(u64, u64), Error> {
        let duration = self.lease_duration.as_secs();
        let renew = self.renew_deadline.as_secs();
        if duration == 0 || renew == 0 || renew >= duration {
            return Err(Error::Settings(format!(
                "the renew deadline ({renew}s) must be at least 1s and shorter than the lease duration ({duration}s)"
            )));
        }
        Ok((duration, duration - renew))
    }
}

/// Waits to become leader, then runs `work` with a token that is cancelled when the
/// lease is lost or `shutdown` fires. On shutdown it waits for `work` to return, then
/// releases the lease. Returns `Err(Error::Lost)` when the lease was lost.
///
/// A standby re-checks the Lease every `retry_period` (kube-lease-manager on its own
/// would sleep until the holder's lease expires), so a released lease is taken over
/// within about one retry period, as with client-go's leader election.
pub async fn run_as_leader<W, F>(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    work: W,
) -> Result<(), Error>
where
    W: FnOnce(CancellationToken) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let (duration, grace) = settings.duration_and_grace()?;
    let lease_error = |source| Error::Lease {
        namespace: settings.namespace.clone(),
        name: settings.lease_name.clone(),
        source,
    };
    info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "waiting to become leader");
    // Standby: every retry period, read the Lease afresh and try to take it. (A
    // LeaseManager trusts its last reading until the holder's lease would expire, so a
    // long-lived one would notice a released lease only then; a fresh one sees it now.)
    let manager = loop {
        let attempt = async {
            let manager = LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
                .with_namespace(&settings.namespace)
                .with_identity(&settings.identity)
                .with_duration(duration)
                .with_grace(grace)
                .build()
                .await?;
            match tokio::time::timeout(settings.retry_period, manager.changed()).await {
                Ok(Ok(true)) => Ok(Some(manager)),
                Ok(Ok(false)) | Err(_) => Ok(None),
                Ok(Err(error)) => Err(error),
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            result = attempt => match result {
                Ok(Some(manager)) => break manager,
                Ok(None) => {}
                Err(error) => {
                    warn!(error = %lease_error(error), "leader election: retrying");
                    tokio::time::sleep(settings.retry_period).await;
                }
            },
        }
    };

    info!(lease = %settings.lease_name, identity = %settings.identity, "became leader");
    metrics.leader.set(1);
    let work_token = shutdown.child_token();
    let mut task = tokio::spawn(work(work_token.clone()));
    let mut lost = false;
    // Leader: keep renewing; errors for longer than the renew deadline mean the lease
    // may have gone to another replica, which counts as lost.
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut work_done = false;
    loop {
        tokio::select! {
            renewed = manager.changed() => match renewed {
                Ok(true) => failing_since = None,
                Ok(false) => {
                    warn!(lease = %settings.lease_name, identity = %settings.identity, "lost the leader lease, stopping work");
                    lost = true;
                    break;
                }
                Err(error) => {
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    warn!(%error, lease = %settings.lease_name, "cannot renew the leader lease");
                    if since.elapsed() >= settings.renew_deadline {
                        lost = true;
                        break;
                    }
                    tokio::time::sleep(settings.retry_period).await;
                }
            },
            _ = shutdown.cancelled() => {
                info!("shutting down: letting in-flight operations finish");
                break;
            }
            _ = &mut task => {
                work_done = true;
                break;
            }
        }
    }
    if lost {
        work_token.cancel();
    }
    if !work_done {
        let _ = task.await;
    }
    metrics.leader.set(0);
    if lost {
        return Err(Error::Lost {
            namespace: settings.namespace.clone(),
            name: settings.lease_name.clone(),
        });
    }
    manager.release().await.map_err(lease_error)?;
    info!(lease = %settings.lease_name, "released the leader lease");
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
        }
    }

    #[test]
    fn lease_is_named_after_the_provisioner() {
        assert_eq!(lease_name("example.com/nfs"), "example.com-nfs");
        assert_eq!(lease_name("wasm-provisioner.dev"), "wasm-provisioner.dev");
    }

    #[test]
    fn renew_deadline_becomes_grace() {
        assert_eq!(settings(15, 10).duration_and_grace().unwrap(), (15, 5));
        assert!(settings(10, 10).duration_and_grace().is_err());
        assert!(settings(10, 0).duration_and_grace().is_err());
    }

    #[test]
    fn identity_is_host_and_uuid() {
        let id = identity();
        let (_, uuid) = id.rsplit_once('_').expect("hostname_uuid");
        assert_eq!(uuid.len(), 36);
    }
}
