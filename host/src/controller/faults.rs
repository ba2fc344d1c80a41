//! Crash points for the chaos tests (hidden flags `--fault-exit-after` and
//! `--fault-exit-probability`): right after a step that changes something, the process
//! exits with status 137 as a `kill -9` would, with the given probability. The steps
//! are every write of a provision, a delete or an expansion, so the tests can check that a crash at
//! any of them leaves no orphan and no duplicate. Never use them in production.

use tracing::warn;

/// A step after which the process may be made to crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    /// The claim's provisioning intent was stored in the journal.
    JournalRecord,
    /// The claim's provisioning finalizer was added.
    FinalizerAdd,
    /// The guest's provision call answered a volume.
    GuestProvision,
    /// The PV was created.
    PvCreate,
    /// The claim's provisioning finalizer was removed.
    FinalizerRemove,
    /// The guest's delete call deleted the backend volume.
    GuestDelete,
    /// The PV was deleted.
    PvDelete,
    /// A claim was marked as being expanded.
    ExpansionMark,
    /// The guest's expand call answered a size.
    GuestExpand,
    /// An expanded volume's PV capacity was written (its claim's status not yet).
    PvCapacity,
}

/// Which steps crash the process, and how likely.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub steps: Vec<Step>,
    /// Chance of crashing at each listed step, 0..=1.
    pub probability: f64,
}

impl Faults {
    /// Exits the process (status 137) if `step` is a crash point and the dice say so.
    pub fn after(&self, step: Step, object: &str) {
        if !self.steps.contains(&step) || random_unit() >= self.probability {
            return;
        }
        warn!(?step, object, "fault injection: exiting as kill -9 would");
        std::process::exit(137);
    }
}

/// A random number in [0, 1).
fn random_unit() -> f64 {
    // The high half: the low one starts with the variant bits (always `10`).
    let bits = (uuid::Uuid::new_v4().as_u128() >> 64) as u64;
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_numbers_are_in_the_unit_interval_and_spread() {
        let samples: Vec<f64> = (0..1000).map(|_| random_unit()).collect();
        assert!(samples.iter().all(|x| (0.0..1.0).contains(x)));
        let low = samples.iter().filter(|x| **x < 0.5).count();
        assert!((350..650).contains(&low), "{low} of 1000 below 0.5");
    }

    #[test]
    fn unlisted_steps_never_crash() {
        let faults = Faults {
            steps: vec![Step::PvCreate],
            probability: 1.0,
        };
        faults.after(Step::GuestDelete, "x");
        Faults::default().after(Step::PvCreate, "x");
    }
}
