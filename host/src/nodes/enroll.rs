//! How an instance gets its node's certificate for a term (the leader's side is
//! [`super::enroller`]).
//!
//! The leader advertises, on the Lease it holds, its term CA's certificate and its own
//! address ([`Advert`]). An instance that sees a new term connects to that address,
//! trusting only that CA, and sends its projected ServiceAccount token (audience
//! [`super::enroller::AUDIENCE`], bound to its pod). The leader checks the token with a TokenReview:
//! valid, bound to a pod of the instances' selector in the host's namespace, of that
//! pod's ServiceAccount; it issues a key and certificate for the pod's node — the
//! node Kubernetes says the pod runs on, never one the instance names.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use prometheus::IntGauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::client::{connect, post};
use super::pki::{self, Authority};
use super::server::{Channel, Role};
use super::wire::{ENROLL_PATH, Enrolled, Enrollment};

/// The Lease annotation with the leader's term CA certificate (PEM).
pub const ANNOTATION_CA: &str = "wasm-provisioner.dev/node-channel-ca";
/// The Lease annotation with the leader's channel address (`ip:port`).
pub const ANNOTATION_ADDRESS: &str = "wasm-provisioner.dev/node-channel-address";

/// The annotations a leader writes on its Lease.
pub fn advert_annotations(authority: &Authority, address: SocketAddr) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_CA.to_string(), authority.ca_pem().to_string()),
        (ANNOTATION_ADDRESS.to_string(), address.to_string()),
    ])
}

/// What an instance reads of the current leader on the Lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Advert {
    pub holder: String,
    pub term: i32,
    pub ca_pem: String,
    pub address: SocketAddr,
}

impl Advert {
    /// The advert of `lease`'s holder, unless it is `own_identity` or not advertised.
    pub fn of(lease: &Lease, own_identity: &str) -> Option<Self> {
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
        if holder == own_identity {
            return None;
        }
        let annotations = lease.annotations();
        Some(Self {
            holder: holder.to_string(),
            term: spec.lease_transitions.unwrap_or(0),
            ca_pem: annotations.get(ANNOTATION_CA)?.clone(),
            address: annotations.get(ANNOTATION_ADDRESS)?.parse().ok()?,
        })
    }
}

/// The instance's side: asks the leader of `advert` for this node's certificate with
/// the token in `token_file`; the role to serve with.
async fn enroll(advert: &Advert, token_file: &Path, own_node: &str) -> Result<Role, String> {
    let token = std::fs::read_to_string(token_file)
        .map_err(|error| format!("cannot read the token {}: {error}", token_file.display()))?;
    let config = pki::client_config(&advert.ca_pem, None)
        .map_err(|error| format!("the Lease's CA is unusable: {error}"))?;
    let mut sender = connect(config, advert.address, pki::LEADER_NAME).await?;
    let body = serde_json::to_vec(&Enrollment {
        token: token.trim().to_string(),
    })
    .map_err(|error| error.to_string())?;
    let answer = post(&mut sender, pki::LEADER_NAME, ENROLL_PATH, body).await?;
    let enrolled: Enrolled =
        serde_json::from_slice(&answer).map_err(|error| format!("malformed answer: {error}"))?;
    if enrolled.node != own_node {
        return Err(format!(
            "the leader enrolled this pod for node {}, but this process runs with --node-name {own_node}",
            enrolled.node
        ));
    }
    if enrolled.term != advert.term {
        return Err(format!(
            "the leader answered for term {}, the Lease says {}",
            enrolled.term, advert.term
        ));
    }
    let config = pki::instance_server_config(&advert.ca_pem, &enrolled.identity)
        .map_err(|error| format!("the issued certificate is unusable: {error}"))?;
    Ok(Role::Instance {
        config,
        term: enrolled.term,
        ca_pem: advert.ca_pem.as_str().into(),
        enrolled_at: Instant::now(),
    })
}

/// The wait before the next look at the Lease after `failures` failed enrolments in a
/// row: `retry` when none failed (the re-enrolment check), else 100 ms doubling, at most
/// `retry`.
fn enrol_retry(failures: u32, retry: Duration) -> Duration {
    if failures == 0 {
        return retry;
    }
    Duration::from_millis(100)
        .saturating_mul(1 << failures.min(16).saturating_sub(1))
        .min(retry)
}

/// Follows the Lease (as the election reads it, published to `leases`): on each new
/// term, stops serving the old one at once and enrols with the new leader; enrols again
/// at half a certificate's validity. `enrolled` is 1 while it holds a certificate of the
/// current term, 0 before its first enrolment and from a new term until it enrolled
/// again. Runs until `stop`.
#[allow(clippy::too_many_arguments)]
pub async fn follow(
    channel: Arc<Channel>,
    own_node: String,
    enrolled: IntGauge,
    mut leases: watch::Receiver<Option<Lease>>,
    own_identity: String,
    token_file: PathBuf,
    retry: Duration,
    stop: CancellationToken,
) {
    // Failed enrolments in a row: a leader just elected may not be serving yet, so the
    // first retries come fast, then slow to `retry`.
    let mut failures: u32 = 0;
    loop {
        let advert = leases
            .borrow_and_update()
            .as_ref()
            .and_then(|lease| Advert::of(lease, &own_identity));
        if let Some(advert) = advert {
            let role = channel.role.borrow().clone();
            let current = role.enrolment() == Some((advert.term, advert.ca_pem.as_str()));
            let due = match &role {
                Role::Leader { .. } => false,
                Role::Waiting => true,
                Role::Instance { enrolled_at, .. } => {
                    !current || enrolled_at.elapsed() > pki::NODE_CERT_VALIDITY / 2
                }
            };
            if due {
                if role.enrolment().is_some() && !current {
                    // A new leader: the old term's calls are refused from now on.
                    channel.role.send_replace(Role::Waiting);
                    enrolled.set(0);
                }
                match enroll(&advert, &token_file, &own_node).await {
                    Ok(role) => {
                        info!(leader = %advert.holder, term = advert.term, node = %own_node, "node channel: enrolled with the leader");
                        channel.role.send_replace(role);
                        enrolled.set(1);
                        failures = 0;
                    }
                    Err(error) => {
                        warn!(leader = %advert.holder, term = advert.term, %error, "node channel: cannot enrol with the leader; retrying");
                        failures += 1;
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = leases.changed() => {}
            _ = tokio::time::sleep(enrol_retry(failures, retry)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::enrol_retry;

    #[test]
    fn failed_enrolments_retry_fast_then_at_the_retry_period() {
        let retry = Duration::from_secs(2);
        let waits: Vec<u128> = (0..8)
            .map(|failures| enrol_retry(failures, retry).as_millis())
            .collect();
        assert_eq!(waits, [2000, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(enrol_retry(u32::MAX, retry), retry);
    }
}
