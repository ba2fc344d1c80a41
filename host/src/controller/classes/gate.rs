//! The gate a new module version must pass before it replaces the version in service
//! ([`wasm_provisioner_runtime::VersionGate`]): it must accept every class of ours that
//! names its module and the version in service accepts. A class the new version
//! rejects (or cannot validate: its call trapped, timed out) while the old one accepts
//! it holds the new version back: the old version keeps serving, the runtime logs the
//! refusal and counts it (`wasm_provisioner_module_refusals_total`), and a Warning
//! Event `ModuleVersionHeldBack` on each such class says why. A class both versions
//! reject is no reason to hold it back. A class changed or deleted lets the held-back
//! version be tried again at the next scan of the modules directory.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use tracing::warn;

use super::{ClassChecks, Verdict, ask};
use wasm_provisioner_rules::types::Capability;
use wasm_provisioner_runtime::{LoadedModule, VersionGate, class_pin};

/// The host's [`VersionGate`], over its classes.
pub struct ClassGate(pub Arc<ClassChecks>);

impl VersionGate for ClassGate {
    fn admit<'a>(
        &'a self,
        candidate: &'a LoadedModule,
        serving: &'a LoadedModule,
    ) -> BoxFuture<'a, Result<(), String>> {
        self.check(candidate, serving).boxed()
    }
}

impl ClassGate {
    async fn check(&self, candidate: &LoadedModule, serving: &LoadedModule) -> Result<(), String> {
        if !candidate.has(Capability::ValidateClass) {
            return Ok(());
        }
        let checks = &self.0;
        let classes = match checks.classes_of(candidate.name()).await {
            Ok(classes) => classes,
            Err(error) => {
                warn!(
                    module = candidate.name(),
                    version = candidate.version(),
                    "cannot list the StorageClasses to check the new version against them ({error}); letting it serve unchecked"
                );
                return Ok(());
            }
        };
        let mut reasons = Vec::new();
        for class in classes.iter().filter(|class| serves(candidate, class)) {
            let new = self.verdict_of(candidate, class).await;
            if new.as_ref().is_ok_and(Verdict::is_valid) {
                continue;
            }
            let old = if serving.has(Capability::ValidateClass) {
                self.verdict_of(serving, class).await
            } else {
                Ok(Verdict::Valid)
            };
            if !old.as_ref().is_ok_and(Verdict::is_valid) {
                continue;
            }
            let why = match new {
                Ok(Verdict::Rejected(message)) => format!(
                    "it rejects StorageClass {:?}, which sha256:{} accepts: {message}",
                    class.name_any(),
                    serving.version()
                ),
                Ok(Verdict::Failed(error)) | Err(error) => format!(
                    "it could not validate StorageClass {:?}, which sha256:{} accepts: {error}",
                    class.name_any(),
                    serving.version()
                ),
                Ok(Verdict::Valid) => unreachable!("a valid verdict passed above"),
            };
            checks
                .tell_held_back(
                    class,
                    format!(
                        "module {} version sha256:{} held back, version sha256:{} keeps serving: {why}",
                        candidate.name(),
                        candidate.version(),
                        serving.version()
                    ),
                )
                .await;
            reasons.push(why);
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }

    /// A version's verdict on a class, through the shared verdicts (asked once); a call
    /// that could not start is an error here: the gate does not wait.
    async fn verdict_of(
        &self,
        module: &LoadedModule,
        class: &StorageClass,
    ) -> Result<Verdict, String> {
        let key = ClassChecks::key(class, module);
        self.0
            .verdicts
            .get_or_ask(&key, || ask(&self.0.metrics, module, class))
            .await
            .map(|lookup| lookup.verdict)
            .ok_or_else(|| {
                "the call could not start (the module busy, or the instance pool full)".into()
            })
    }
}

/// Whether `module` would serve `class`: a class pinned to another version is not its.
fn serves(module: &LoadedModule, class: &StorageClass) -> bool {
    let pin = class_pin(module.name(), class.parameters.as_ref());
    match pin {
        Ok(None) => true,
        Ok(Some(pinned)) => {
            let digest = pinned.trim();
            let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
            digest.eq_ignore_ascii_case(module.sha256())
        }
        Err(_) => false,
    }
}
