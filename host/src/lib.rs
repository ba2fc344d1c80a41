//! wasm-provisioner: a Kubernetes external volume provisioner host whose storage
//! backends are sandboxed WebAssembly components.
//!
//! This crate is the part that talks to Kubernetes and the command line around it; the
//! rules it follows are in `wasm_provisioner_rules`, the guests run in
//! `wasm_provisioner_runtime` (see docs/architecture.md).
#![deny(unsafe_code)]

pub mod cli;
pub mod client;
pub mod controller;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod server;
