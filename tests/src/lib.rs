//! Test support for wasm-provisioner's integration and end-to-end tests.
//!
//! - [`cluster`]: a real control plane (etcd, kube-apiserver, kube-controller-manager),
//!   admin and ServiceAccount clients, a fresh namespace per test.
//! - [`guests`]: the guest components built from `guests/`.
//! - [`host`]: the `wasm-provisioner` binary as a child process.
//! - [`kubeconfig`]: kubeconfig files that carry a ServiceAccount's token.
//! - [`fixture`]: one end-to-end scenario (namespace, provisioner name, modules, grants).
//! - [`load`]: the load benchmark's figures, table and plot (`src/bin/load.rs`).

pub mod cluster;
pub mod fixture;
pub mod guests;
pub mod host;
pub mod kubeconfig;
pub mod load;
