//! One participant's view of the Lease, with client-go's `tryAcquireOrRenew`: take the
//! Lease when it is free or its record has not changed for its `leaseDurationSeconds`
//! (timed on this process's own clock, from when it first saw that record, so clock
//! skew between nodes does not matter); renew it when it is ours; give it up by
//! clearing the holder.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What one try made of the Lease.
#[derive(Debug, PartialEq)]
pub enum Attempt {
    /// This process holds the Lease now (taken or renewed).
    Held,
    /// Another process holds a Lease that has not expired.
    HeldBy(String),
    /// The Lease changed under this try (409); try again.
    Conflict,
}

/// The participant: its identity and the last record it saw, with when it saw it.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The Lease as last read or written (its resourceVersion makes writes conditional).
    last: Option<Lease>,
    /// When this process first saw the current record (client-go's observedTime).
    observed_at: Instant,
    /// Annotations this process writes on the Lease while it holds it (node-local mode:
    /// how instances reach and trust the leader).
    annotations: BTreeMap<String, String>,
    /// Where every Lease read or written is published (node-local mode's instances
    /// follow the leader through it).
    observed: Option<Arc<watch::Sender<Option<Lease>>>>,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            last: None,
            observed_at: Instant::now(),
            annotations: BTreeMap::new(),
            observed: None,
        }
    }

    /// Writes `annotations` on the Lease whenever this process takes or renews it, and
    /// publishes every Lease seen to `observed`.
    pub fn advertising(
        mut self,
        annotations: BTreeMap<String, String>,
        observed: Option<Arc<watch::Sender<Option<Lease>>>>,
    ) -> Self {
        self.annotations = annotations;
        self.observed = observed;
        self
    }

    /// The Lease's transition count as last seen: the term of its holder.
    pub fn term(&self) -> i32 {
        self.last
            .as_ref()
            .and_then(|lease| lease.spec.as_ref())
            .and_then(|spec| spec.lease_transitions)
            .unwrap_or(0)
    }

    /// Takes or renews the Lease. A holder renews with a conditional write of the record
    /// it wrote last (one request); after a conflict, or as a candidate, it reads first.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = Instant::now();
        if let Some(last) = self.last.clone()
            && holder(&last) == Some(self.identity.as_str())
        {
            match self.write(last, now).await? {
                Attempt::Conflict => {}
                attempt => return Ok(attempt),
            }
        }
        let Some(current) = self.api.get_opt(&self.name).await? else {
            return self.create(now).await;
        };
        self.observe(current.clone(), now);
        if let Some(other) = holder(&current)
            && other != self.identity
            && !expired(&current, self.observed_at, now)
        {
            return Ok(Attempt::HeldBy(other.to_string()));
        }
        self.write(current, now).await
    }

    /// Gives the Lease up (holder cleared, duration 1 s) so a standby takes it at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        for _ in 0..3 {
            let current = match self.last.take() {
                Some(last) => last,
                None => match self.api.get_opt(&self.name).await? {
                    Some(current) => current,
                    None => return Ok(()),
                },
            };
            if holder(&current) != Some(self.identity.as_str()) {
                return Ok(());
            }
            let mut released = current.clone();
            let spec = released.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            match self
                .api
                .replace(&self.name, &PostParams::default(), &released)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    async fn create(&mut self, now: Instant) -> Result<Attempt, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(taken(None, &self.identity, self.duration)),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(stored) => {
                self.observe(stored, now);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
            Err(error) => Err(error),
        }
    }

    /// Writes the record with this process as holder, conditional on `current`'s
    /// resourceVersion.
    async fn write(&mut self, current: Lease, now: Instant) -> Result<Attempt, kube::Error> {
        let mut next = current.clone();
        next.spec = Some(taken(current.spec.as_ref(), &self.identity, self.duration));
        if !self.annotations.is_empty() {
            next.annotations_mut().extend(self.annotations.clone());
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(stored) => {
                self.observe(stored, now);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.last = None;
                Ok(Attempt::Conflict)
            }
            Err(error) => Err(error),
        }
    }

    /// Remembers `lease`; a changed record restarts the expiry clock.
    fn observe(&mut self, lease: Lease, now: Instant) {
        let changed = self.last.as_ref().is_none_or(|last| {
            last.spec != lease.spec || last.resource_version() != lease.resource_version()
        });
        if changed {
            self.observed_at = now;
            if let Some(observed) = &self.observed {
                observed.send_replace(Some(lease.clone()));
            }
        }
        self.last = Some(lease);
    }
}

/// The Lease's holder, if any.
fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .filter(|holder| !holder.is_empty())
}

/// Whether a record first seen at `observed_at` has gone unrenewed for its duration.
fn expired(lease: &Lease, observed_at: Instant, now: Instant) -> bool {
    let seconds = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.lease_duration_seconds)
        .unwrap_or(0)
        .max(0);
    now >= observed_at + Duration::from_secs(seconds as u64)
}

/// The record with `identity` as holder, renewed now: a renewal keeps the acquire time
/// and transition count, a take-over sets the acquire time and counts a transition —
/// also of a released Lease (no holder), as client-go does: the count is the term
/// node-local mode's calls carry, and each leader's term must be its own.
fn taken(previous: Option<&LeaseSpec>, identity: &str, duration: Duration) -> LeaseSpec {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let previous_holder = previous.and_then(|spec| spec.holder_identity.as_deref());
    let transitions = previous
        .and_then(|spec| spec.lease_transitions)
        .unwrap_or(0);
    let renewal = previous_holder == Some(identity);
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(duration.as_secs().max(1) as i32),
        acquire_time: match previous {
            Some(spec) if renewal => spec.acquire_time.clone(),
            _ => Some(now.clone()),
        },
        renew_time: Some(now),
        lease_transitions: Some(match previous {
            Some(_) if !renewal => transitions + 1,
            _ => transitions,
        }),
        ..LeaseSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, duration: i32, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(duration),
                lease_transitions: Some(transitions),
                acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_renewal_keeps_the_acquire_time_and_transitions() {
        let previous = lease(Some("me"), 15, 3);
        let spec = taken(previous.spec.as_ref(), "me", Duration::from_secs(15));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, previous.spec.unwrap().acquire_time);
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    }

    #[test]
    fn a_take_over_counts_a_transition() {
        let previous = lease(Some("other"), 15, 3);
        let spec = taken(previous.spec.as_ref(), "me", Duration::from_secs(20));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_ne!(spec.acquire_time, previous.spec.unwrap().acquire_time);
        assert_eq!(spec.lease_duration_seconds, Some(20));
        // A released Lease (no holder) is a new term too: each leader's is its own.
        let free = lease(None, 1, 4);
        assert_eq!(
            taken(free.spec.as_ref(), "me", Duration::from_secs(15)).lease_transitions,
            Some(5)
        );
        // The first holder of a new Lease starts at 0.
        assert_eq!(
            taken(None, "me", Duration::from_secs(15)).lease_transitions,
            Some(0)
        );
    }

    #[test]
    fn expiry_is_timed_from_when_the_record_was_seen() {
        let seen = Instant::now();
        let held = lease(Some("other"), 15, 0);
        assert!(!expired(&held, seen, seen + Duration::from_secs(14)));
        assert!(expired(&held, seen, seen + Duration::from_secs(15)));
        assert_eq!(
            holder(&lease(Some(""), 15, 0)),
            None,
            "an empty holder is free"
        );
    }
}
