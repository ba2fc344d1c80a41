//! A hostile guest that looks for what an earlier call left in its instance: the host
//! promises each call a fresh instance, its memory and globals as the module made them.
//!
//! `provision` with class parameter `plant` writes that text all over its instance: into
//! a static buffer, into leaked heap blocks, and into a 256 KiB heap block (past what a
//! call usually touches), and counts the call in a static. With `seekReversed` (the text
//! to look for, reversed, so the request never holds it forwards) it scans its whole
//! linear memory for the text, forwards, before planting anything. It always answers
//! `failed` with the message `leftover: calls <n>, found <m>`: `n` the calls this
//! instance has seen (1 in a fresh one), `m` the copies of the sought text it found.
use std::sync::atomic::{AtomicUsize, Ordering};

use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Leftover;

/// Calls this instance has seen.
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// A static buffer the plant is copied into (zero in a fresh instance).
static mut PLANTED: [u8; 4096] = [0; 4096];

/// Copies of the text `reversed` holds backwards, in linear memory from address 16 to
/// its end; compared byte by byte against the reversed text, so the forwards text is
/// never built in memory by the scan itself.
fn count_in_memory(reversed: &[u8]) -> usize {
    let n = reversed.len();
    if n == 0 {
        return 0;
    }
    let end = core::arch::wasm32::memory_size(0) * 65536;
    let mut found = 0;
    let mut address = 16;
    while address + n <= end {
        let matches = (0..n).all(|k| {
            // SAFETY: every address below memory_size * 64 KiB is in bounds of the
            // instance's linear memory; reading it is what this guest is for.
            let at = unsafe { core::ptr::read_volatile((address + k) as *const u8) };
            at == reversed[n - 1 - k]
        });
        if matches {
            found += 1;
        }
        address += 1;
    }
    found
}

/// Writes `plant` into a static buffer, leaked heap blocks and a large heap block.
fn plant(text: &str) {
    let bytes = text.as_bytes();
    let n = bytes.len().min(4096);
    // SAFETY: one call at a time per instance; nothing else touches PLANTED.
    unsafe {
        let planted = &mut *core::ptr::addr_of_mut!(PLANTED);
        planted[..n].copy_from_slice(&bytes[..n]);
    }
    for _ in 0..16 {
        Box::leak(text.to_string().into_boxed_str());
    }
    let mut large = Vec::with_capacity(256 << 10);
    while large.len() + bytes.len() <= large.capacity() {
        large.extend_from_slice(bytes);
    }
    Box::leak(large.into_boxed_slice());
}

impl Provisioner for Leftover {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-leftover", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let calls = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        let params = Params::new(&req.class.parameters);
        let found = params
            .get("seekReversed")
            .map_or(0, |reversed| count_in_memory(reversed.as_bytes()));
        if let Some(text) = params.get("plant") {
            plant(text);
        }
        Err(ProvisionError::Failed(format!(
            "leftover: calls {calls}, found {found}"
        )))
    }

    fn delete(_req: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(Leftover);
