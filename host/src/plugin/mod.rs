//! The plugin runtime: loading, sandboxing and calling guest components.
pub mod bindings;
