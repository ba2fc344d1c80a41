//! Test support for wasm-provisioner's integration and end-to-end tests.
//!
//! - [`access`]: a host that runs with exactly the RBAC of `deploy/rbac.yaml` (or less).
//! - [`bomb`]: a compile bomb, a small component that is slow and big to compile.
//! - [`cluster`]: a real control plane (etcd, kube-apiserver, kube-controller-manager),
//!   admin and ServiceAccount clients, a fresh namespace per test.
//! - [`guests`]: the guest components built from `guests/`.
//! - [`host`]: the `wasm-provisioner` binary as a child process.
//! - [`kubeconfig`]: kubeconfig files that carry a ServiceAccount's token.
//! - [`fixture`]: one end-to-end scenario (namespace, provisioner name, modules, grants).
//! - [`install`]: the install artefacts of `deploy/`: pinned tools, the chart, the
//!   kustomize base, the image tarball, server-side apply.
//! - [`kubelet`]: a rendered Deployment's or DaemonSet's pod run from the image as kubelet
//!   would run it, in a network namespace of its own on a bridge when given one.
//! - [`nodes`]: node-local mode's nodes, their instances' pods and tokens.
//! - [`metrics`]: the Prometheus text format and API request counts (the host's, the
//!   API server's), for the tests and the load benchmark (`bench/`).
//! - [`promql`]: the alert rules' and the dashboard's PromQL checked against the
//!   metrics a real host exports.
//! - [`registry`]: a local OCI registry (`crane registry serve`), modules pushed to it
//!   as wasm OCI artifacts with `oras`.

pub mod access;
pub mod bomb;
pub mod cluster;
pub mod fixture;
pub mod guests;
pub mod host;
pub mod install;
pub mod kubeconfig;
pub mod kubelet;
pub mod metrics;
pub mod nodes;
pub mod promql;
pub mod registry;
