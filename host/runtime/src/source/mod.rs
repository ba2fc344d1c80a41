//! Modules from OCI registries: the grants file names a module's artifact by digest (or
//! by tag, resolved to a digest and then pinned), this pulls it into the module store,
//! checks it (the wasm artifact layout, its size from the manifest before any download,
//! its digests, its cosign signatures when the grants file asks for them) and hands the
//! bytes to the same load path as a module file ([`Runtime::load_bytes`]): compiled,
//! checked, and only then put in service; the version in service keeps serving on any
//! failure. Tags are polled every `--module-poll-interval`; a digest is never
//! re-resolved. What happened is counted in `wasm_provisioner_module_pulls_total`
//! (`outcome`), a refused pull is logged and counted as a refusal like a broken file, and
//! a module with no version in service fails its claims with the reason (their Warning
//! Event). See docs/modules.md.

pub mod registry;
pub mod store;
pub mod verify;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use sha2::{Digest as _, Sha256};

use self::registry::{Registries, RegistryError};
use self::store::{Store, StoreError, is_sha256_hex};
use self::verify::{FoundSignature, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};
use crate::error::LoadError;
use crate::grants::source::{ModuleSource, OciReference, Pin};
use crate::runtime::{LoadOutcome, Runtime};

/// The default of `--module-poll-interval`.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(300);
/// Largest manifest read (the size registries commonly accept).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Largest simple-signing payload read.
const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// Most signature layers looked at for one manifest.
const MAX_SIGNATURES: usize = 32;

/// Layer media types of a wasm module artifact: the CNCF wasm OCI artifact layout
/// (`oras`, `wkg`) and the older wasm-to-oci one.
pub const WASM_LAYER_MEDIA_TYPES: [&str; 2] = [
    "application/wasm",
    "application/vnd.wasm.content.layer.v1+wasm",
];
/// Config media types accepted beside them (the wasm config, the older one, and OCI's
/// empty config of an artifact pushed without one).
pub const WASM_CONFIG_MEDIA_TYPES: [&str; 3] = [
    "application/vnd.wasm.config.v0+json",
    "application/vnd.wasm.config.v1+json",
    "application/vnd.oci.empty.v1+json",
];

/// How modules are pulled (the `run` flags).
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The module store (`--module-store`).
    pub store_dir: PathBuf,
    /// How often tags are resolved again and failed pulls tried again
    /// (`--module-poll-interval`).
    pub poll_interval: Duration,
}

/// Why a pull did not give a module's bytes; `outcome` is its metric label.
#[derive(Debug, Clone)]
pub struct PullFailure {
    pub outcome: &'static str,
    pub cause: String,
}

impl PullFailure {
    fn new(outcome: &'static str, cause: impl Into<String>) -> Self {
        PullFailure {
            outcome,
            cause: cause.into(),
        }
    }

    fn registry(error: RegistryError) -> Self {
        let outcome = if error.digest_mismatch {
            "digest_mismatch"
        } else {
            "registry_error"
        };
        PullFailure::new(outcome, error.message)
    }
}

/// Pulled bytes and where they came from.
struct Pulled {
    bytes: Vec<u8>,
    /// Everything came from the store: nothing was downloaded.
    from_store: bool,
}

/// Pulls the modules the grants file gives an OCI source and keeps them in line with
/// their references. Dropping it stops polling; the modules in service stay.
pub struct SourceWatcher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SourceWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SourceWatcher {
    /// Opens the store, marks every module with an OCI source as loading (its claims
    /// wait, not fail, until its first pull ends), and pulls them in the background,
    /// then every `poll_interval`. `None` when no module has an OCI source.
    pub fn start(
        runtime: Runtime,
        config: SourceConfig,
    ) -> Result<Option<SourceWatcher>, StoreError> {
        let sources = runtime.grants().oci_sources();
        if sources.is_empty() {
            return Ok(None);
        }
        let store = Store::open(&config.store_dir)?;
        let marks: Vec<_> = sources
            .keys()
            .map(|name| runtime.mark_loading(name))
            .collect();
        let puller = Puller {
            runtime,
            store,
            registries: Registries::default(),
        };
        let task = tokio::spawn(async move {
            let mut served: BTreeMap<String, String> = BTreeMap::new();
            puller.round(&sources, &mut served).await;
            drop(marks);
            let mut ticks = tokio::time::interval(config.poll_interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                puller.round(&sources, &mut served).await;
            }
        });
        Ok(Some(SourceWatcher { task }))
    }
}

struct Puller {
    runtime: Runtime,
    store: Store,
    registries: Registries,
}

