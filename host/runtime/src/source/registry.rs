//! Talking to registries: one `oci-client` client per registry reached (plain HTTP only
//! for a registry the grants file marks `insecure`, its private CA added), credentials
//! from the registry's mounted pull secret (read at each pull), retries with back-off
//! for what may pass (no answer, 5xx, 429), bounded reads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::grants::Grants;
use crate::grants::source::{OciReference, RegistrySettings};

/// Attempts of one registry request before the pull fails (and is tried again at the
/// next poll).
pub const ATTEMPTS: u32 = 4;
/// The first back-off; doubled at each attempt.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait for a registry's answer to one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a registry request failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    pub message: String,
    /// Worth trying again (no answer, a 5xx or a 429).
    pub transient: bool,
    /// The registry says the manifest or tag does not exist.
    pub not_found: bool,
    /// The bytes the registry sent do not hash to the digest asked for.
    pub digest_mismatch: bool,
}

impl RegistryError {
    fn other(message: String) -> Self {
        RegistryError {
            message,
            transient: false,
            not_found: false,
            digest_mismatch: false,
        }
    }
}

fn classify(error: OciDistributionError) -> RegistryError {
    let (transient, not_found) = match &error {
        OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => (true, false),
        OciDistributionError::ServerError { code, .. } => {
            (*code >= 500 || *code == 429, *code == 404)
        }
        OciDistributionError::ImageManifestNotFoundError(_) => (false, true),
        OciDistributionError::RegistryError { envelope, .. } => (
            false,
            envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NotFound
                        | oci_client::errors::OciErrorCode::NameUnknown
                )
            }),
        ),
        _ => (false, false),
    };
    // reqwest's error alone says "error sending request"; its sources say why.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    // A stream that fails its digest check ends with an I/O error wrapping it: not a
    // failure to try again.
    let digest_mismatch =
        matches!(error, OciDistributionError::DigestError(_)) || message.contains("Invalid digest");
    RegistryError {
        message,
        transient: transient && !digest_mismatch,
        not_found,
        digest_mismatch,
    }
}

/// The clients, one per registry host actually contacted.
#[derive(Clone, Default)]
pub struct Registries {
    clients: Arc<Mutex<HashMap<String, Arc<Client>>>>,
}

/// Where a reference is pulled from: its registry or that registry's mirror.
pub struct Target {
    pub reference: Reference,
    pub shown: String,
    settings: RegistrySettings,
}

impl Registries {
    /// Where `oci` is pulled from, with the settings of that registry.
    pub fn target(&self, grants: &Grants, oci: &OciReference) -> Result<Target, RegistryError> {
        let own = grants.registry(&oci.registry);
        let (oci, settings) = match &own.mirror {
            Some(mirror) => (oci.on_registry(mirror), grants.registry(mirror)),
            None => (oci.clone(), own),
        };
        let shown = oci.to_string();
        let reference = shown
            .parse::<Reference>()
            .map_err(|error| RegistryError::other(format!("{shown}: {error}")))?;
        Ok(Target {
            reference,
            shown,
            settings,
        })
    }

    fn client(&self, settings: &RegistrySettings) -> Result<Arc<Client>, RegistryError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(&settings.host) {
            return Ok(client.clone());
        }
        // reqwest takes the process's TLS provider: the host's is ring (kube's, the
        // node channel's); install it in case nothing has yet.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut extra_root_certificates = Vec::new();
        if let Some(path) = &settings.ca_file {
            let data = std::fs::read(path).map_err(|error| {
                RegistryError::other(format!(
                    "cannot read the CA file {} of registry {}: {error}",
                    path.display(),
                    settings.host
                ))
            })?;
            extra_root_certificates.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            protocol: if settings.insecure {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates,
            read_timeout: Some(REQUEST_TIMEOUT),
            connect_timeout: Some(Duration::from_secs(10)),
            ..ClientConfig::default()
        };
        let client = Arc::new(Client::new(config));
        clients.insert(settings.host.clone(), client.clone());
        Ok(client)
    }

    /// The digest (`<hex>`) the registry resolves `target`'s tag to.
    pub async fn resolve(&self, target: &Target) -> Result<String, RegistryError> {
        let client = self.client(&target.settings)?;
        let auth = auth(&target.settings)?;
        let digest = retry(&target.shown, || {
            client.fetch_manifest_digest(&target.reference, &auth)
        })
        .await?;
        digest
            .strip_prefix("sha256:")
            .map(str::to_string)
            .ok_or_else(|| {
                RegistryError::other(format!(
                    "{}: the registry resolved it to {digest}, not a sha256 digest",
                    target.shown
                ))
            })
    }

    /// The manifest `target` names, as bytes (at most `max_bytes`).
    pub async fn manifest(
        &self,
        target: &Target,
        max_bytes: usize,
    ) -> Result<Vec<u8>, RegistryError> {
        let client = self.client(&target.settings)?;
        let auth = auth(&target.settings)?;
        let (bytes, _digest) = retry(&target.shown, || {
            client.pull_manifest_raw(
                &target.reference,
                &auth,
                &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
            )
        })
        .await?;
        if bytes.len() > max_bytes {
            return Err(RegistryError::other(format!(
                "{}: the manifest is {} bytes, more than the {max_bytes} a module's may have",
                target.shown,
                bytes.len()
            )));
        }
        Ok(bytes.to_vec())
    }

