//! A guest call refused because the host's instance pool was full.
//!
//! Every module reserves its share of the pool at load (`pool`), so its calls
//! always find their slots; a call that does not is a misconfiguration the admin must
//! hear of, unlike a module at its own `maxConcurrentCalls` (retried silently). The
//! call did not start: not a failed attempt, no back-off; a Warning Event on the claim
//! or PV naming the module and the fix (repeats aggregate into one series), and a retry
//! as soon as for busy.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::warn;

use super::events::EventSink;
use super::shares;
use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::names;
use wasm_provisioner_runtime::CallError;

/// A claim's call found the pool full.
pub(super) async fn claim(
    events: &EventSink,
    claim: &PersistentVolumeClaim,
    error: &CallError,
) -> Action {
    warn!(claim = %ClaimView(claim).key(), "{error}; retrying in {:?}", shares::RECHECK);
    events
        .claim_warning(claim, names::REASON_PROVISIONING_FAILED, error.to_string())
        .await;
    Action::requeue(shares::RECHECK)
}

/// A PV's delete call found the pool full.
pub(super) async fn volume(events: &EventSink, pv: &PersistentVolume, error: &CallError) -> Action {
    warn!(volume = %pv.name_any(), "{error}; retrying in {:?}", shares::RECHECK);
    events
        .volume_warning(pv, names::REASON_VOLUME_FAILED_DELETE, error.to_string())
        .await;
    Action::requeue(shares::RECHECK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::events::Reporter;
    use tokio::sync::mpsc;

    use crate::controller::storm::Storm;
    use wasm_provisioner_runtime::{Call, CallTarget};

    /// An API server that stores every Event it is sent into the returned channel.
    fn recording_sink() -> (EventSink, mpsc::UnboundedReceiver<K8sEvent>) {
        let (client, received) = crate::controller::events::tests::recording_client();
        let reporter = Reporter {
            controller: "us".into(),
            instance: Some("us-1".into()),
        };
        let sink = EventSink::new(
            client,
            reporter,
            Arc::new(Storm::new("us")),
            Duration::from_secs(60),
        );
        (sink, received)
    }

    fn full(call: Call) -> CallError {
        CallError::InstancesFull {
            target: CallTarget {
                module: "hostpath".into(),
                version: "1a2b3c4d5e6f".into(),
                call,
            },
            cause: "maximum concurrent limit of 512 for tables reached".into(),
        }
    }

    fn assert_names_module_and_fix(event: &K8sEvent, reason: &str) {
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some(reason));
        let note = event.note.as_deref().unwrap_or_default();
        for part in [
            "module hostpath",
            "instance pool is full",
            "--max-guest-instances",
            "modules.hostpath.limits.maxConcurrentCalls",
        ] {
            assert!(note.contains(part), "{part:?} missing in: {note}");
        }
    }

    #[tokio::test]
    async fn a_claim_whose_call_found_the_pool_full_gets_a_warning_and_a_quick_retry() {
        let (sink, mut written) = recording_sink();
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("default".into()),
                uid: Some("uid-data".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        let action = claim(&sink, &pvc, &full(Call::Provision)).await;
        assert_eq!(action, Action::requeue(shares::RECHECK));
        let event = tokio::time::timeout(Duration::from_secs(5), written.recv())
            .await
            .expect("a Warning is written at once")
            .expect("an Event");
        assert_names_module_and_fix(&event, names::REASON_PROVISIONING_FAILED);
        assert_eq!(
            event.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("data")
        );
    }

    #[tokio::test]
    async fn a_volume_whose_delete_found_the_pool_full_gets_a_warning_and_a_quick_retry() {
        let (sink, mut written) = recording_sink();
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                uid: Some("uid-pvc-1".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        };
        let action = volume(&sink, &pv, &full(Call::Delete)).await;
        assert_eq!(action, Action::requeue(shares::RECHECK));
        let event = tokio::time::timeout(Duration::from_secs(5), written.recv())
            .await
            .expect("a Warning is written at once")
            .expect("an Event");
        assert_names_module_and_fix(&event, names::REASON_VOLUME_FAILED_DELETE);
    }
}