impl Puller {
    /// One poll of every source; `served` holds the manifest digest each module was last
    /// put in service from.
    async fn round(
        &self,
        sources: &BTreeMap<String, ModuleSource>,
        served: &mut BTreeMap<String, String>,
    ) {
        let pulls = sources.iter().map(|(name, source)| {
            let current = served.get(name).cloned();
            async move { (name.clone(), self.sync(name, source, current).await) }
        });
        for (name, result) in futures::future::join_all(pulls).await {
            if let Some(manifest) = result {
                served.insert(name, manifest);
            }
        }
    }

    /// Brings module `name` in line with its source; returns the manifest digest now in
    /// service from it, if it changed.
    async fn sync(
        &self,
        name: &str,
        source: &ModuleSource,
        served: Option<String>,
    ) -> Option<String> {
        let metrics = self.runtime.metrics();
        // A digest in service is never looked at again.
        if matches!(&source.oci.pin, Pin::Digest(hex) if served.as_ref() == Some(hex)) {
            return None;
        }
        let manifest = match self.resolve(&source.oci, served.is_none()).await {
            Ok(manifest) => manifest,
            Err(failure) => {
                self.refuse(name, &source.oci, failure);
                return None;
            }
        };
        if served.as_deref() == Some(manifest.as_str()) {
            metrics.record_pull(name, "unchanged");
            return None;
        }
        let pinned = source.oci.with_pin(Pin::Digest(manifest.clone()));
        let pulled = match self.pull(name, source, &pinned, &manifest).await {
            Ok(pulled) => pulled,
            Err(failure) => {
                self.refuse(name, &pinned, failure);
                return None;
            }
        };
        metrics.record_pull(
            name,
            if pulled.from_store {
                "store_hit"
            } else {
                "pulled"
            },
        );
        match self.runtime.load_bytes(name, pulled.bytes).await {
            Ok(outcome) => {
                if outcome != LoadOutcome::Unchanged {
                    tracing::info!(module = name, reference = %pinned, from_store = pulled.from_store, "module pulled and put in service");
                }
                Some(manifest)
            }
            // Refused like a broken file (logged, counted, remembered for its claims).
            Err(_) => None,
        }
    }

    /// The manifest digest (`<hex>`) `oci` names now: its digest, or its tag resolved
    /// (the store's last resolution when the registry does not answer and nothing is in
    /// service yet, as after a restart with the registry down, or air-gapped).
    async fn resolve(&self, oci: &OciReference, first: bool) -> Result<String, PullFailure> {
        let tag = match &oci.pin {
            Pin::Digest(hex) => return Ok(hex.clone()),
            Pin::Tag(tag) => tag,
        };
        let shown = oci.to_string();
        let resolved = match self.registries.target(self.runtime.grants(), oci) {
            Ok(target) => self.registries.resolve(&target).await,
            Err(error) => Err(error),
        };
        match resolved {
            Ok(hex) => {
                if self.store.pinned(&shown, tag).as_deref() != Some(hex.as_str()) {
                    self.store
                        .pin(&shown, &hex, oci_client::manifest::OCI_IMAGE_MEDIA_TYPE, 0);
                }
                Ok(hex)
            }
            Err(error) if first && !error.not_found => match self.store.pinned(&shown, tag) {
                Some(hex) => {
                    tracing::warn!(reference = %shown, "cannot resolve the tag ({error}); using sha256:{hex}, its last resolution in the module store");
                    Ok(hex)
                }
                None => Err(PullFailure::registry(error)),
            },
            Err(error) => Err(PullFailure::registry(error)),
        }
    }

