//! Rust bindings of the two WIT packages in `wit/`: the host side of the guest contract.
//!
//! `v1` is `wasm-provisioner:plugin@0.1.0` (the world's functions exported at the
//! component's root); `v2` is `@0.2.0` (a `provisioner` interface plus optional ones).
//! The host links both into one linker; `guest.rs` tells a component's version from its
//! exports. The generated types are converted to the rules' types in `contract.rs`.
//!
//! Exports are generated `async`: every call runs under `call_async`, so an epoch
//! deadline can yield a spinning guest back to the tokio executor instead of pinning a
//! worker thread. The imports (`log`, and in 0.2 `filesystem`) are synchronous: a call
//! runs on a blocking thread of its own, so a slow filesystem blocks only that call.

pub mod v1 {
    wasmtime::component::bindgen!({
        path: "../../wit/0.1.0",
        world: "provisioner",
        exports: { default: async },
        additional_derives: [PartialEq],
    });

    pub use wasm_provisioner::plugin::log;
    pub use wasm_provisioner::plugin::types;
}

pub mod v2 {
    wasmtime::component::bindgen!({
        path: "../../wit/0.2.0",
        world: "plugin-with-every-capability",
        exports: { default: async },
        additional_derives: [PartialEq],
    });

    pub use exports::wasm_provisioner::plugin::{
        capacity_reporter, class_validator, expander, provisioner,
    };
    pub use wasm_provisioner::plugin::{filesystem, log, types};
}

/// The 0.1 log interface: its `Level` is the one the host's guest log speaks.
pub use v1::log;