    /// The blob `descriptor` names in `target`'s repository, at most `max_bytes`; its
    /// digest checked by the client as it streams, and at the end.
    pub async fn blob(
        &self,
        target: &Target,
        descriptor: &OciDescriptor,
        max_bytes: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let client = self.client(&target.settings)?;
        let auth = auth(&target.settings)?;
        client
            .store_auth_if_needed(target.reference.resolve_registry(), &auth)
            .await;
        retry(&target.shown, || async {
            let mut stream = client
                .pull_blob_stream(&target.reference, descriptor)
                .await?;
            if stream
                .content_length
                .is_some_and(|length| length > max_bytes)
            {
                return Err(OciDistributionError::GenericError(Some(format!(
                    "the registry sends {} bytes for blob {}, more than the {max_bytes} bytes \
                     its manifest says",
                    stream.content_length.unwrap_or_default(),
                    descriptor.digest
                ))));
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                bytes.extend_from_slice(&chunk);
                if bytes.len() as u64 > max_bytes {
                    return Err(OciDistributionError::GenericError(Some(format!(
                        "blob {} is longer than the {max_bytes} bytes its manifest says",
                        descriptor.digest
                    ))));
                }
            }
            Ok(bytes)
        })
        .await
    }
}

/// Runs `request` up to [`ATTEMPTS`] times while it fails transiently, with back-off.
async fn retry<T, F, Fut>(shown: &str, mut request: F) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OciDistributionError>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match request().await.map_err(classify) {
            Ok(value) => return Ok(value),
            Err(error) if error.transient && attempt < ATTEMPTS => {
                tracing::debug!(
                    reference = shown,
                    attempt,
                    "registry request failed, retrying in {backoff:?}: {error}"
                );
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            Err(mut error) => {
                error.message = format!(
                    "{shown}: {}{}",
                    error.message,
                    if error.transient {
                        format!(" (after {attempt} attempts)")
                    } else {
                        String::new()
                    }
                );
                return Err(error);
            }
        }
    }
}

/// The credentials of a registry: its pull secret's entry (a mounted
/// `kubernetes.io/dockerconfigjson`), or anonymous.
fn auth(settings: &RegistrySettings) -> Result<RegistryAuth, RegistryError> {
    let Some(path) = &settings.pull_secret else {
        return Ok(RegistryAuth::Anonymous);
    };
    let text = std::fs::read(path).map_err(|error| {
        RegistryError::other(format!(
            "cannot read the pull secret {} of registry {}: {error}; mount the \
             kubernetes.io/dockerconfigjson Secret there",
            path.display(),
            settings.host
        ))
    })?;
    docker_config_auth(&text, &settings.host).map_err(|why| {
        RegistryError::other(format!(
            "the pull secret {} of registry {}: {why}",
            path.display(),
            settings.host
        ))
    })
}

/// The entry for `host` in a `.dockerconfigjson` (`auths.<host>`, also written
/// `https://<host>`): `auth` (base64 `user:password`) or `username` and `password`.
pub fn docker_config_auth(text: &[u8], host: &str) -> Result<RegistryAuth, String> {
    let config: serde_json::Value =
        serde_json::from_slice(text).map_err(|error| format!("not JSON: {error}"))?;
    let auths = config["auths"]
        .as_object()
        .ok_or("has no `auths` (not a .dockerconfigjson)")?;
    let entry = auths
        .iter()
        .find(|(key, _)| {
            let key = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/');
            key.eq_ignore_ascii_case(host)
        })
        .map(|(_, entry)| entry)
        .ok_or_else(|| format!("has no entry for {host} under `auths`"))?;
    if let Some(token) = entry["auth"].as_str().filter(|token| !token.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|_| format!("the `auth` of {host} is not base64"))?;
        let decoded =
            String::from_utf8(decoded).map_err(|_| format!("the `auth` of {host} is not text"))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| format!("the `auth` of {host} is not user:password"))?;
        return Ok(RegistryAuth::Basic(user.to_string(), password.to_string()));
    }
    match (entry["username"].as_str(), entry["password"].as_str()) {
        (Some(user), Some(password)) => {
            Ok(RegistryAuth::Basic(user.to_string(), password.to_string()))
        }
        _ => Err(format!(
            "the entry of {host} has neither `auth` nor `username` and `password`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_secrets_in_both_spellings() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let config = format!(
            r#"{{"auths":{{"https://r.example.com:5000/":{{"auth":"{auth}"}},"other.example.com":{{"username":"u","password":"p"}}}}}}"#
        );
        assert_eq!(
            docker_config_auth(config.as_bytes(), "r.example.com:5000").unwrap(),
            RegistryAuth::Basic("robot".into(), "s3cret".into())
        );
        assert_eq!(
            docker_config_auth(config.as_bytes(), "other.example.com").unwrap(),
            RegistryAuth::Basic("u".into(), "p".into())
        );
        let error = docker_config_auth(config.as_bytes(), "third.example.com").unwrap_err();
        assert!(error.contains("no entry for third.example.com"), "{error}");
        assert!(
            docker_config_auth(b"{}", "r")
                .unwrap_err()
                .contains("not a .dockerconfigjson")
        );
    }
}
