//! A local OCI registry for the tests: `crane registry serve` (go-containerregistry's
//! registry, the pinned crane of `deploy/tools.sh`) on a free port of 127.0.0.1, its
//! blobs on disk in a directory of its own, stopped when dropped. Modules are pushed
//! with the pinned `oras` in the wasm OCI artifact layout (`wkg` and `oras` produce it):
//! a config of media type `application/vnd.wasm.config.v0+json` and one
//! `application/wasm` layer.
//!
//! A registry that cannot start is a test failure with crane's own output, never a
//! skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::install::{run, tool};

/// The config media type of a wasm OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a wasm OCI artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// A running `crane registry serve`, plain HTTP on 127.0.0.1.
pub struct Registry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts a registry with its blobs under a fresh directory, and waits until it
    /// answers `GET /v2/`.
    pub fn start() -> anyhow::Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("wasm-provisioner-registry-")
            .tempdir()?;
        let port = crate::host::free_port();
        let log = dir.path().join("registry.log");
        let child = spawn(port, dir.path(), &log)?;
        let registry = Registry {
            child,
            port,
            dir,
            log,
        };
        registry.wait_ready()?;
        Ok(registry)
    }

    /// Stops the registry and starts it again on the same port and directory: a registry
    /// that was down for a while. Blobs stay (on disk); manifests and tags do not (crane
    /// keeps them in memory): push again what the test needs after it.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.child = spawn(self.port, self.dir.path(), &self.log)?;
        self.wait_ready()
    }

    /// Stops the registry (a registry that is down); [`Registry::restart`] brings it
    /// back.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `127.0.0.1:PORT`, the registry part of references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The directory the registry keeps its blobs in (`crane registry serve --disk`).
    pub fn disk(&self) -> &Path {
        self.dir.path()
    }

    /// The registry's log (crane's stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Pushes `wasm` as `REPOSITORY:TAG` in the wasm OCI artifact layout with `oras push`;
    /// returns the manifest's digest (`sha256:<hex>`).
    pub fn push_wasm(&self, repository: &str, tag: &str, wasm: &Path) -> anyhow::Result<String> {
        let work = tempfile::tempdir()?;
        // oras names the layer after the file and refuses absolute paths: push from a
        // directory holding only the module and its config.
        std::fs::copy(wasm, work.path().join("module.wasm"))
            .with_context(|| format!("cannot copy {}", wasm.display()))?;
        std::fs::write(
            work.path().join("config.json"),
            r#"{"architecture":"wasm","os":"wasip2"}"#,
        )?;
        let out = run(Command::new(tool("oras"))
            .current_dir(work.path())
            .args(["push", "--plain-http", "--no-tty"])
            .arg("--config")
            .arg(format!("config.json:{WASM_CONFIG_MEDIA_TYPE}"))
            .arg(format!("{}/{repository}:{tag}", self.host()))
            .arg(format!("module.wasm:{WASM_LAYER_MEDIA_TYPE}"))
            .args(["--format", "go-template={{.digest}}"]))?;
        let digest = out.trim().to_string();
        if !digest.starts_with("sha256:") || digest.len() != 71 {
            bail!("oras push printed {out:?}, not a sha256 digest");
        }
        Ok(digest)
    }

    /// Points `REPOSITORY:TAG` at the manifest `digest` (`sha256:<hex>`), as a re-tag
    /// by a release process does.
    pub fn tag(&self, repository: &str, digest: &str, tag: &str) -> anyhow::Result<()> {
        run(Command::new(tool("oras"))
            .args(["tag", "--plain-http"])
            .arg(format!("{}/{repository}@{digest}", self.host()))
            .arg(tag))?;
        Ok(())
    }

    /// Signs manifest `digest` (`sha256:<hex>`) of `repository` with `signer` as
    /// `cosign sign --key` does: the simple-signing payload as the one layer of the
    /// manifest tagged `sha256-<hex>.sig`, its signature (base64) in the layer's
    /// `dev.cosignproject.cosign/signature` annotation. Replaces any signature there.
    pub fn sign(
        &self,
        repository: &str,
        digest: &str,
        signer: &sigstore::crypto::SigStoreSigner,
    ) -> anyhow::Result<()> {
        use base64::Engine as _;
        use wasm_provisioner_runtime::source::verify;
        let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
        let payload = verify::simple_signing_payload(&format!("{}/{repository}", self.host()), hex);
        let signature = base64::engine::general_purpose::STANDARD.encode(
            signer
                .sign(&payload)
                .map_err(|error| anyhow::anyhow!("signing: {error}"))?,
        );
        let work = tempfile::tempdir()?;
        std::fs::write(work.path().join("payload.json"), &payload)?;
        std::fs::write(work.path().join("config.json"), "{}")?;
        std::fs::write(
            work.path().join("annotations.json"),
            serde_json::to_vec(&serde_json::json!({
                "payload.json": { (verify::SIGNATURE_ANNOTATION): signature },
            }))?,
        )?;
        run(Command::new(tool("oras"))
            .current_dir(work.path())
            .args([
                "push",
                "--plain-http",
                "--no-tty",
                "--disable-path-validation",
            ])
            .args(["--annotation-file", "annotations.json"])
            .args([
                "--config",
                "config.json:application/vnd.oci.image.config.v1+json",
            ])
            .arg(format!(
                "{}/{repository}:{}",
                self.host(),
                verify::signature_tag(hex)
            ))
            .arg(format!(
                "payload.json:{}",
                verify::SIMPLE_SIGNING_MEDIA_TYPE
            )))?;
        Ok(())
    }

    /// Copies `REPOSITORY@DIGEST` or `REPOSITORY:TAG` with what it references into the
    /// OCI image layout `layout` as `tag`, as an admin fills an air-gapped cluster's
    /// module store (`oras cp --to-oci-layout`).
    pub fn copy_to_layout(&self, reference: &str, layout: &Path, tag: &str) -> anyhow::Result<()> {
        run(Command::new(tool("oras"))
            .args(["cp", "--from-plain-http", "--no-tty", "--to-oci-layout"])
            .arg(format!("{}/{reference}", self.host()))
            .arg(format!("{}:{tag}", layout.display())))?;
        Ok(())
    }

    /// The manifest `REPOSITORY@DIGEST` or `REPOSITORY:TAG` as the registry serves it.
    pub fn manifest(&self, reference: &str) -> anyhow::Result<serde_json::Value> {
        let out = run(Command::new(tool("crane"))
            .args(["manifest", "--insecure"])
            .arg(format!("{}/{reference}", self.host())))?;
        Ok(serde_json::from_str(&out)?)
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if v2_answers(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the local registry (crane registry serve on port {}) did not answer GET /v2/ \
                     within 30s; its log:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn spawn(port: u16, dir: &Path, log: &Path) -> anyhow::Result<Child> {
    let blobs = dir.join("blobs");
    std::fs::create_dir_all(&blobs)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(tool("crane"))
        .args(["registry", "serve", "--address"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--disk")
        .arg(&blobs)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start crane registry serve")
}

/// Whether `GET /v2/` on the port answers 200.
fn v2_answers(port: u16) -> bool {
    crate::host::http_get(port, "/v2/").is_ok_and(|(status, _)| status == 200)
}

/// A mirror in front of a [`Registry`] that serves what the registry serves, except the
/// blobs it is told to tamper with: those it answers itself with their bytes changed,
/// length kept (a compromised mirror or cache, or bytes changed on the wire; `crane
/// registry serve` itself refuses to serve a blob that does not match its digest). Plain
/// HTTP on 127.0.0.1, one thread per connection, one request per connection.
pub struct TamperingMirror {
    port: u16,
    tampered: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl TamperingMirror {
    /// Starts a mirror of `registry`.
    pub fn start(registry: &Registry) -> anyhow::Result<TamperingMirror> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let upstream = registry.port;
        let blobs = registry.dir.path().join("blobs/sha256");
        let tampered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let list = tampered.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let list = list.clone();
                let blobs = blobs.clone();
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let _ = forward(&mut stream, upstream, &|head: &[String]| {
                        tampered_blob(head, &blobs, &list)
                    });
                });
            }
        });
        Ok(TamperingMirror { port, tampered })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// From now on, blob `digest` (`sha256:<hex>`) is served with its bytes changed.
    pub fn tamper(&self, digest: &str) {
        self.tampered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(digest.to_string());
    }
}

