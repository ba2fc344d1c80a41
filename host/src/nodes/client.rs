//! The leader's side of the channel: each call for another node goes to that node's
//! instance over one HTTP/2 connection per instance (mutual TLS, the instance's
//! certificate must name the node), bounded by the module's timeout plus
//! [`NETWORK_MARGIN`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use wasm_provisioner_runtime::{CallError, LoadedModule};

use super::instances::Instances;
use super::pki;
use super::wire::{CALLS_PATH, NodeCall, Request};
use crate::metrics::Metrics;

/// What a call to another node may take beyond the module's own timeout.
pub const NETWORK_MARGIN: Duration = Duration::from_secs(5);

/// How long connecting to an instance may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens an HTTP/2 connection over TLS to `address`, whose certificate must name
/// `server_name` and chain to `config`'s CA.
pub(super) async fn connect(
    config: Arc<ClientConfig>,
    address: SocketAddr,
    server_name: &str,
) -> Result<SendRequest<Full<Bytes>>, String> {
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|error| format!("{server_name:?} is no valid TLS name: {error}"))?;
    let connecting = async {
        let tcp = TcpStream::connect(address)
            .await
            .map_err(|error| format!("cannot connect to {address}: {error}"))?;
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|error| {
                format!(
                    "TLS with {address} failed (is it enrolled with this leader's term?): {error}"
                )
            })?;
        let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|error| format!("HTTP/2 with {address} failed: {error}"))?;
        tokio::spawn(connection);
        Ok(sender)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| format!("connecting to {address} took longer than {CONNECT_TIMEOUT:?}"))?
}

/// POSTs `body` to `path`; the answer's body when the status is 2xx.
pub(super) async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    server_name: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Bytes, String> {
    let request = http::Request::post(format!("https://{server_name}{path}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|error| error.to_string())?;
    sender
        .ready()
        .await
        .map_err(|error| format!("the connection closed: {error}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("the request failed on the wire: {error}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| format!("the answer was cut off: {error}"))?
        .to_bytes();
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!(
            "refused ({status}): {}",
            String::from_utf8_lossy(&body).trim()
        ))
    }
}

struct Connection {
    pod_uid: String,
    sender: SendRequest<Full<Bytes>>,
}

/// The leader's connections to the other nodes' instances, for its term.
pub struct Remote {
    config: Arc<ClientConfig>,
    term: i32,
    instances: Instances,
    metrics: Arc<Metrics>,
    connections: tokio::sync::Mutex<HashMap<String, Connection>>,
}

impl Remote {
    pub fn new(
        config: Arc<ClientConfig>,
        term: i32,
        instances: Instances,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            term,
            instances,
            metrics,
            connections: Default::default(),
        }
    }

    /// The directory of instances.
    pub fn instances(&self) -> &Instances {
        &self.instances
    }

    /// Runs `request` with `module` on `node`'s instance. Whatever keeps the answer
    /// from coming back is [`CallError::Unreachable`].
    pub async fn call<T: DeserializeOwned>(
        &self,
        module: &LoadedModule,
        node: &str,
        request: Request,
    ) -> Result<T, CallError> {
        let target = module.target(request.call());
        let unreachable = |cause: String| CallError::Unreachable {
            target: target.clone(),
            node: node.to_string(),
            cause,
        };
        let timeout = module.limits().timeout + NETWORK_MARGIN;
        let body = serde_json::to_vec(&NodeCall {
            term: self.term,
            module: module.name().to_string(),
            request,
        })
        .map_err(|error| unreachable(format!("the call could not be encoded: {error}")))?;
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, self.send(node, body))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer from its instance within {timeout:?} (the module's timeout and a network margin of {NETWORK_MARGIN:?})"
                ))
            });
        let decoded = answer.and_then(|bytes| {
            serde_json::from_slice::<Result<T, CallError>>(&bytes)
                .map_err(|error| format!("its instance's answer is malformed: {error}"))
        });
        let outcome = if decoded.is_ok() { "ok" } else { "unreachable" };
        self.metrics
            .node_call_duration
            .with_label_values(&[outcome])
            .observe(started.elapsed().as_secs_f64());
        decoded.map_err(unreachable)?
    }

    async fn send(&self, node: &str, body: Vec<u8>) -> Result<Bytes, String> {
        let (pod, mut sender) = self.connection(node).await?;
        let server_name = pki::node_name(node);
        match post(&mut sender, &server_name, CALLS_PATH, body).await {
            Ok(answer) => Ok(answer),
            Err(cause) => {
                self.connections.lock().await.remove(node);
                Err(format!("its instance (pod {pod}): {cause}"))
            }
        }
    }

    /// The open connection to `node`'s instance, or a new one.
    async fn connection(&self, node: &str) -> Result<(String, SendRequest<Full<Bytes>>), String> {
        // A new leader's first calls wait for the first list of the instances.
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, self.instances.ready()).await;
        let Some(instance) = self.instances.of_node(node) else {
            return Err(format!(
                "no wasm-provisioner instance runs on it (no pod matching {:?} with an IP on that node); the call is retried once one does",
                self.instances.selector()
            ));
        };
        if let Some(open) = self.connections.lock().await.get(node)
            && open.pod_uid == instance.uid
            && !open.sender.is_closed()
        {
            return Ok((instance.pod, open.sender.clone()));
        }
        // Not under the lock: a node that does not answer must not hold up the others.
        let sender = connect(self.config.clone(), instance.address, &pki::node_name(node))
            .await
            .map_err(|cause| format!("its instance (pod {}): {cause}", instance.pod))?;
        self.connections.lock().await.insert(
            node.to_string(),
            Connection {
                pod_uid: instance.uid.clone(),
                sender: sender.clone(),
            },
        );
        Ok((instance.pod, sender))
    }
}
