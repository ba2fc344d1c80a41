//! The PVs kube-controller-manager's binder could give a claim instead of a new volume.
//!
//! The binder announces a claim to its provisioner (the `storage-provisioner`
//! annotation) only after it found no existing PV for it. Provisioning before that
//! announcement (`--provision-before-binder`) saves the binder's claim update and Event
//! and lets it bind at once, but must never take a claim away from a PV that was made
//! for it: an Available PV of the claim's class nobody claimed (static provisioning),
//! or a PV whose `claimRef` names the claim (a PV reserved for it). This index knows,
//! from the PV watch, which classes have such unclaimed PVs and which claims have such
//! reserved PVs; a claim of either waits for the binder, as the Go library does for
//! every claim. Kept up to date from each watch event (O(1) each), so asking costs
//! nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher;

use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide;
use wasm_provisioner_rules::names;

/// What a PV offers the binder.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Offer {
    /// Available to any claim of this class.
    Class(String),
    /// Reserved for the claim `namespace/name`.
    Claim(String),
}

/// Whether `pv` is one the binder may bind a new claim to instead of provisioning:
/// not bound, released or failed, not being deleted, and either unclaimed (offered to
/// its class) or naming a claim whose volume it is not as we would name it (reserved).
/// A PV named as ours for its claimRef's UID is a provisioned volume, not an offer.
fn offer(pv: &PersistentVolume) -> Option<Offer> {
    if !decide::pv_awaits_binder(pv) {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    match &spec.claim_ref {
        None => Some(Offer::Class(
            spec.storage_class_name.clone().unwrap_or_default(),
        )),
        Some(claim) => {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            let ours = claim
                .uid
                .as_deref()
                .is_some_and(|uid| name.strip_prefix(names::PV_NAME_PREFIX) == Some(uid));
            (!ours).then(|| {
                Offer::Claim(format!(
                    "{}/{}",
                    claim.namespace.as_deref().unwrap_or_default(),
                    claim.name.as_deref().unwrap_or_default()
                ))
            })
        }
    }
}

#[derive(Default)]
struct Index {
    /// PV name → what it offers.
    offers: HashMap<String, Offer>,
    /// How many PVs offer each thing.
    counts: HashMap<Offer, usize>,
    /// A relist in progress: its PVs so far, swapped in at its end.
    relist: Option<HashMap<String, Offer>>,
}

impl Index {
    fn set(&mut self, name: String, offer: Option<Offer>) {
        if let Some(old) = self.offers.remove(&name)
            && let Some(count) = self.counts.get_mut(&old)
        {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&old);
            }
        }
        if let Some(offer) = offer {
            *self.counts.entry(offer.clone()).or_default() += 1;
            self.offers.insert(name, offer);
        }
    }
}

/// The index; fed by the PV watch ([`StaticVolumes::observe`]).
#[derive(Default)]
pub struct StaticVolumes {
    index: Mutex<Index>,
}

impl StaticVolumes {
    /// Applies one event of the PV watch (as the reflector applies it to the cache).
    pub fn observe(&self, event: &watcher::Event<PersistentVolume>) {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            watcher::Event::Apply(pv) => {
                index.set(pv.metadata.name.clone().unwrap_or_default(), offer(pv))
            }
            watcher::Event::Delete(pv) => {
                index.set(pv.metadata.name.clone().unwrap_or_default(), None)
            }
            watcher::Event::Init => index.relist = Some(HashMap::new()),
            watcher::Event::InitApply(pv) => {
                if let (Some(relist), Some(offer)) = (index.relist.as_mut(), offer(pv)) {
                    relist.insert(pv.metadata.name.clone().unwrap_or_default(), offer);
                }
            }
            watcher::Event::InitDone => {
                let offers = index.relist.take().unwrap_or_default();
                index.counts.clear();
                index.offers.clear();
                for (name, offer) in offers {
                    index.set(name, Some(offer));
                }
            }
        }
    }

    /// Whether the binder may give `claim` (of class `class`) an existing PV: one of its
    /// class nobody claimed, or one reserved for it.
    pub fn may_bind(&self, claim: &PersistentVolumeClaim, class: &str) -> bool {
        let index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.counts.contains_key(&Offer::Class(class.to_owned()))
            || index
                .counts
                .contains_key(&Offer::Claim(ClaimView(claim).key()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pv(name: &str, class: &str, claim: Option<(&str, &str)>, phase: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                storage_class_name: Some(class.into()),
                claim_ref: claim.map(|(name, uid)| ObjectReference {
                    namespace: Some("ns".into()),
                    name: Some(name.into()),
                    uid: (!uid.is_empty()).then(|| uid.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn claim(name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn an_unclaimed_available_pv_of_the_class_is_offered_until_it_is_bound_or_gone() {
        let index = StaticVolumes::default();
        let a = claim("a");
        assert!(!index.may_bind(&a, "fast"), "no PV, nothing offered");
        index.observe(&watcher::Event::Apply(pv(
            "static-1",
            "fast",
            None,
            "Available",
        )));
        assert!(index.may_bind(&a, "fast"));
        assert!(!index.may_bind(&a, "slow"), "only to its own class");
        index.observe(&watcher::Event::Apply(pv(
            "static-2",
            "fast",
            None,
            "Available",
        )));
        index.observe(&watcher::Event::Apply(pv(
            "static-1",
            "fast",
            Some(("b", "uid-b")),
            "Bound",
        )));
        assert!(index.may_bind(&a, "fast"), "static-2 is still offered");
        index.observe(&watcher::Event::Delete(pv(
            "static-2",
            "fast",
            None,
            "Available",
        )));
        assert!(!index.may_bind(&a, "fast"), "both taken or gone");
    }

    #[test]
    fn a_pv_reserved_for_a_claim_is_offered_to_that_claim_only() {
        let index = StaticVolumes::default();
        index.observe(&watcher::Event::Apply(pv(
            "reserved",
            "other",
            Some(("a", "")),
            "Available",
        )));
        assert!(index.may_bind(&claim("a"), "fast"));
        assert!(!index.may_bind(&claim("b"), "fast"));
    }

    #[test]
    fn our_own_provisioned_pv_and_deleting_pvs_are_not_offers() {
        let index = StaticVolumes::default();
        index.observe(&watcher::Event::Apply(pv(
            "pvc-uid-a",
            "fast",
            Some(("a", "uid-a")),
            "Pending",
        )));
        let mut deleting = pv("static", "fast", None, "Available");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        index.observe(&watcher::Event::Apply(deleting));
        index.observe(&watcher::Event::Apply(pv(
            "released", "fast", None, "Released",
        )));
        assert!(!index.may_bind(&claim("a"), "fast"));
        assert!(!index.may_bind(&claim("b"), "fast"));
    }

    #[test]
    fn a_relist_replaces_what_was_known() {
        let index = StaticVolumes::default();
        index.observe(&watcher::Event::Apply(pv(
            "gone",
            "fast",
            None,
            "Available",
        )));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(pv(
            "new",
            "slow",
            None,
            "Available",
        )));
        assert!(
            index.may_bind(&claim("a"), "fast"),
            "the old view serves until the relist is complete"
        );
        index.observe(&watcher::Event::InitDone);
        assert!(!index.may_bind(&claim("a"), "fast"));
        assert!(index.may_bind(&claim("a"), "slow"));
    }
}