    /// The module bytes of manifest `sha256:<manifest>`, from the store or the registry,
    /// checked.
    async fn pull(
        &self,
        name: &str,
        source: &ModuleSource,
        pinned: &OciReference,
        manifest_hex: &str,
    ) -> Result<Pulled, PullFailure> {
        let grants = self.runtime.grants();
        let target = || {
            self.registries
                .target(grants, pinned)
                .map_err(PullFailure::registry)
        };
        let mut from_store = true;
        let manifest_bytes = match self.store.get(manifest_hex, MAX_MANIFEST_BYTES) {
            Some(bytes) => bytes,
            None => {
                from_store = false;
                let bytes = self
                    .registries
                    .manifest(&target()?, MAX_MANIFEST_BYTES as usize)
                    .await
                    .map_err(PullFailure::registry)?;
                let actual = hex::encode(Sha256::digest(&bytes));
                if actual != manifest_hex {
                    return Err(PullFailure::new(
                        "digest_mismatch",
                        format!(
                            "the registry sent a manifest of digest sha256:{actual}, not the sha256:{manifest_hex} asked for"
                        ),
                    ));
                }
                self.store_put(&bytes);
                bytes
            }
        };
        let layer = wasm_layer(&manifest_bytes)?;
        let max = self.runtime.max_module_bytes();
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > max {
            return Err(PullFailure::new(
                "too_large",
                format!(
                    "its manifest says the module is {} bytes, more than the {max} bytes a module may \
                     have; not downloaded (raise --max-module-bytes if it is legitimate)",
                    layer.size
                ),
            ));
        }
        if let Some(policy) = &source.signatures {
            self.check_signatures(policy, pinned, manifest_hex).await?;
        }
        let layer_hex = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|hex| is_sha256_hex(hex))
            .ok_or_else(|| {
                PullFailure::new(
                    "not_a_module",
                    format!("its layer's digest {} is not a sha256", layer.digest),
                )
            })?
            .to_string();
        let bytes = match self.store.get(&layer_hex, size) {
            Some(bytes) => bytes,
            None => {
                from_store = false;
                let bytes = self
                    .registries
                    .blob(&target()?, &layer, size)
                    .await
                    .map_err(PullFailure::registry)?;
                let actual = hex::encode(Sha256::digest(&bytes));
                if actual != layer_hex {
                    return Err(PullFailure::new(
                        "digest_mismatch",
                        format!(
                            "the registry sent module bytes of digest sha256:{actual}, not the sha256:{layer_hex} its manifest names"
                        ),
                    ));
                }
                self.store_put(&bytes);
                bytes
            }
        };
        let _ = name;
        Ok(Pulled { bytes, from_store })
    }

    /// Checks the cosign signatures of `sha256:<manifest_hex>`: those in the store
    /// first, then (when they do not satisfy the rule) the registry's.
    async fn check_signatures(
        &self,
        policy: &crate::grants::source::SignaturePolicy,
        pinned: &OciReference,
        manifest_hex: &str,
    ) -> Result<(), PullFailure> {
        let tag = verify::signature_tag(manifest_hex);
        let signature_ref = pinned.with_pin(Pin::Tag(tag.clone()));
        let shown = signature_ref.to_string();
        let mut stored_error = None;
        if let Some(stored) = self.store.pinned(&shown, &tag) {
            let found = self.stored_signatures(&stored);
            match verify::check(policy, manifest_hex, &found) {
                Ok(()) => return Ok(()),
                Err(error) => stored_error = Some(error),
            }
        }
        let found = match self.registry_signatures(&signature_ref).await {
            Ok(found) => found,
            // No registry: what the store has decides.
            Err(failure) if failure.outcome == "registry_error" && stored_error.is_some() => {
                let error = stored_error.unwrap_or_else(|| unreachable!());
                return Err(PullFailure::new(error.metric_outcome(), error.to_string()));
            }
            Err(failure) => return Err(failure),
        };
        verify::check(policy, manifest_hex, &found)
            .map_err(|error| PullFailure::new(error.metric_outcome(), error.to_string()))
    }

    fn stored_signatures(&self, signature_manifest: &str) -> Vec<FoundSignature> {
        let Some(bytes) = self.store.get(signature_manifest, MAX_MANIFEST_BYTES) else {
            return Vec::new();
        };
        let Ok(manifest) = serde_json::from_slice::<OciImageManifest>(&bytes) else {
            return Vec::new();
        };
        signature_layers(&manifest)
            .filter_map(|(layer, signature)| {
                let hex = layer.digest.strip_prefix("sha256:")?;
                Some(FoundSignature {
                    payload: self.store.get(hex, MAX_PAYLOAD_BYTES)?,
                    signature,
                })
            })
            .collect()
    }

    /// The signatures the registry has for the manifest (none when the signature tag
    /// does not exist), kept in the store.
    async fn registry_signatures(
        &self,
        signature_ref: &OciReference,
    ) -> Result<Vec<FoundSignature>, PullFailure> {
        let target = self
            .registries
            .target(self.runtime.grants(), signature_ref)
            .map_err(PullFailure::registry)?;
        let hex = match self.registries.resolve(&target).await {
            Ok(hex) => hex,
            Err(error) if error.not_found => return Ok(Vec::new()),
            Err(error) => return Err(PullFailure::registry(error)),
        };
        let by_digest = self
            .registries
            .target(
                self.runtime.grants(),
                &signature_ref.with_pin(Pin::Digest(hex.clone())),
            )
            .map_err(PullFailure::registry)?;
        let bytes = self
            .registries
            .manifest(&by_digest, MAX_MANIFEST_BYTES as usize)
            .await
            .map_err(PullFailure::registry)?;
        if hex::encode(Sha256::digest(&bytes)) != hex {
            return Err(PullFailure::new(
                "digest_mismatch",
                format!(
                    "{}: the signature manifest does not match its digest",
                    target.shown
                ),
            ));
        }
        let manifest: OciImageManifest = serde_json::from_slice(&bytes).map_err(|error| {
            PullFailure::new(
                "bad_signature",
                format!("{}: not an OCI manifest: {error}", target.shown),
            )
        })?;
        let mut found = Vec::new();
        for (layer, signature) in signature_layers(&manifest) {
            let payload = self
                .registries
                .blob(&by_digest, &layer, MAX_PAYLOAD_BYTES)
                .await
                .map_err(PullFailure::registry)?;
            self.store_put(&payload);
            found.push(FoundSignature { payload, signature });
        }
        self.store_put(&bytes);
        self.store.pin(
            &signature_ref.to_string(),
            &hex,
            oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
            bytes.len(),
        );
        Ok(found)
    }

    fn store_put(&self, bytes: &[u8]) {
        if let Err(error) = self.store.put(bytes) {
            tracing::warn!(store = %self.store.dir().display(), "cannot write to the module store (the next start pulls again): {error}");
        }
    }

    /// A refused pull: logged, counted (pull outcome, and a refusal like a broken file),
    /// and, while no version serves, the reason its claims fail with.
    fn refuse(&self, name: &str, reference: &OciReference, failure: PullFailure) {
        self.runtime.metrics().record_pull(name, failure.outcome);
        self.runtime.refused(&LoadError::Pull {
            module: name.to_string(),
            reference: reference.to_string(),
            outcome: failure.outcome,
            cause: failure.cause,
        });
    }
}

