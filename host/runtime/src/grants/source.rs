//! Where a module's bytes come from, when not from the modules directory: an OCI
//! artifact named by the admin in the grants file, with the registries' settings and the
//! signatures it must carry (see docs/modules.md).
//!
//! ```yaml
//! registries:
//!   - host: registry.example.com:5000
//!     insecure: false                 # plain http only when true
//!     caFile: /etc/wasm-provisioner/ca/ca.crt
//!     pullSecret: /etc/wasm-provisioner/pull/.dockerconfigjson
//!     mirror: mirror.internal:5000    # pull from here instead
//! modules:
//!   hostpath:
//!     source:
//!       oci: registry.example.com:5000/wasm-provisioner/hostpath@sha256:<64 hex>
//!       signatures:
//!         allOf: [{ publicKey: /etc/wasm-provisioner/keys/release.pub }]
//!         anyOf: [{ publicKey: /etc/wasm-provisioner/keys/a.pub }, { publicKey: /etc/wasm-provisioner/keys/b.pub }]
//! ```
//!
//! Everything here is checked when the grants file is read: a reference that does not
//! name its registry, a digest that is not a sha256, a key file that cannot be read or
//! is not a public key refuses the whole file, naming the module and the field.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// A module's OCI source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSource {
    pub oci: OciReference,
    /// The signatures its manifest must carry (the module's own, else its registry's);
    /// `None`: no verification.
    pub signatures: Option<SignaturePolicy>,
}

/// `registry/repository@sha256:<hex>` or `registry/repository:tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciReference {
    /// `host` or `host:port`, as written (lowercase).
    pub registry: String,
    pub repository: String,
    pub pin: Pin,
}

/// What a reference names in its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// The manifest's sha256, 64 lowercase hex digits: never re-resolved.
    Digest(String),
    /// A tag: resolved to a digest, pinned, and polled for a change.
    Tag(String),
}

impl OciReference {
    /// The same repository, at `digest` (`sha256:<hex>`) or tag.
    pub fn with_pin(&self, pin: Pin) -> OciReference {
        OciReference {
            pin,
            ..self.clone()
        }
    }

    /// The same repository and pin on another registry (a mirror).
    pub fn on_registry(&self, registry: &str) -> OciReference {
        OciReference {
            registry: registry.to_string(),
            ..self.clone()
        }
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pin {
            Pin::Digest(hex) => write!(f, "{}/{}@sha256:{hex}", self.registry, self.repository),
            Pin::Tag(tag) => write!(f, "{}/{}:{tag}", self.registry, self.repository),
        }
    }
}

/// How to reach one registry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegistrySettings {
    pub host: String,
    /// Plain HTTP (never for a registry not listed with `insecure: true`).
    pub insecure: bool,
    /// PEM certificates trusted for this registry, besides the system's.
    pub ca_file: Option<PathBuf>,
    /// A mounted `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`: read at
    /// each pull, so a rotated Secret needs no restart.
    pub pull_secret: Option<PathBuf>,
    /// Pull from this registry instead (same repository and digest).
    pub mirror: Option<String>,
    /// The signatures every module from this registry must carry, unless the module
    /// says otherwise.
    pub signatures: Option<SignaturePolicy>,
}

/// Which keys must have signed a module's manifest: every key of `all_of`, and at least
/// one key of `any_of` when it is not empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SignaturePolicy {
    pub all_of: Vec<PublicKey>,
    pub any_of: Vec<PublicKey>,
}

/// A cosign public key (PEM), read and parsed when the grants file is read.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub path: PathBuf,
    pub pem: Vec<u8>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.path.display())
    }
}

