//! Guest logs are bounded and cannot forge host log lines (docs/security.md, "Sandbox and grants").
//!
//! The hostile guest `test-log-flood` logs 40 MiB through the `log` import and 1 MiB
//! to stdout in one `provision` call, after a message, a field key and a field value
//! that each carry a newline followed by a fake host log line (`FORGED-LINE`) and an
//! ESC sequence. The offline runner (the built binary, as a module author runs it) must
//! write a bounded log with one "N bytes of guest log dropped" line and no forged line,
//! in both log formats; the runtime must count the dropped bytes per module in
//! `wasm_provisioner_guest_log_dropped_bytes_total`.

mod common;
use common::dist_dir;

use std::path::PathBuf;
use std::process::{Command, Output};

use wasm_provisioner_rules::types::{
    AccessMode, BindingMode, Claim, Class, ProvisionError, ProvisionRequest, ReclaimPolicy,
    VolumeMode,
};
use wasm_provisioner_runtime::limits::DEFAULT_GUEST_LOG_BYTES_PER_CALL;
use wasm_provisioner_runtime::{Grants, Runtime, RuntimeConfig};

/// What the guest logs through the import by default: 40 MiB (+ 1 MiB of stdout).
const FLOOD_BYTES: u64 = 41_943_040;

fn flood_module() -> PathBuf {
    dist_dir().join("test-log-flood.wasm")
}

const CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: flood
provisioner: wasm-provisioner.dev
parameters:
  module: flood
"#;

const CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: default
  uid: 5a1d7a2e-0000-4000-8000-000000000009
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
  storageClassName: flood
"#;

/// `guest provision` of the flood module with `extra` flags; the whole output.
fn run_offline(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::copy(flood_module(), modules.join("flood.wasm")).unwrap();
    let class = dir.path().join("sc.yaml");
    let claim = dir.path().join("pvc.yaml");
    std::fs::write(&class, CLASS).unwrap();
    std::fs::write(&claim, CLAIM).unwrap();
    Command::new(env!("CARGO_BIN_EXE_wasm-provisioner"))
        .args(["guest", "provision", "--modules"])
        .arg(&modules)
        .arg("--class")
        .arg(&class)
        .arg("--claim")
        .arg(&claim)
        .args(extra)
        .env_clear()
        .env("WASM_PROVISIONER_LOG", "info")
        .output()
        .expect("running wasm-provisioner")
}

/// The N of the one "N bytes of guest log dropped" line.
fn dropped_bytes(stderr: &str) -> u64 {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("bytes of guest log dropped"))
        .collect();
    assert_eq!(lines.len(), 1, "one dropped-bytes line expected:\n{stderr}");
    let before = lines[0]
        .split(" bytes of guest log dropped")
        .next()
        .unwrap();
    let number = before.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap();
    number
        .parse()
        .unwrap_or_else(|_| panic!("no byte count in {:?}", lines[0]))
}

/// No host log line may come from the guest's text: no raw control character at all,
/// and the fake line only ever inside the guest's own (escaped) line.
fn assert_no_forged_line(stderr: &str) {
    for (index, c) in stderr.char_indices() {
        assert!(
            c == '\n' || !c.is_control(),
            "raw control character {c:?} at byte {index} of the log:\n{}",
            &stderr[index.saturating_sub(200)..(index + 200).min(stderr.len())]
        );
    }
    let forged: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("FORGED-LINE"))
        .collect();
    assert!(
        !forged.is_empty(),
        "the guest's lines are missing:\n{stderr}"
    );
    for line in forged {
        assert!(
            !line.starts_with("2026-12-03T08:00:00.000000Z"),
            "a forged line reached the log: {line}"
        );
        assert!(
            line.contains("\\n2026-12-03T08:00:00.000000Z")
                || line.contains("\\r2026-12-03T08:00:00.000000Z"),
            "the fake line must stay inside the guest's line, escaped: {line}"
        );
    }
}

