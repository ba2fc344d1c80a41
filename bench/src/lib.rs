//! The load benchmark (`bash bench/load.sh`, see docs/benchmarks.md, "Load benchmark"),
//! run by `src/bin/load.rs` against the control plane of the end-to-end tests
//! (`wasm_provisioner_tests`).
//!
//! - [`cpu`]: where a load run's CPU goes (the machine, the control plane, the host).
//! - [`load`]: the figures, tables and plot, and the Go library's provisioner
//!   (`bench/golib`) as a child process.

pub mod cpu;
pub mod load;
