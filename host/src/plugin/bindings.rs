//! Rust bindings of the WIT world in `wit/`: the host side of the guest contract.
//!
//! The generated types (`types::Claim`, `types::Volume`, ...) are the domain types the
//! rest of the host converts Kubernetes objects into and out of.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "provisioner",
});

pub use wasm_provisioner::plugin::log;
pub use wasm_provisioner::plugin::types;
