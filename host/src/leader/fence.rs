//! The fence: a handle the controllers carry that says whether this process still
//! leads, with margin. Every backend-changing step (a guest provision or delete call, a
//! PV create or delete, a finalizer removal) runs through it, so a leader that could not
//! renew its Lease in time stops before another process may take over.
//!
//! The arithmetic is client-go's. A renewal that started at `t` and succeeded keeps this
//! process the leader until `t + renew-deadline`. Another process takes the Lease only
//! once it has seen the same record unchanged for `lease-duration`, and it can only have
//! seen the renewed record after `t`; so it cannot lead before `t + lease-duration`. The
//! difference (`lease-duration - renew-deadline`, 5 s by default) is the margin that
//! covers a request already on the wire when the fence closes.

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;

/// Why a step was not done.
#[derive(Debug, thiserror::Error)]
#[error(
    "{step}: not done, this process no longer leads (its Lease was not renewed within the \
     renew deadline); the next leader will do it"
)]
pub struct NotLeader {
    pub step: &'static str,
}

/// Whether this process may change the backend and the API now.
#[derive(Clone, Debug)]
pub struct Leadership {
    /// `None` without leader election (a single replica always leads). Otherwise the
    /// instant the leadership ends unless renewed; `None` inside once it is lost.
    lease: Option<watch::Receiver<Option<Instant>>>,
    /// The Lease's transition count when this process took it: its term. Node-local
    /// mode carries it in every call to a node's instance, which refuses an older term.
    term: i32,
}

impl Leadership {
    /// A single replica (no election): always the leader.
    pub fn unelected() -> Self {
        Self {
            lease: None,
            term: 0,
        }
    }

    /// Leadership that lasts until the instant in `valid_until` (moved by each renewal,
    /// `None` once lost).
    pub fn elected(valid_until: watch::Receiver<Option<Instant>>, term: i32) -> Self {
        Self {
            lease: Some(valid_until),
            term,
        }
    }

    /// The term this process leads in (the Lease's transitions when it took it; 0
    /// without election).
    pub fn term(&self) -> i32 {
        self.term
    }

    /// Until when this process leads, if it still does (`Some(None)`: for ever).
    fn valid_until(&self) -> Option<Option<Instant>> {
        match &self.lease {
            None => Some(None),
            Some(lease) => match *lease.borrow() {
                Some(until) if Instant::now() < until => Some(Some(until)),
                _ => None,
            },
        }
    }

    /// The fencing check before a step that changes something.
    pub fn check(&self, step: &'static str) -> Result<(), NotLeader> {
        match self.valid_until() {
            Some(_) => Ok(()),
            None => Err(NotLeader { step }),
        }
    }

    /// Runs `step` while this process leads; it is dropped (cancelled) the moment the
    /// leadership ends. A guest call dropped this way stops at its next epoch tick.
    pub async fn fenced<F: Future>(
        &self,
        step: &'static str,
        future: F,
    ) -> Result<F::Output, NotLeader> {
        let Some(lease) = &self.lease else {
            return Ok(future.await);
        };
        self.check(step)?;
        let mut lease = lease.clone();
        let mut future = std::pin::pin!(future);
        loop {
            let until = match *lease.borrow_and_update() {
                Some(until) if Instant::now() < until => until,
                _ => return Err(NotLeader { step }),
            };
            tokio::select! {
                biased;
                output = &mut future => return Ok(output),
                changed = lease.changed() => {
                    if changed.is_err() {
                        return Err(NotLeader { step });
                    }
                }
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Real time, in short spans (no paused clock: that needs tokio's test-util feature,
    //! which would rebuild every dependency of tokio for the tests).
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test]
    async fn unelected_always_leads() {
        let leadership = Leadership::unelected();
        assert!(leadership.check("x").is_ok());
        assert_eq!(leadership.fenced("x", async { 7 }).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_step_is_cancelled_when_the_lease_runs_out() {
        let (_tx, rx) = watch::channel(Some(Instant::now() + ms(200)));
        let leadership = Leadership::elected(rx, 1);
        let started = Instant::now();
        let error = leadership
            .fenced(
                "guest provision",
                tokio::time::sleep(Duration::from_secs(30)),
            )
            .await
            .unwrap_err();
        assert_eq!(error.step, "guest provision");
        let took = started.elapsed();
        assert!(took >= ms(200) && took < ms(2000), "{took:?}");
        assert!(leadership.check("pv create").is_err(), "and stays closed");
    }

    #[tokio::test]
    async fn renewals_keep_a_long_step_going() {
        let (tx, rx) = watch::channel(Some(Instant::now() + ms(200)));
        let leadership = Leadership::elected(rx, 1);
        tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(ms(100)).await;
                let _ = tx.send(Some(Instant::now() + ms(200)));
            }
        });
        let done = leadership
            .fenced("guest delete", async {
                tokio::time::sleep(ms(500)).await;
                "done"
            })
            .await;
        assert_eq!(done.unwrap(), "done");
    }

    #[tokio::test]
    async fn a_lost_lease_stops_steps_at_once() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(30)));
        let leadership = Leadership::elected(rx, 1);
        tokio::spawn(async move {
            tokio::time::sleep(ms(100)).await;
            let _ = tx.send(None);
        });
        let started = Instant::now();
        let result = leadership
            .fenced("pv delete", tokio::time::sleep(Duration::from_secs(20)))
            .await;
        assert!(result.is_err());
        let took = started.elapsed();
        assert!(took >= ms(100) && took < ms(2000), "{took:?}");
    }
}