// ---- the file as written ------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SourceFile {
    oci: String,
    #[serde(default)]
    signatures: Option<SignaturesFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RegistryFile {
    host: String,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    pull_secret: Option<String>,
    #[serde(default)]
    mirror: Option<String>,
    #[serde(default)]
    signatures: Option<SignaturesFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SignaturesFile {
    #[serde(default)]
    all_of: Vec<SignerFile>,
    #[serde(default)]
    any_of: Vec<SignerFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SignerFile {
    /// A PEM public key file (cosign's `cosign.pub`).
    public_key: String,
}

pub(super) fn validate_registries(
    registries: Vec<RegistryFile>,
    problems: &mut Vec<String>,
) -> Vec<RegistrySettings> {
    let mut out: Vec<RegistrySettings> = Vec::new();
    for (i, registry) in registries.into_iter().enumerate() {
        let at = format!("registries[{i}]");
        let host = match registry_host(&registry.host) {
            Ok(host) => host,
            Err(why) => {
                problems.push(format!("{at}.host {:?}: {why}", registry.host));
                continue;
            }
        };
        if out.iter().any(|other| other.host == host) {
            problems.push(format!(
                "{at}.host {host}: listed twice; merge the two entries"
            ));
            continue;
        }
        let mirror = match registry.mirror.as_deref().map(registry_host) {
            None => None,
            Some(Ok(mirror)) => Some(mirror),
            Some(Err(why)) => {
                problems.push(format!("{at}.mirror {:?}: {why}", registry.mirror));
                None
            }
        };
        let ca_file = registry.ca_file.as_deref().and_then(|path| {
            absolute_file(path, &format!("{at}.caFile"), problems).inspect(|path| {
                match std::fs::read(path) {
                    Ok(pem)
                        if String::from_utf8_lossy(&pem)
                            .contains("-----BEGIN CERTIFICATE-----") => {}
                    Ok(_) => problems.push(format!(
                        "{at}.caFile {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        path.display()
                    )),
                    Err(error) => problems.push(format!(
                        "{at}.caFile {}: cannot be read: {error}; mount the CA there",
                        path.display()
                    )),
                }
            })
        });
        // The pull secret is read at each pull (a Secret rotates); only its path is
        // checked here.
        let pull_secret = registry
            .pull_secret
            .as_deref()
            .and_then(|path| absolute_file(path, &format!("{at}.pullSecret"), problems));
        let signatures = registry
            .signatures
            .map(|file| file.validate(&format!("{at}.signatures"), problems));
        out.push(RegistrySettings {
            host,
            insecure: registry.insecure,
            ca_file,
            pull_secret,
            mirror,
            signatures,
        });
    }
    out
}

impl SourceFile {
    pub(super) fn validate(
        self,
        at: &str,
        registries: &[RegistrySettings],
        problems: &mut Vec<String>,
    ) -> Option<ModuleSource> {
        let oci = match parse_reference(&self.oci) {
            Ok(oci) => Some(oci),
            Err(why) => {
                problems.push(format!("{at}.source.oci {:?}: {why}", self.oci));
                None
            }
        };
        let signatures = self
            .signatures
            .map(|file| file.validate(&format!("{at}.source.signatures"), problems));
        let oci = oci?;
        let signatures = signatures.or_else(|| {
            registries
                .iter()
                .find(|registry| registry.host == oci.registry)
                .and_then(|registry| registry.signatures.clone())
        });
        Some(ModuleSource { oci, signatures })
    }
}

impl SignaturesFile {
    fn validate(self, at: &str, problems: &mut Vec<String>) -> SignaturePolicy {
        if self.all_of.is_empty() && self.any_of.is_empty() {
            problems.push(format!(
                "{at}: names no key; list public keys under allOf (each must have signed) or \
                 anyOf (one must have), or remove `signatures` for no verification"
            ));
        }
        let keys = |signers: Vec<SignerFile>, field: &str, problems: &mut Vec<String>| {
            signers
                .into_iter()
                .enumerate()
                .filter_map(|(i, signer)| {
                    read_public_key(&signer.public_key)
                        .map_err(|why| {
                            problems.push(format!(
                                "{at}.{field}[{i}].publicKey {:?}: {why}",
                                signer.public_key
                            ))
                        })
                        .ok()
                })
                .collect()
        };
        SignaturePolicy {
            all_of: keys(self.all_of, "allOf", problems),
            any_of: keys(self.any_of, "anyOf", problems),
        }
    }
}

fn read_public_key(path: &str) -> Result<PublicKey, String> {
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    let pem = std::fs::read(&path)
        .map_err(|error| format!("cannot be read: {error}; mount the public key there"))?;
    sigstore::crypto::CosignVerificationKey::try_from_pem(&pem).map_err(|error| {
        format!("is not a public key cosign can verify with (PEM, ECDSA, RSA or Ed25519): {error}")
    })?;
    Ok(PublicKey { path, pem })
}

fn absolute_file(path: &str, at: &str, problems: &mut Vec<String>) -> Option<PathBuf> {
    if path.starts_with('/') {
        Some(PathBuf::from(path))
    } else {
        problems.push(format!("{at} {path:?}: must be an absolute path"));
        None
    }
}

/// A registry host as references name it: `host` or `host:port`, lowercase.
fn registry_host(text: &str) -> Result<String, &'static str> {
    let host = text.to_ascii_lowercase();
    let authority: ::http::uri::Authority = host
        .parse()
        .map_err(|_| "must be a registry host, such as registry.example.com:5000")?;
    if authority.as_str() != host || host.contains('@') || host.contains('/') {
        return Err("must be a registry host, such as registry.example.com:5000");
    }
    Ok(host)
}

const REFERENCE_HINT: &str = "write registry/repository@sha256:<64 hex digits> (or :tag), \
     such as registry.example.com:5000/wasm-provisioner/hostpath@sha256:…";

/// Parses `registry/repository@sha256:<hex>` or `registry/repository:tag`. The registry
/// must be named (a first component with a `.` or a `:`, or `localhost`): a module is
/// never pulled from a default registry by accident.
pub fn parse_reference(text: &str) -> Result<OciReference, String> {
    let text = text.trim();
    if let Some(scheme) = ["oci://", "http://", "https://"]
        .iter()
        .find(|scheme| text.starts_with(**scheme))
    {
        return Err(format!(
            "no scheme ({scheme}): {REFERENCE_HINT}; plain http is the registry's `insecure: true`"
        ));
    }
    let (registry, rest) = text
        .split_once('/')
        .filter(|(first, _)| first.contains('.') || first.contains(':') || *first == "localhost")
        .ok_or_else(|| format!("names no registry host; {REFERENCE_HINT}"))?;
    let registry = registry_host(registry).map_err(|why| format!("{why}; {REFERENCE_HINT}"))?;
    let (name, pin) = if let Some((name, digest)) = rest.split_once('@') {
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("the digest {digest:?} is not a sha256; {REFERENCE_HINT}"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "the digest sha256:{hex} is not 64 lowercase hex digits; {REFERENCE_HINT}"
            ));
        }
        // A tag beside the digest is only a note: the digest decides.
        let name = name.rsplit_once(':').map_or(name, |(name, _)| name);
        (name, Pin::Digest(hex.to_string()))
    } else if let Some((name, tag)) = rest.rsplit_once(':') {
        let valid_tag = !tag.is_empty()
            && tag.len() <= 128
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !tag.starts_with(['.', '-']);
        if !valid_tag {
            return Err(format!(
                "the tag {tag:?} is not a valid tag; {REFERENCE_HINT}"
            ));
        }
        (name, Pin::Tag(tag.to_string()))
    } else {
        return Err(format!(
            "names neither a digest nor a tag (no default `latest`); {REFERENCE_HINT}"
        ));
    };
    let valid_repository = !name.is_empty()
        && name.split('/').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && part.as_bytes()[0].is_ascii_alphanumeric()
        });
    if !valid_repository {
        return Err(format!(
            "the repository {name:?} is not valid (lowercase letters, digits, '.', '_', '-', \
             parts separated by '/'); {REFERENCE_HINT}"
        ));
    }
    Ok(OciReference {
        registry,
        repository: name.to_string(),
        pin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_by_digest_and_by_tag() {
        let by_digest = parse_reference(&format!(
            "registry.example.com:5000/wp/hostpath@sha256:{HEX}"
        ))
        .unwrap();
        assert_eq!(by_digest.registry, "registry.example.com:5000");
        assert_eq!(by_digest.repository, "wp/hostpath");
        assert_eq!(by_digest.pin, Pin::Digest(HEX.into()));
        assert_eq!(
            by_digest.to_string(),
            format!("registry.example.com:5000/wp/hostpath@sha256:{HEX}")
        );
        let both = parse_reference(&format!("localhost/hostpath:v1@sha256:{HEX}")).unwrap();
        assert_eq!(
            (both.repository.as_str(), both.pin),
            ("hostpath", Pin::Digest(HEX.into()))
        );
        let by_tag = parse_reference("127.0.0.1:5000/hostpath:v1.2").unwrap();
        assert_eq!(by_tag.pin, Pin::Tag("v1.2".into()));
    }

    #[test]
    fn bad_references_say_what_to_write() {
        for (text, expected) in [
            ("hostpath@sha256:00", "names no registry host"),
            ("library/hostpath:v1", "names no registry host"),
            ("oci://r.example.com/h:v1", "no scheme"),
            ("r.example.com/hostpath", "names neither a digest nor a tag"),
            ("r.example.com/hostpath@sha512:00", "is not a sha256"),
            (
                "r.example.com/hostpath@sha256:ABC",
                "not 64 lowercase hex digits",
            ),
            (
                "r.example.com/Host_Path:v1",
                "the repository \"Host_Path\" is not valid",
            ),
            ("r.example.com/hostpath:-v1", "is not a valid tag"),
        ] {
            let error = parse_reference(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(
                error.contains("registry/repository@sha256:"),
                "{text}: {error}"
            );
        }
    }
}
