//! `describe` traps: a module version the host must refuse at load. The other calls
//! would answer `failed`, but a refused module is never called.
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct DescribeTrap;

impl Provisioner for DescribeTrap {
    fn describe() -> PluginInfo {
        panic!("test-describe-trap: describe traps on purpose")
    }
    fn provision(_: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        Err(ProvisionError::Failed(
            "test-describe-trap: must never be called".into(),
        ))
    }
    fn delete(_: &DeleteRequest) -> Result<(), DeleteError> {
        Err(DeleteError::Failed(
            "test-describe-trap: must never be called".into(),
        ))
    }
}

sdk::export!(DescribeTrap);
