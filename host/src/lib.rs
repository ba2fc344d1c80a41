//! wasm-provisioner: a Kubernetes external volume provisioner host whose storage
//! backends are sandboxed WebAssembly components.
#![deny(unsafe_code)]

pub mod backoff;
pub mod decide;
pub mod names;
pub mod plugin;
pub mod quantity;
pub mod request;
pub mod volume;
