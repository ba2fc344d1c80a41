//! Allocates without bound on purpose. `describe` works; the calls named in class
//! parameter `calls` (comma-separated: provision, delete; default `provision`) keep
//! allocating and filling 1 MiB chunks until the host stops them (or the allocator
//! fails, which traps).
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct MemoryBomb;

fn bomb_if(params: &[(String, String)], call: &str) {
    let calls = Params::new(params).get_or("calls", "provision");
    if calls.split(',').any(|c| c.trim() == call) {
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            chunks.push(vec![0xA5; 1 << 20]);
            std::hint::black_box(&chunks);
            if chunks.len().is_multiple_of(64) {
                sdk::log::info!("test-memory-bomb: holding", mib = chunks.len());
            }
        }
    }
}

impl Provisioner for MemoryBomb {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-memory-bomb", env!("CARGO_PKG_VERSION"))
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        bomb_if(&req.class.parameters, "provision");
        let path = format!("/memory-bomb/{}", req.volume_name);
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, None),
        ))
    }
    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        bomb_if(&req.class_parameters, "delete");
        Ok(())
    }
}

sdk::export!(MemoryBomb);
