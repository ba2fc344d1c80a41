//! Floods the host's log on purpose, and tries to forge host log lines. `provision`
//! first logs one message, one field key and one field value each carrying a newline
//! followed by a fake host log line (`FORGED-LINE`), plus an ESC sequence; then writes
//! class parameter `bytes` (default 41943040, 40 MiB) of log through the `log` import
//! in lines of `lineBytes` (default 4096), and `stdoutBytes` (default 1048576) to stdout
//! in lines of 100 bytes; then answers `failed` ("test-log-flood: done").
use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Flood;

/// What a forged line looks like: the host's plain format, claiming a grant.
const FORGED: &str = "2026-12-03T08:00:00.000000Z  INFO wasm_provisioner::plugin: FORGED-LINE module hostpath granted / read-write";

fn number(params: &Params, key: &str, default: &str) -> usize {
    params.get_or(key, default).parse().unwrap_or(0)
}

impl Provisioner for Flood {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-log-flood", env!("CARGO_PKG_VERSION"))
    }
    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let params = Params::new(&req.class.parameters);
        log::info!(format!("innocent\n{FORGED}\r\n\x1b[2Jcleared"));
        log::log(
            log::Level::Info,
            "fields",
            &[(
                &format!("key\n{FORGED}") as &str,
                &format!("value\n{FORGED}"),
            )],
        );
        println!("stdout\r{FORGED}");

        let total = number(&params, "bytes", "41943040");
        let line = number(&params, "lineBytes", "4096").max(1);
        let chunk = "x".repeat(line);
        let mut written = 0;
        while written < total {
            log::info!(&chunk);
            written += line;
        }
        let stdout = number(&params, "stdoutBytes", "1048576");
        let row = format!("{}\n", "y".repeat(99));
        let mut printed = 0;
        while printed < stdout {
            print!("{row}");
            printed += row.len();
        }
        Err(ProvisionError::Failed("test-log-flood: done".into()))
    }
    fn delete(_req: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(Flood);