#[test]
fn a_log_flood_is_cut_at_the_budget_and_reported_once() {
    let output = run_offline(&[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("test-log-flood: done"),
        "the guest answers failed after flooding; got {} with:\n{stderr}",
        output.status
    );
    // The budget plus one host line per guest line (each at most 4 KiB): far below the
    // 41 MiB the guest wrote.
    assert!(
        stderr.len() < 4 * DEFAULT_GUEST_LOG_BYTES_PER_CALL,
        "{} bytes of log for one call",
        stderr.len()
    );
    let dropped = dropped_bytes(&stderr);
    assert!(
        dropped >= FLOOD_BYTES,
        "only {dropped} bytes counted as dropped"
    );
    assert_no_forged_line(&stderr);
}

#[test]
fn the_budget_is_a_flag() {
    let output = run_offline(&["--guest-log-bytes-per-call", "300"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let guest_lines = stderr.lines().filter(|l| l.contains(" guest: ")).count();
    // The three hostile lines fit in 300 bytes; no 4 KiB flood line does.
    assert!(
        stderr.lines().all(|l| !l.contains("xxxxxxxx")),
        "a flood line passed a 300-byte budget:\n{stderr}"
    );
    assert!(guest_lines <= 5, "{guest_lines} guest lines:\n{stderr}");
    assert!(dropped_bytes(&stderr) >= FLOOD_BYTES);
    assert_no_forged_line(&stderr);
}

#[test]
fn json_logs_stay_one_object_per_line() {
    let output = run_offline(&["--log-format", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut guest_lines = 0;
    for line in stderr.lines().filter(|l| l.starts_with('{')) {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
        let text = value.to_string();
        if text.contains("FORGED-LINE") {
            guest_lines += 1;
            // Escaped by the host, not only by JSON: no newline even once decoded.
            let message = value["fields"]["message"].as_str().unwrap_or_default();
            let fields = value["fields"]["fields"].as_str().unwrap_or_default();
            assert!(
                !message.contains('\n') && !fields.contains('\n') && !message.contains('\u{1b}'),
                "a control character survived in {line}"
            );
        }
    }
    assert!(guest_lines >= 2, "the guest's lines are missing:\n{stderr}");
    assert!(dropped_bytes(&stderr) >= FLOOD_BYTES);
    assert_no_forged_line(&stderr);
}

#[tokio::test]
async fn dropped_bytes_are_counted_per_module() {
    let runtime = Runtime::new(RuntimeConfig {
        grants: Grants::none(),
        ..RuntimeConfig::default()
    })
    .unwrap();
    runtime
        .load_file("flood", &flood_module())
        .await
        .expect("the flood module loads");
    let module = runtime.module("flood").unwrap();
    let request = ProvisionRequest {
        volume_name: "pvc-5a1d7a2e-0000-4000-8000-000000000009".into(),
        claim: Claim {
            name: "data".into(),
            namespace: "default".into(),
            uid: "5a1d7a2e-0000-4000-8000-000000000009".into(),
            labels: vec![],
            annotations: vec![],
            access_modes: vec![AccessMode::ReadWriteOnce],
            requested_bytes: 1 << 30,
            limit_bytes: None,
            volume_mode: VolumeMode::Filesystem,
            data_source: None,
            selector: None,
        },
        class: Class {
            name: "flood".into(),
            parameters: vec![
                ("bytes".into(), "1000000".into()),
                ("stdoutBytes".into(), "0".into()),
            ],
            reclaim_policy: ReclaimPolicy::Delete,
            mount_options: vec![],
            allowed_topologies: vec![],
            binding_mode: BindingMode::Immediate,
            allow_volume_expansion: false,
        },
        selected_node: None,
        secret: None,
        context: Default::default(),
    };
    let answer = module.provision(&request).await.expect("the call succeeds");
    assert!(matches!(answer, Err(ProvisionError::Failed(_))));
    let dropped = runtime
        .metrics()
        .module("flood")
        .guest_log_dropped_bytes_total;
    assert!(
        (1_000_000 - DEFAULT_GUEST_LOG_BYTES_PER_CALL as u64..=1_001_000).contains(&dropped),
        "dropped {dropped} bytes"
    );

    let metrics = wasm_provisioner::metrics::Metrics::new();
    metrics.register_runtime(runtime.clone());
    let sample =
        format!("wasm_provisioner_guest_log_dropped_bytes_total{{module=\"flood\"}} {dropped}");
    let text = metrics.render();
    assert!(text.contains(&sample), "{sample} missing in:\n{text}");
}
