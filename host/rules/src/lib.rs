//! The provisioner's rules, as pure functions over Kubernetes objects and the guest
//! contract's types: what a claim asks for, whether and when to provision or delete, the
//! request a plugin receives, the PV its answer becomes, quantities, names, back-off.
//! No I/O: the controller observes and acts, the runtime calls guests; both ask here.
#![deny(unsafe_code)]

pub mod backoff;
pub mod claim;
pub mod decide;
pub mod expand;
pub mod names;
pub mod object;
pub mod quantity;
pub mod request;
pub mod secret;
pub mod types;
pub mod volume;
