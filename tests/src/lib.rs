//! Test support for wasm-provisioner's integration and end-to-end tests.
//!
//! - [`cluster`]: a real control plane (etcd, kube-apiserver, kube-controller-manager),
//!   admin and ServiceAccount clients, a fresh namespace per test.
//! - [`guests`]: the guest components built from `guests/`.

pub mod cluster;
pub mod guests;
