//! The leader's side of enrolment: checks an instance's pod-bound token with a
//! TokenReview and issues a certificate for the node Kubernetes puts that pod on (the
//! instance's side is [`super::enroll`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use super::instances::Instances;
use super::pki::Authority;
use super::wire::Enrolled;

/// The audience of the instances' projected tokens.
pub const AUDIENCE: &str = "wasm-provisioner";

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// How long an enrolment waits for the instances' pod cache to hold the caller's pod: a
/// leader just elected has not listed the pods yet, and a pod just started may reach the
/// watch after its first enrolment. A pod that is not an instance is refused after it.
const POD_CACHE_WAIT: Duration = Duration::from_secs(5);

/// The leader's enrolment of instances.
pub struct Enroller {
    pub client: Client,
    pub authority: Arc<Authority>,
    pub instances: Instances,
    pub namespace: String,
    pub term: i32,
}

impl Enroller {
    /// The instance's pod named `name` in the pods' cache, waiting up to
    /// [`POD_CACHE_WAIT`] for the first list and for the pod to arrive.
    async fn instance_pod(&self, name: &str) -> Option<Arc<k8s_openapi::api::core::v1::Pod>> {
        let wait = async {
            self.instances.ready().await;
            loop {
                if let Some(pod) = self.instances.pod(name) {
                    return pod;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(POD_CACHE_WAIT, wait).await.ok()
    }

    /// Checks `token` and issues its pod's node a certificate; `Err` says why not.
    pub async fn enroll(&self, token: &str) -> Result<Enrolled, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..Default::default()
        };
        let reviewing = std::time::Instant::now();
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| {
                format!(
                    "the TokenReview failed (check the host's RBAC: create tokenreviews): {error}"
                )
            })?;
        tracing::debug!(took = ?reviewing.elapsed(), "node channel: the enrolling token reviewed");
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(format!(
                "the token was not accepted: {}",
                status.error.unwrap_or_else(|| "not authenticated".into())
            ));
        }
        let user = status.user.unwrap_or_default();
        let extra = user.extra.unwrap_or_default();
        let one = |key: &str| extra.get(key).and_then(|values| values.first()).cloned();
        let (Some(pod_name), Some(pod_uid)) = (one(POD_NAME), one(POD_UID)) else {
            return Err(format!(
                "the token is not bound to a pod: use a projected serviceAccountToken with audience {AUDIENCE}"
            ));
        };
        let waited = std::time::Instant::now();
        let found = self.instance_pod(&pod_name).await;
        tracing::debug!(pod = %pod_name, found = found.is_some(), waited = ?waited.elapsed(), "node channel: the enrolling pod in the instances' cache");
        let Some(pod) = found else {
            return Err(format!(
                "pod {pod_name} is not an instance: no pod of that name matches {:?} in namespace {}",
                self.instances.selector(),
                self.namespace
            ));
        };
        if pod.uid().as_deref() != Some(pod_uid.as_str()) {
            return Err(format!(
                "the token is bound to an earlier pod named {pod_name}"
            ));
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let expected = format!("system:serviceaccount:{}:{account}", self.namespace);
        if user.username.as_deref() != Some(expected.as_str()) {
            return Err(format!(
                "the token is {:?}'s, not {expected}'s, the ServiceAccount of pod {pod_name}",
                user.username.unwrap_or_default()
            ));
        }
        let Some(node) = spec.node_name else {
            return Err(format!("pod {pod_name} is not on a node yet"));
        };
        let identity = self
            .authority
            .issue_node(&node)
            .map_err(|error| format!("cannot issue a certificate for node {node}: {error}"))?;
        Ok(Enrolled {
            node,
            term: self.term,
            identity,
        })
    }
}
