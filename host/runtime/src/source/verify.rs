//! Cosign key-pair signatures of a module's manifest.
//!
//! Cosign keeps the signatures of manifest `sha256:<hex>` as the manifest tagged
//! `sha256-<hex>.sig` in the same repository: one layer per signature, of media type
//! `application/vnd.dev.cosign.simplesigning.v1+json`, whose blob is the "simple
//! signing" payload and whose annotation `dev.cosignproject.cosign/signature` is the
//! base64 signature over that payload's bytes. A signature counts for a key when the
//! key verifies it (sigstore's `CosignVerificationKey`) and the payload it signs says
//! `critical.type` "cosign container image signature" and
//! `critical.image.docker-manifest-digest` the module's manifest digest: a valid
//! signature of another manifest (an older version, another module) counts for nothing.

use sigstore::crypto::{CosignVerificationKey, Signature};

use crate::grants::source::{PublicKey, SignaturePolicy};

/// The media type of a cosign simple-signing layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding a layer's base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign image signature payload.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";

/// The cosign signature tag of manifest `sha256:<hex>`.
pub fn signature_tag(manifest_hex: &str) -> String {
    format!("sha256-{manifest_hex}.sig")
}

/// One signature found: the payload's bytes and the base64 signature over them.
#[derive(Debug, Clone)]
pub struct FoundSignature {
    pub payload: Vec<u8>,
    pub signature: String,
}

/// Why a module's signatures do not satisfy its rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "it is not signed: the registry has no cosign signature ({tag}) for manifest \
         sha256:{manifest}; sign it with `cosign sign --key` and one of the keys the grants \
         file names"
    )]
    Unsigned { manifest: String, tag: String },
    #[error(
        "its signatures do not satisfy the grants file: {missing}; ({found} signature(s) \
         found for manifest sha256:{manifest}, none of them by the missing key(s) over this \
         manifest)"
    )]
    NotSatisfied {
        manifest: String,
        found: usize,
        missing: String,
    },
}

impl SignatureError {
    pub fn metric_outcome(&self) -> &'static str {
        match self {
            SignatureError::Unsigned { .. } => "unsigned",
            SignatureError::NotSatisfied { .. } => "bad_signature",
        }
    }
}

/// Checks `signatures` (those found for manifest `sha256:<manifest_hex>`) against
/// `policy`.
pub fn check(
    policy: &SignaturePolicy,
    manifest_hex: &str,
    signatures: &[FoundSignature],
) -> Result<(), SignatureError> {
    if signatures.is_empty() {
        return Err(SignatureError::Unsigned {
            manifest: manifest_hex.to_string(),
            tag: signature_tag(manifest_hex),
        });
    }
    let signed_by = |key: &PublicKey| {
        let Ok(key_) = CosignVerificationKey::try_from_pem(&key.pem) else {
            return false;
        };
        signatures.iter().any(|found| {
            signs_manifest(&found.payload, manifest_hex)
                && key_
                    .verify_signature(
                        Signature::Base64Encoded(found.signature.as_bytes()),
                        &found.payload,
                    )
                    .is_ok()
        })
    };
    let mut missing: Vec<String> = policy
        .all_of
        .iter()
        .filter(|key| !signed_by(key))
        .map(|key| format!("allOf key {} did not sign it", key.path.display()))
        .collect();
    if !policy.any_of.is_empty() && !policy.any_of.iter().any(signed_by) {
        missing.push(format!(
            "none of the anyOf keys ({}) signed it",
            policy
                .any_of
                .iter()
                .map(|key| key.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(SignatureError::NotSatisfied {
            manifest: manifest_hex.to_string(),
            found: signatures.len(),
            missing: missing.join("; "),
        })
    }
}

/// Whether a simple-signing payload is a cosign image signature of manifest
/// `sha256:<manifest_hex>`.
fn signs_manifest(payload: &[u8], manifest_hex: &str) -> bool {
    let Ok(payload) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return false;
    };
    let critical = &payload["critical"];
    critical["type"].as_str() == Some(SIGNATURE_TYPE)
        && critical["image"]["docker-manifest-digest"].as_str()
            == Some(format!("sha256:{manifest_hex}").as_str())
}

/// The simple-signing payload cosign signs for manifest `sha256:<manifest_hex>` of
/// `repository` (`registry/name`); for tests and tools that sign as cosign does.
pub fn simple_signing_payload(repository: &str, manifest_hex: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": { "docker-reference": repository },
            "image": { "docker-manifest-digest": format!("sha256:{manifest_hex}") },
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use sigstore::crypto::{SigStoreSigner, SigningScheme};

    fn key(signer: &SigStoreSigner, name: &str) -> PublicKey {
        PublicKey {
            path: format!("/keys/{name}.pub").into(),
            pem: signer
                .to_sigstore_keypair()
                .unwrap()
                .public_key_to_pem()
                .unwrap()
                .into_bytes(),
        }
    }

    fn sign(signer: &SigStoreSigner, payload: Vec<u8>) -> FoundSignature {
        let signature =
            base64::engine::general_purpose::STANDARD.encode(signer.sign(&payload).unwrap());
        FoundSignature { payload, signature }
    }

    #[test]
    fn all_of_and_any_of_over_this_manifest_only() {
        let release = SigningScheme::default().create_signer().unwrap();
        let team = SigningScheme::ED25519.create_signer().unwrap();
        let stranger = SigningScheme::default().create_signer().unwrap();
        let manifest = "a".repeat(64);
        let other = "b".repeat(64);
        let payload = || simple_signing_payload("r.example.com/m", &manifest);
        let all_of_release = SignaturePolicy {
            all_of: vec![key(&release, "release")],
            any_of: vec![],
        };

        assert_eq!(
            check(&all_of_release, &manifest, &[])
                .unwrap_err()
                .metric_outcome(),
            "unsigned"
        );
        check(&all_of_release, &manifest, &[sign(&release, payload())]).unwrap();
        // Signed by another key.
        let error = check(&all_of_release, &manifest, &[sign(&stranger, payload())]).unwrap_err();
        assert_eq!(error.metric_outcome(), "bad_signature");
        assert!(
            error
                .to_string()
                .contains("allOf key /keys/release.pub did not sign it"),
            "{error}"
        );
        // The right key, over another manifest (a replayed signature).
        let replayed = sign(&release, simple_signing_payload("r.example.com/m", &other));
        check(&all_of_release, &manifest, &[replayed]).unwrap_err();
        // The payload changed after signing.
        let mut tampered = sign(&release, payload());
        tampered.payload = simple_signing_payload("r.example.com/m2", &manifest);
        check(&all_of_release, &manifest, &[tampered]).unwrap_err();

        let both = SignaturePolicy {
            all_of: vec![key(&release, "release")],
            any_of: vec![key(&team, "team"), key(&stranger, "stranger")],
        };
        let error = check(&both, &manifest, &[sign(&release, payload())]).unwrap_err();
        assert!(
            error.to_string().contains("none of the anyOf keys"),
            "{error}"
        );
        check(
            &both,
            &manifest,
            &[sign(&release, payload()), sign(&team, payload())],
        )
        .unwrap();
        check(&both, &manifest, &[sign(&team, payload())]).unwrap_err();
    }
}
