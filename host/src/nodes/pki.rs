//! The channel's keys. Each leader makes its own certificate authority when it starts
//! (in memory, never stored) and advertises the CA certificate on the Lease it holds;
//! it issues itself the leader's certificate and each enrolled instance one for its
//! node. A process that loses the Lease exits, so one CA lives exactly one term.
//!
//! Names, checked on both ends of every connection:
//! - the leader: `leader.wasm-provisioner.internal` (server for enrolment, client for calls);
//! - the instance of node N: `N.node.wasm-provisioner.internal` (server for calls).

use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::ClientConfig;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{RootCertStore, crypto::CryptoProvider};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The leader's name in its certificates.
pub const LEADER_NAME: &str = "leader.wasm-provisioner.internal";

/// How long an instance's certificate is valid; instances enrol again at half of it.
pub const NODE_CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// The name in the certificate of `node`'s instance.
pub fn node_name(node: &str) -> String {
    format!("{node}.node.wasm-provisioner.internal")
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("TLS client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    #[error("{0:?} is not a valid DNS name for a certificate")]
    Name(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const H2: &[u8] = b"h2";

/// A certificate chain and its key, as PEM.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        Ok(CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()?)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, PkiError> {
        Ok(PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?)
    }
}

/// The leader's certificate authority for its term.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    leader: Identity,
}

fn validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    // An hour back: clocks of nodes differ.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::try_from(valid_for).unwrap_or(time::Duration::DAY);
}

fn leaf(name: &str, valid_for: Duration) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::new(vec![name.to_string()])?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    validity(&mut params, valid_for);
    Ok(params)
}

impl Authority {
    /// A new CA (ECDSA P-256), and the leader's certificate from it.
    pub fn new() -> Result<Self, PkiError> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "wasm-provisioner leader term CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut params, Duration::from_secs(10 * 365 * 24 * 3600));
        let ca_cert = params.self_signed(&ca_key)?;
        let issuer = Issuer::new(params, ca_key);
        let mut authority = Self {
            issuer,
            ca_pem: ca_cert.pem(),
            leader: Identity {
                cert_pem: String::new(),
                key_pem: String::new(),
            },
        };
        authority.leader =
            authority.issue(LEADER_NAME, Duration::from_secs(10 * 365 * 24 * 3600))?;
        Ok(authority)
    }

    /// The leader's own key and certificate.
    pub fn leader(&self) -> &Identity {
        &self.leader
    }

    /// The CA certificate, as the Lease advertises it.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn issue(&self, name: &str, valid_for: Duration) -> Result<Identity, PkiError> {
        let key = KeyPair::generate()?;
        let cert = leaf(name, valid_for)?.signed_by(&key, &self.issuer)?;
        Ok(Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A key and certificate for the instance of `node`.
    pub fn issue_node(&self, node: &str) -> Result<Identity, PkiError> {
        let name = node_name(node);
        ServerName::try_from(name.clone()).map_err(|_| PkiError::Name(name.clone()))?;
        self.issue(&name, NODE_CERT_VALIDITY)
    }

    /// The leader's server side: enrolment, no client certificate (the request carries
    /// the instance's ServiceAccount token).
    pub fn leader_server_config(&self) -> Result<Arc<ServerConfig>, PkiError> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.leader.chain()?, self.leader.key()?)?;
        config.alpn_protocols = vec![H2.to_vec()];
        Ok(Arc::new(config))
    }

    /// The leader's client side: it trusts only its own CA and shows its certificate.
    pub fn leader_client_config(&self) -> Result<Arc<ClientConfig>, PkiError> {
        client_config(&self.ca_pem, Some(&self.leader))
    }
}

fn roots(ca_pem: &str) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    Ok(roots)
}

/// A client that trusts only the CA in `ca_pem`, showing `identity` if given.
pub fn client_config(
    ca_pem: &str,
    identity: Option<&Identity>,
) -> Result<Arc<ClientConfig>, PkiError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?);
    let mut config = match identity {
        Some(identity) => builder.with_client_auth_cert(identity.chain()?, identity.key()?)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![H2.to_vec()];
    Ok(Arc::new(config))
}

/// An instance's server side: its node's certificate; a client must show a certificate
/// of the same CA (the handler then checks it is the leader's).
pub fn instance_server_config(
    ca_pem: &str,
    identity: &Identity,
) -> Result<Arc<ServerConfig>, PkiError> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
            .build()?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain()?, identity.key()?)?;
    config.alpn_protocols = vec![H2.to_vec()];
    Ok(Arc::new(config))
}

/// Whether `cert` (already verified against the CA) names `name`.
pub fn names(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(end_entity) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    let Ok(server_name) = ServerName::try_from(name) else {
        return false;
    };
    end_entity
        .verify_is_valid_for_subject_name(&server_name)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_certificate_names_its_node_only() {
        let authority = Authority::new().unwrap();
        let node = authority.issue_node("node-b").unwrap();
        let chain = node.chain().unwrap();
        assert!(names(&chain[0], &node_name("node-b")));
        assert!(!names(&chain[0], &node_name("node-c")));
        assert!(!names(&chain[0], LEADER_NAME));
        let leader = authority.leader.chain().unwrap();
        assert!(names(&leader[0], LEADER_NAME));
        // Both ends build their configurations from these.
        instance_server_config(authority.ca_pem(), &node).unwrap();
        authority.leader_client_config().unwrap();
        authority.leader_server_config().unwrap();
    }
}
