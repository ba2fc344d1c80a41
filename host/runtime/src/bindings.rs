//! Rust bindings of the WIT world in `wit/`: the host side of the guest contract.
//!
//! The generated types (`types::Claim`, `types::Volume`, ...) are the domain types the
//! rest of the host converts Kubernetes objects into and out of.
//!
//! Exports are generated `async`: every call runs under `call_async`, so an epoch
//! deadline can yield a spinning guest back to the tokio executor instead of pinning a
//! worker thread. The one import, `log`, is synchronous and cannot fail.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "provisioner",
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use wasm_provisioner::plugin::log;
pub use wasm_provisioner::plugin::types;
