//! Node-local mode (`run --mode=node-local`): the host runs as a DaemonSet. One
//! instance is elected leader on the Lease, as in Deployment mode, and is the only one
//! that watches and writes Kubernetes objects. Every instance serves the guest calls for
//! its own node: the leader runs a call for its own node in process and sends any other
//! to that node's instance over a mutually authenticated TLS channel.
//!
//! - [`pki`]: the leader's per-term CA and the certificates it issues;
//! - [`enroll`]: how an instance gets its node's certificate, and follows the
//!   leader's terms; [`enroller`]: the leader's side (TokenReview of the pod-bound
//!   token);
//! - [`server`]: what each instance serves; [`client`]: the leader's calls;
//! - [`instances`]: the leader's directory of instances (a watch of the DaemonSet's pods);
//! - [`backends`]: where the controllers' guest calls run, in either mode;
//! - [`wire`]: the messages.

pub mod backends;
pub mod client;
pub mod enroll;
pub mod enroller;
pub mod instances;
pub mod pki;
pub mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use prometheus::IntGauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use wasm_provisioner_runtime::Runtime;

pub use backends::Backends;

use crate::metrics::Metrics;
use client::Remote;
use enroller::Enroller;
use instances::Instances;
use pki::Authority;
use server::{Channel, Role};

/// What a node-local process does (`--node-local-role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// Elects, leads and serves its own node.
    All,
    /// Elects and leads; serves no node.
    Controller,
    /// Serves its node; never elects, reads only the Lease.
    Node,
}

impl NodeRole {
    /// Whether this process takes part in the election.
    pub fn elects(self) -> bool {
        self != NodeRole::Node
    }
}

/// Node-local mode's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub role: NodeRole,
    /// This instance's node (`--node-name`). A controller serves no node; its node
    /// (if given) is only the node of a call for no node, served by that node's
    /// instance.
    pub node_name: Option<String>,
    /// This pod's IP, advertised to the instances when this process leads (`--pod-ip`);
    /// a node-role instance never leads and needs none.
    pub pod_ip: Option<IpAddr>,
    /// Where the channel listens (`--node-address`).
    pub address: SocketAddr,
    /// The projected ServiceAccount token (`--token-file`).
    pub token_file: PathBuf,
    /// The label selector of the instances' pods (`--instance-selector`).
    pub instance_selector: String,
    /// The host's namespace (the instances' pods are there).
    pub namespace: String,
    /// The leader's Lease (namespace, name): a node-role instance follows it.
    pub lease: (String, String),
}

/// One instance's part in node-local mode, from start to exit.
pub struct NodeLocal {
    settings: Settings,
    channel: Arc<Channel>,
    authority: Arc<Authority>,
    leases: Arc<watch::Sender<Option<Lease>>>,
    /// The channel's bound address.
    pub bound: SocketAddr,
}

impl NodeLocal {
    /// Binds the channel, and starts serving it and following the leader.
    pub async fn start(
        settings: Settings,
        runtime: Arc<Runtime>,
        identity: String,
        retry: Duration,
        enrolled: IntGauge,
        stop: CancellationToken,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(settings.address)
            .await
            .with_context(|| format!("binding the node channel's address {}", settings.address))?;
        let bound = listener.local_addr()?;
        // A controller serves no node: its channel answers enrolment only.
        let served = settings
            .node_name
            .clone()
            .filter(|_| settings.role != NodeRole::Controller);
        let channel = Arc::new(Channel {
            own_node: served.clone(),
            runtime,
            role: watch::channel(Role::Waiting).0,
        });
        tokio::spawn(server::serve(listener, channel.clone(), stop.clone()));
        let leases = Arc::new(watch::channel(None).0);
        if let Some(node) = served {
            tokio::spawn(enroll::follow(
                channel.clone(),
                node,
                enrolled,
                leases.subscribe(),
                identity,
                settings.token_file.clone(),
                retry,
                stop,
            ));
        }
        info!(%bound, role = ?settings.role, node = ?settings.node_name, "node-local mode: serving the node channel");
        Ok(Self {
            authority: Arc::new(Authority::new().context("making the leader's CA")?),
            settings,
            channel,
            leases,
            bound,
        })
    }

    /// What the election writes on the Lease when this process leads.
    pub fn lease_annotations(&self) -> BTreeMap<String, String> {
        match self.settings.pod_ip {
            Some(ip) => {
                enroll::advert_annotations(&self.authority, SocketAddr::new(ip, self.bound.port()))
            }
            None => BTreeMap::new(),
        }
    }

    /// What this process does.
    pub fn role(&self) -> NodeRole {
        self.settings.role
    }

    /// A node-role instance: follows the Lease (a watch of that one object, all the API
    /// access it has) until `stop`, enrolling with each leader it names.
    pub async fn follow_lease(&self, client: Client, stop: CancellationToken) {
        let (namespace, name) = &self.settings.lease;
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        info!(lease = %name, "node-local mode: following the leader's Lease");
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                    self.leases.send_replace(Some(lease));
                }
                Some(Ok(watcher::Event::Delete(_))) => {
                    self.leases.send_replace(None);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    warn!(%error, lease = %name, "node-local mode: cannot watch the leader's Lease; retrying");
                }
                None => return,
            }
        }
    }

    /// Where the election publishes each Lease it sees.
    pub fn leases(&self) -> Arc<watch::Sender<Option<Lease>>> {
        self.leases.clone()
    }

    /// This process leads in `term`: it enrols the instances and sends them the calls
    /// for their nodes. The instances' watch runs until `stop`.
    pub async fn lead(
        &self,
        client: Client,
        capacity_client: Client,
        term: i32,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> anyhow::Result<Backends> {
        let port = self.bound.port();
        let instances = Instances::watch(
            client.clone(),
            &self.settings.namespace,
            &self.settings.instance_selector,
            port,
            stop,
        );
        let enroller = Arc::new(Enroller {
            client,
            authority: self.authority.clone(),
            instances: instances.clone(),
            namespace: self.settings.namespace.clone(),
            term,
        });
        self.channel.role.send_replace(Role::Leader {
            config: self.authority.leader_server_config()?,
            enroller,
        });
        let remote = Remote::new(
            self.authority.leader_client_config()?,
            term,
            instances,
            metrics,
        );
        info!(term, node = ?self.settings.node_name, "node-local mode: leading; other nodes' calls go to their instances");
        let pod_ip = self
            .settings
            .pod_ip
            .context("node-local mode: a leader needs --pod-ip")?;
        let publishing = backends::Publishing {
            client: capacity_client,
            namespace: self.settings.namespace.clone(),
            pod_ip,
        };
        Ok(Backends::node_local(
            self.settings.node_name.clone(),
            self.settings.role != NodeRole::Controller,
            remote,
            publishing,
        ))
    }
}
