//! Whether a provisioning storm is on: a claim is being provisioned (or was a moment
//! ago), or a PV this host provisioned is not Bound yet (kube-controller-manager's
//! binder still has it to do). Normal Events wait while it is on ([`super::events`]):
//! in a storm every Event the API server stores is a write it does not serve for the PV
//! creates and the binds the claims wait for (docs/design.md, "Normal Events wait during a storm"), and an Event tells a person
//! what happened, which it still does a few seconds later. Warnings never wait.
//!
//! The PVs are followed from the PV watch (each event O(1)), so asking costs nothing.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher;

use wasm_provisioner_rules::decide;

/// How long the storm stays on after the last provision ended: the PV it created is on
/// its way to the watch.
const AFTERGLOW: Duration = Duration::from_millis(500);

pub struct Storm {
    provisioner_name: String,
    /// Provisions in flight.
    provisions: AtomicUsize,
    /// When the last provision ended, in milliseconds since `epoch` (0: never).
    last_ended_ms: AtomicU64,
    epoch: Instant,
    unbound: Mutex<Unbound>,
}

/// The names of our PVs that the binder has not bound yet.
#[derive(Default)]
struct Unbound {
    names: HashSet<String>,
    /// A relist in progress: its PVs so far, swapped in at its end.
    relist: Option<HashSet<String>>,
}

/// Held while a claim is provisioned ([`Storm::provisioning`]).
pub struct Provisioning<'a>(&'a Storm);

impl Drop for Provisioning<'_> {
    fn drop(&mut self) {
        let storm = self.0;
        let ended = storm.epoch.elapsed().as_millis() as u64;
        storm.last_ended_ms.store(ended.max(1), Ordering::Relaxed);
        storm.provisions.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Storm {
    /// For the PVs provisioned by `provisioner_name`.
    pub fn new(provisioner_name: &str) -> Self {
        Self {
            provisioner_name: provisioner_name.to_owned(),
            provisions: AtomicUsize::new(0),
            last_ended_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            unbound: Mutex::default(),
        }
    }

    /// Marks a claim's provision as in flight until the guard is dropped.
    pub fn provisioning(&self) -> Provisioning<'_> {
        self.provisions.fetch_add(1, Ordering::Relaxed);
        Provisioning(self)
    }

    /// Whether a claim is being provisioned, one was within [`AFTERGLOW`], or one of our
    /// PVs waits for the binder.
    pub fn is_on(&self) -> bool {
        if self.provisions.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let ended = self.last_ended_ms.load(Ordering::Relaxed);
        if ended > 0 {
            let now = self.epoch.elapsed().as_millis() as u64;
            if now.saturating_sub(ended) < AFTERGLOW.as_millis() as u64 {
                return true;
            }
        }
        !self.lock().names.is_empty()
    }

    /// Applies one event of the PV watch.
    pub fn observe(&self, event: &watcher::Event<PersistentVolume>) {
        let mut unbound = self.lock();
        match event {
            watcher::Event::Apply(pv) => {
                let name = pv.metadata.name.clone().unwrap_or_default();
                if self.awaits_bind(pv) {
                    unbound.names.insert(name);
                } else {
                    unbound.names.remove(&name);
                }
            }
            watcher::Event::Delete(pv) => {
                unbound
                    .names
                    .remove(pv.metadata.name.as_deref().unwrap_or_default());
            }
            watcher::Event::Init => unbound.relist = Some(HashSet::new()),
            watcher::Event::InitApply(pv) => {
                if self.awaits_bind(pv)
                    && let Some(relist) = unbound.relist.as_mut()
                {
                    relist.insert(pv.metadata.name.clone().unwrap_or_default());
                }
            }
            watcher::Event::InitDone => {
                unbound.names = unbound.relist.take().unwrap_or_default();
            }
        }
    }

    /// Ours (provisioned-by this provisioner) and still the binder's to bind.
    fn awaits_bind(&self, pv: &PersistentVolume) -> bool {
        decide::provisioned_by(pv, &self.provisioner_name) && decide::pv_awaits_binder(pv)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Unbound> {
        self.unbound.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use wasm_provisioner_rules::names;

    fn pv(name: &str, by: &str, phase: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some([(names::ANN_PROVISIONED_BY.to_string(), by.to_string())].into()),
                ..Default::default()
            },
            spec: None,
            status: phase.map(|phase| PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn our_pv_keeps_the_storm_on_until_it_is_bound() {
        let storm = Storm::new("us");
        assert!(!storm.is_on(), "a quiet host");
        storm.observe(&watcher::Event::Apply(pv("pvc-1", "us", None)));
        assert!(storm.is_on(), "a PV just created, no phase yet");
        storm.observe(&watcher::Event::Apply(pv("pvc-1", "us", Some("Available"))));
        assert!(storm.is_on(), "Available: the binder has yet to bind it");
        storm.observe(&watcher::Event::Apply(pv("pvc-1", "us", Some("Bound"))));
        assert!(!storm.is_on(), "Bound: the storm is over");
    }

    #[test]
    fn other_provisioners_and_deleted_pvs_do_not_count() {
        let storm = Storm::new("us");
        storm.observe(&watcher::Event::Apply(pv(
            "pvc-2",
            "them",
            Some("Available"),
        )));
        assert!(!storm.is_on(), "another provisioner's PV");
        let mut going = pv("pvc-3", "us", Some("Available"));
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        storm.observe(&watcher::Event::Apply(going));
        assert!(!storm.is_on(), "a PV being deleted");
        storm.observe(&watcher::Event::Apply(pv("pvc-4", "us", Some("Available"))));
        storm.observe(&watcher::Event::Delete(pv(
            "pvc-4",
            "us",
            Some("Available"),
        )));
        assert!(!storm.is_on(), "a PV gone");
    }

    #[test]
    fn a_relist_replaces_what_was_known() {
        let storm = Storm::new("us");
        storm.observe(&watcher::Event::Apply(pv(
            "pvc-gone",
            "us",
            Some("Available"),
        )));
        storm.observe(&watcher::Event::Init);
        storm.observe(&watcher::Event::InitApply(pv("pvc-5", "us", Some("Bound"))));
        storm.observe(&watcher::Event::InitDone);
        assert!(!storm.is_on(), "the relist had no unbound PV of ours");
        storm.observe(&watcher::Event::Init);
        storm.observe(&watcher::Event::InitApply(pv(
            "pvc-6",
            "us",
            Some("Available"),
        )));
        assert!(!storm.is_on(), "a relist counts only once it is done");
        storm.observe(&watcher::Event::InitDone);
        assert!(storm.is_on());
    }

    #[test]
    fn a_provision_in_flight_and_just_ended_keep_it_on() {
        let storm = Storm::new("us");
        let guard = storm.provisioning();
        assert!(storm.is_on(), "in flight");
        drop(guard);
        assert!(storm.is_on(), "just ended: its PV is on its way");
        std::thread::sleep(AFTERGLOW + Duration::from_millis(50));
        assert!(!storm.is_on(), "quiet since");
    }
}
