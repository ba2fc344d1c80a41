//! wasm-provisioner: a Kubernetes external volume provisioner host whose storage
//! backends are sandboxed WebAssembly components.
#![deny(unsafe_code)]

pub mod backoff;
pub mod claim;
pub mod cli;
pub mod client;
pub mod controller;
pub mod decide;
pub mod guest_cli;
pub mod guest_new;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plugin;
pub mod quantity;
pub mod request;
pub mod run;
pub mod server;
pub mod volume;