/// The mirror's answer to a request for a tampered blob: its bytes with one flipped, so
/// they no longer match the digest asked for; `None` for any other request.
fn tampered_blob(
    head: &[String],
    blobs: &Path,
    tampered: &std::sync::Mutex<Vec<String>>,
) -> Option<Vec<u8>> {
    let request_line = head.first()?;
    if !request_line.starts_with("GET ") {
        return None;
    }
    let path = request_line.split_whitespace().nth(1)?;
    let (_, digest) = path.rsplit_once("/blobs/")?;
    if !tampered
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|listed| listed == digest)
    {
        return None;
    }
    let mut bytes = std::fs::read(blobs.join(digest.trim_start_matches("sha256:"))).ok()?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        bytes.len()
    )
    .into_bytes();
    answer.extend_from_slice(&bytes);
    Some(answer)
}

/// An HTTPS front for a [`Registry`]: TLS with a certificate for 127.0.0.1 from a CA of
/// its own (as a private registry's), and HTTP basic authentication when given
/// credentials (as a registry behind a pull secret); every request is passed on to the
/// registry. One thread per connection, one request per connection.
pub struct TlsFront {
    port: u16,
    ca_pem: String,
}

impl TlsFront {
    /// Starts the front; `credentials` (user, password) are then required.
    pub fn start(
        registry: &Registry,
        credentials: Option<(&str, &str)>,
    ) -> anyhow::Result<TlsFront> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let cert =
            CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )?,
        );
        let expected = credentials.map(|(user, password)| {
            use base64::Engine as _;
            format!(
                "basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let upstream = registry.port;
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let config = config.clone();
                let expected = expected.clone();
                std::thread::spawn(move || {
                    let Ok(connection) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(connection, tcp);
                    let _ = forward(&mut tls, upstream, &|head: &[String]| {
                        let expected = expected.as_ref()?;
                        let authorized = head.iter().any(|line| {
                            line.to_ascii_lowercase()
                                .strip_prefix("authorization:")
                                .is_some_and(|value| value.trim() == expected.to_ascii_lowercase())
                        });
                        (!authorized).then(|| {
                            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"registry\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
                        })
                    });
                    tls.conn.send_close_notify();
                    let _ = std::io::Write::flush(&mut tls);
                });
            }
        });
        Ok(TlsFront {
            port,
            ca_pem: ca_cert.pem(),
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The CA that signed its certificate (PEM), for the grants file's `caFile`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// Reads one request from `client`; answers it with `intercept`'s bytes when it gives
/// some, else passes it on to the registry on `upstream` (as HTTP/1.0, so the registry
/// closes after its answer) and copies the answer back.
fn forward(
    client: &mut (impl std::io::Read + std::io::Write),
    upstream: u16,
    intercept: &dyn Fn(&[String]) -> Option<Vec<u8>>,
) -> std::io::Result<()> {
    use std::io::{Read as _, Write as _};
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        raw.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let head: Vec<String> = text
        .split_inclusive("\r\n")
        .map(str::to_string)
        .filter(|line| line != "\r\n")
        .collect();
    if let Some(answer) = intercept(&head) {
        client.write_all(&answer)?;
        return client.flush();
    }
    let mut registry = std::net::TcpStream::connect(("127.0.0.1", upstream))?;
    let mut forwarded = head[0].replacen("HTTP/1.1", "HTTP/1.0", 1);
    let mut content_length = 0usize;
    for line in &head[1..] {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("host:") {
            forwarded.push_str(&format!("Host: 127.0.0.1:{upstream}\r\n"));
        } else if lower.starts_with("connection:") || lower.starts_with("authorization:") {
            continue;
        } else {
            if let Some(value) = lower.strip_prefix("content-length:") {
                content_length = value.trim().parse().unwrap_or(0);
            }
            forwarded.push_str(line);
        }
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    registry.write_all(forwarded.as_bytes())?;
    let mut body = vec![0u8; content_length];
    client.read_exact(&mut body)?;
    registry.write_all(&body)?;
    let mut answer = Vec::new();
    registry.read_to_end(&mut answer)?;
    client.write_all(&answer)?;
    client.flush()
}
