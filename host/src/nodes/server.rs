//! Every instance's side of the channel, on `--node-address`. What it serves depends on
//! the process's role in the current term:
//! - waiting (not enrolled yet, or a new term seen): every connection is dropped;
//! - an enrolled instance: guest calls for its own node, from the leader of its term
//!   only (the client's certificate must chain to that term's CA and name the leader);
//! - the leader: enrolment of the other instances (the leader serves its own node in
//!   process).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use wasm_provisioner_runtime::Runtime;

use super::backends::execute;
use super::enroller::Enroller;
use super::pki;
use super::wire::{CALLS_PATH, ENROLL_PATH, Enrollment, NodeCall};

/// The largest request body the channel takes (a call's request is a few KiB).
const MAX_BODY_BYTES: usize = 4 << 20;

/// What this process serves on the channel now.
#[derive(Clone)]
pub enum Role {
    Waiting,
    Instance {
        config: Arc<ServerConfig>,
        term: i32,
        /// The CA of the leader it enrolled with (PEM): a new one is a new leader.
        ca_pem: Arc<str>,
        enrolled_at: Instant,
    },
    Leader {
        config: Arc<ServerConfig>,
        enroller: Arc<Enroller>,
    },
}

impl Role {
    /// The leader this process is enrolled with as an instance: its term and CA.
    pub fn enrolment(&self) -> Option<(i32, &str)> {
        match self {
            Role::Instance { term, ca_pem, .. } => Some((*term, ca_pem)),
            _ => None,
        }
    }
}

/// The channel's server state.
pub struct Channel {
    /// The node this instance serves; none for a controller (`--node-local-role=controller`),
    /// which serves enrolment only.
    pub own_node: Option<String>,
    pub runtime: Arc<Runtime>,
    pub role: watch::Sender<Role>,
}

/// Serves the channel on `listener` until `stop`.
pub async fn serve(listener: TcpListener, channel: Arc<Channel>, stop: CancellationToken) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "node channel: accept failed");
                    continue;
                }
            },
        };
        let channel = channel.clone();
        tokio::spawn(async move {
            if let Err(error) = connection(channel, tcp, peer).await {
                debug!(%peer, %error, "node channel: connection ended");
            }
        });
    }
}

async fn connection(
    channel: Arc<Channel>,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Result<(), String> {
    let role = channel.role.borrow().clone();
    let config = match &role {
        Role::Waiting => return Err("not enrolled yet: connection dropped".into()),
        Role::Instance { config, .. } | Role::Leader { config, .. } => config.clone(),
    };
    let tls = TlsAcceptor::from(config)
        .accept(tcp)
        .await
        .map_err(|error| format!("TLS handshake refused: {error}"))?;
    let from_leader = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .is_some_and(|cert| pki::names(cert, pki::LEADER_NAME));
    let service = hyper::service::service_fn(move |request| {
        let (channel, role) = (channel.clone(), role.clone());
        async move {
            Ok::<_, std::convert::Infallible>(
                handle(&channel, &role, from_leader, peer, request).await,
            )
        }
    });
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await
        .map_err(|error| error.to_string())
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.into()))
        .expect("a static response")
}

fn refuse(status: StatusCode, why: String) -> Response<Full<Bytes>> {
    answer(status, why)
}

async fn body(request: http::Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|error| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("unreadable request: {error}"),
            )
        })
}

async fn handle(
    channel: &Channel,
    role: &Role,
    from_leader: bool,
    peer: SocketAddr,
    request: http::Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::POST {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "POST only".into());
    }
    match (request.uri().path(), role) {
        (CALLS_PATH, Role::Instance { term, ca_pem, .. }) => {
            if !from_leader {
                warn!(%peer, "node channel: refused a call from a client that is not the leader");
                return refuse(
                    StatusCode::FORBIDDEN,
                    "only the leader may call an instance".into(),
                );
            }
            let bytes = match body(request).await {
                Ok(bytes) => bytes,
                Err(refused) => return refused,
            };
            call(channel, *term, ca_pem, &bytes).await
        }
        (ENROLL_PATH, Role::Leader { enroller, .. }) => {
            let bytes = match body(request).await {
                Ok(bytes) => bytes,
                Err(refused) => return refused,
            };
            let Ok(enrollment) = serde_json::from_slice::<Enrollment>(&bytes) else {
                return refuse(StatusCode::BAD_REQUEST, "malformed enrolment".into());
            };
            match enroller.enroll(&enrollment.token).await {
                Ok(enrolled) => {
                    info!(%peer, node = %enrolled.node, term = enrolled.term, "node channel: enrolled an instance");
                    answer(
                        StatusCode::OK,
                        serde_json::to_vec(&enrolled).unwrap_or_default(),
                    )
                }
                Err(why) => {
                    warn!(%peer, %why, "node channel: enrolment refused");
                    refuse(StatusCode::FORBIDDEN, why)
                }
            }
        }
        (CALLS_PATH, _) => refuse(
            StatusCode::CONFLICT,
            "this process is not an enrolled instance now".into(),
        ),
        (ENROLL_PATH, _) => refuse(
            StatusCode::CONFLICT,
            "this process is not the leader now".into(),
        ),
        _ => refuse(StatusCode::NOT_FOUND, "no such path".into()),
    }
}