/// The signature layers of a cosign signature manifest, with their base64 signatures.
fn signature_layers(
    manifest: &OciImageManifest,
) -> impl Iterator<Item = (OciDescriptor, String)> + '_ {
    manifest
        .layers
        .iter()
        .filter(|layer| layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        .filter_map(|layer| {
            let signature = layer
                .annotations
                .as_ref()?
                .get(SIGNATURE_ANNOTATION)?
                .clone();
            Some((layer.clone(), signature))
        })
        .take(MAX_SIGNATURES)
}

/// The one wasm layer of a module's manifest; anything else (an image, an index, more
/// than one module) is refused naming what it is.
fn wasm_layer(manifest_bytes: &[u8]) -> Result<OciDescriptor, PullFailure> {
    let not_a_module = |why: String| {
        PullFailure::new(
            "not_a_module",
            format!(
                "{why}; a module is a wasm OCI artifact: one layer of media type application/wasm \
                 (push it with `oras push REF module.wasm:application/wasm --config \
                 config.json:application/vnd.wasm.config.v0+json`, or `wkg oci push`)"
            ),
        )
    };
    let manifest: OciImageManifest = serde_json::from_slice(manifest_bytes).map_err(|error| {
        not_a_module(format!(
            "its manifest is not an OCI image manifest ({error})"
        ))
    })?;
    let config = &manifest.config.media_type;
    if !WASM_CONFIG_MEDIA_TYPES.contains(&config.as_str()) {
        return Err(not_a_module(format!(
            "its config is of media type {config} (a container image?)"
        )));
    }
    let mut layers = manifest
        .layers
        .iter()
        .filter(|layer| WASM_LAYER_MEDIA_TYPES.contains(&layer.media_type.as_str()));
    match (layers.next(), layers.next()) {
        (Some(layer), None) => Ok(layer.clone()),
        (None, _) => Err(not_a_module(format!(
            "it has no wasm layer (its layers: {})",
            manifest
                .layers
                .iter()
                .map(|layer| layer.media_type.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        (Some(_), Some(_)) => Err(not_a_module("it has more than one wasm layer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(config: &str, layers: &[&str]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": config, "digest": format!("sha256:{}", "0".repeat(64)), "size": 2 },
            "layers": layers.iter().map(|media_type| serde_json::json!({
                "mediaType": media_type, "digest": format!("sha256:{}", "1".repeat(64)), "size": 10,
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn only_a_wasm_artifact_is_a_module() {
        let layer = wasm_layer(&manifest(
            "application/vnd.wasm.config.v0+json",
            &["application/wasm"],
        ))
        .unwrap();
        assert_eq!(layer.size, 10);
        wasm_layer(&manifest(
            "application/vnd.oci.empty.v1+json",
            &["application/wasm"],
        ))
        .unwrap();
        for (bytes, expected) in [
            (
                manifest(
                    "application/vnd.oci.image.config.v1+json",
                    &["application/vnd.oci.image.layer.v1.tar+gzip"],
                ),
                "a container image?",
            ),
            (
                manifest("application/vnd.wasm.config.v0+json", &["text/plain"]),
                "no wasm layer (its layers: text/plain)",
            ),
            (
                manifest(
                    "application/vnd.wasm.config.v0+json",
                    &["application/wasm", "application/wasm"],
                ),
                "more than one wasm layer",
            ),
            (b"{}".to_vec(), "not an OCI image manifest"),
        ] {
            let failure = wasm_layer(&bytes).unwrap_err();
            assert_eq!(failure.outcome, "not_a_module");
            assert!(failure.cause.contains(expected), "{}", failure.cause);
            assert!(
                failure.cause.contains("application/wasm"),
                "{}",
                failure.cause
            );
        }
    }
}
