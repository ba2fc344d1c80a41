//! Test support for wasm-provisioner's integration and end-to-end tests.
//!
//! - [`access`]: a host that runs with exactly the RBAC of `deploy/rbac.yaml` (or less).
//! - [`cluster`]: a real control plane (etcd, kube-apiserver, kube-controller-manager),
//!   admin and ServiceAccount clients, a fresh namespace per test.
//! - [`guests`]: the guest components built from `guests/`.
//! - [`host`]: the `wasm-provisioner` binary as a child process.
//! - [`kubeconfig`]: kubeconfig files that carry a ServiceAccount's token.
//! - [`fixture`]: one end-to-end scenario (namespace, provisioner name, modules, grants).

pub mod access;
pub mod cluster;
pub mod fixture;
pub mod guests;
pub mod host;
pub mod kubeconfig;