/// One guest call from the leader of `term` with CA `ca_pem` (the caller checked it is
/// the leader).
async fn call(channel: &Channel, term: i32, ca_pem: &str, bytes: &[u8]) -> Response<Full<Bytes>> {
    let call: NodeCall = match serde_json::from_slice(bytes) {
        Ok(call) => call,
        Err(error) => {
            return refuse(StatusCode::BAD_REQUEST, format!("malformed call: {error}"));
        }
    };
    if call.term != term {
        warn!(
            call_term = call.term,
            term, "node channel: refused a call of another term"
        );
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "the call is from the leader of term {}, this instance is enrolled in term {term}: a stale leader's call is refused",
                call.term
            ),
        );
    }
    let node = call.request.context().node.clone();
    let own_node = channel.own_node.as_deref().unwrap_or("no node");
    if node.is_none() || node != channel.own_node {
        warn!(node = ?node, own = %own_node, "node channel: refused a call for another node");
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "this instance serves {own_node} only; the call is for {}",
                node.as_deref().unwrap_or("no node")
            ),
        );
    }
    let Some(module) = channel.runtime.module(&call.module) else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "module {} is not loaded on node {} (yet?): check that instance's log",
                call.module, own_node
            ),
        );
    };
    // A newer term (this instance saw a new leader) cancels the call at once, as the
    // fence cancels a leader's own calls: the new leader re-sends it, and two calls for
    // one volume never run side by side.
    let mut roles = channel.role.subscribe();
    let answered = tokio::select! {
        answered = execute(&module, call.request) => answered,
        _ = roles.wait_for(|role| role.enrolment() != Some((term, ca_pem))) => {
            warn!(term, "node channel: the term ended during a call; cancelled it");
            return refuse(
                StatusCode::CONFLICT,
                format!("term {term} ended while the call ran: cancelled"),
            );
        }
    };
    answer(
        StatusCode::OK,
        serde_json::to_vec(&answered).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    //! The instance's refusals, over real TLS on loopback.
    use super::*;
    use crate::nodes::client::{connect, post};
    use crate::nodes::pki::{Authority, client_config, instance_server_config, node_name};
    use crate::nodes::wire::Request;
    use wasm_provisioner_rules::types::CallContext;
    use wasm_provisioner_runtime::RuntimeConfig;

    const TERM: i32 = 3;

    /// An instance of node-b enrolled in [`TERM`] with `authority`; its address.
    async fn instance(authority: &Authority) -> SocketAddr {
        let identity = authority.issue_node("node-b").unwrap();
        let channel = Arc::new(Channel {
            own_node: Some("node-b".into()),
            runtime: Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()),
            role: watch::channel(Role::Instance {
                config: instance_server_config(authority.ca_pem(), &identity).unwrap(),
                term: TERM,
                ca_pem: authority.ca_pem().into(),
                enrolled_at: Instant::now(),
            })
            .0,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, channel, CancellationToken::new()));
        address
    }

    fn call(term: i32, node: &str) -> Vec<u8> {
        serde_json::to_vec(&NodeCall {
            term,
            module: "hostpath".into(),
            request: Request::CheckPublishable {
                context: CallContext {
                    node: Some(node.into()),
                },
                volume_name: "pvc-1".into(),
                pv: Box::default(),
                module_mount_options: Vec::new(),
            },
        })
        .unwrap()
    }

    async fn send(
        config: Arc<rustls::ClientConfig>,
        address: SocketAddr,
        body: Vec<u8>,
    ) -> Result<Bytes, String> {
        let name = node_name("node-b");
        let mut sender = connect(config, address, &name).await?;
        post(&mut sender, &name, CALLS_PATH, body).await
    }

    #[tokio::test]
    async fn the_leader_s_call_for_this_node_and_term_gets_through() {
        let authority = Authority::new().unwrap();
        let address = instance(&authority).await;
        let leader = authority.leader_client_config().unwrap();
        // Past every check: the module is what is missing here.
        let error = send(leader, address, call(TERM, "node-b"))
            .await
            .unwrap_err();
        assert!(
            error.contains("503") && error.contains("not loaded"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_stale_leader_s_call_is_refused() {
        let authority = Authority::new().unwrap();
        let address = instance(&authority).await;
        let leader = authority.leader_client_config().unwrap();
        let error = send(leader, address, call(TERM - 1, "node-b"))
            .await
            .unwrap_err();
        assert!(error.contains("409") && error.contains("stale"), "{error}");
    }

    #[tokio::test]
    async fn a_call_for_another_node_is_refused() {
        let authority = Authority::new().unwrap();
        let address = instance(&authority).await;
        let leader = authority.leader_client_config().unwrap();
        let error = send(leader, address, call(TERM, "node-c"))
            .await
            .unwrap_err();
        assert!(
            error.contains("403") && error.contains("node-b only"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn another_instance_cannot_call_as_the_leader() {
        let authority = Authority::new().unwrap();
        let address = instance(&authority).await;
        // A compromised node holds a valid certificate of the same CA, for its own node.
        let node_a = authority.issue_node("node-a").unwrap();
        let config = client_config(authority.ca_pem(), Some(&node_a)).unwrap();
        let error = send(config, address, call(TERM, "node-b"))
            .await
            .unwrap_err();
        assert!(
            error.contains("403") && error.contains("only the leader"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_client_without_this_term_s_key_is_refused() {
        let authority = Authority::new().unwrap();
        let address = instance(&authority).await;
        // Another CA's leader (a forged or earlier term's), trusting this instance.
        let forged = Authority::new().unwrap();
        let config = client_config(authority.ca_pem(), Some(forged.leader())).unwrap();
        assert!(send(config, address, call(TERM, "node-b")).await.is_err());
        // And no certificate at all.
        let config = client_config(authority.ca_pem(), None).unwrap();
        assert!(send(config, address, call(TERM, "node-b")).await.is_err());
    }
}
