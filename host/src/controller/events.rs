//! Events on claims and volumes, with upstream's reason strings. Publishing an Event
//! never fails an operation: a refused Event is logged and the work goes on.
//!
//! Nor does it hold the operation up: an Event is written by a task of its own, so a
//! worker goes on with the claim (and the next one) while the Event is on its way; the
//! two Events of a provisioned volume are off its critical path (issue 11.3). At most
//! [`MAX_IN_FLIGHT`] Events are on their way at once; past that, publishing waits for
//! one to finish (back-pressure, not an unbounded queue, when the API server is slow).
//! On shutdown, [`EventSink::flush`] lets the last ones finish.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::Semaphore;
use tracing::warn;

/// Events API limit on a note.
const MAX_NOTE_BYTES: usize = 1024;

/// Events being written at once.
const MAX_IN_FLIGHT: u32 = 256;

pub struct EventSink {
    recorder: Recorder,
    in_flight: Arc<Semaphore>,
}

impl EventSink {
    pub fn new(recorder: Recorder) -> Self {
        Self {
            recorder,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT as usize)),
        }
    }

    /// Waits (at most `timeout`) until every Event on its way is written.
    pub async fn flush(&self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.in_flight.acquire_many(MAX_IN_FLIGHT))
            .await
            .is_err()
        {
            warn!("some Events were still being written at shutdown");
        }
    }

    /// A Normal Event on a claim.
    pub async fn claim_normal(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Normal,
            reason,
            "Provision",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim.
    pub async fn claim_warning(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Warning,
            reason,
            "Provision",
            note,
        )
        .await;
    }

    /// A Warning Event on a claim for giving up on it. Its own action keeps it apart from
    /// the attempts' ProvisioningFailed series (Events aggregate by reason and action,
    /// and a series keeps its first note).
    pub async fn claim_gave_up(&self, claim: &PersistentVolumeClaim, reason: &str, note: String) {
        self.publish(
            claim.object_ref(&()),
            EventType::Warning,
            reason,
            "GiveUp",
            note,
        )
        .await;
    }

    /// A Warning Event on a volume for giving up on its deletion.
    pub async fn volume_gave_up(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Warning,
            reason,
            "GiveUp",
            note,
        )
        .await;
    }

    /// A Normal Event on a volume (lands in namespace `default`: PVs are cluster-scoped).
    pub async fn volume_normal(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Normal,
            reason,
            "Delete",
            note,
        )
        .await;
    }

    /// A Warning Event on a volume (lands in namespace `default`: PVs are cluster-scoped).
    pub async fn volume_warning(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(
            volume.object_ref(&()),
            EventType::Warning,
            reason,
            "Delete",
            note,
        )
        .await;
    }

    async fn publish(
        &self,
        reference: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note)),
            action: action.to_string(),
            secondary: None,
        };
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return;
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                warn!(
                    %error,
                    reason = event.reason,
                    object = reference.name.as_deref().unwrap_or_default(),
                    "could not record an Event; check the host's RBAC on events.k8s.io events"
                );
            }
            drop(permit);
        });
    }
}

fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn notes_fit_the_events_api() {
        assert_eq!(truncate("short".into()), "short");
        let long = "é".repeat(2000);
        let cut = truncate(long);
        assert!(cut.len() <= 1024 && cut.ends_with("..."));
    }
}
