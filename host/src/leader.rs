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

/// Seed defaults: lease 15 s, renew deadline 10 s. (The seed's 2 s retry period has no
/// counterpart: kube-lease-manager watches the Lease instead of polling it.)
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

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
    let manager = LeaseManagerBuilder::new(client, &settings.lease_name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
        .map_err(lease_error)?;
    let (mut leading, election) = manager.watch().await;
    info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity, "waiting to become leader");

    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    return finish(election, &settings, lease_error).await;
                }
            }
            _ = shutdown.cancelled() => {
                drop(leading);
                return finish(election, &settings, lease_error).await;
            }
        }
    }

    info!(lease = %settings.lease_name, identity = %settings.identity, "became leader");
    metrics.leader.set(1);
    let work_token = shutdown.child_token();
    let mut task = tokio::spawn(work(work_token.clone()));
    let mut lost = false;
    loop {
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    warn!(lease = %settings.lease_name, identity = %settings.identity, "lost the leader lease, stopping work");
                    lost = true;
                    work_token.cancel();
                    break;
                }
            }
            _ = shutdown.cancelled() => {
                info!("shutting down: letting in-flight operations finish");
                break;
            }
            _ = &mut task => {
                break;
            }
        }
    }
    let _ = task.await;
    metrics.leader.set(0);
    drop(leading);
    finish(election, &settings, lease_error).await?;
    if lost {
        return Err(Error::Lost {
            namespace: settings.namespace.clone(),
            name: settings.lease_name.clone(),
        });
    }
    Ok(())
}

/// Waits for the election task, which releases the lease once the channel is closed.
async fn finish(
    election: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    settings: &Settings,
    lease_error: impl Fn(kube_lease_manager::LeaseManagerError) -> Error,
) -> Result<(), Error> {
    match election.await {
        Ok(Ok(_)) => {
            info!(lease = %settings.lease_name, "released the leader lease");
            Ok(())
        }
        Ok(Err(error)) => Err(lease_error(error)),
        Err(join) => Err(Error::Settings(format!("the election task failed: {join}"))),
    }
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
