//! End to end on the real control plane with the Python and JavaScript example guests
//! (`quota-dir`, `quota-dir-js`, built by `guests/build.sh` with the pinned
//! componentize-py and componentize-js): claims provisioned to Bound and deleted, their
//! refusals turned into the same Events as a Rust guest's, and a module too big for a
//! ConfigMap delivered the way an init container or a Job writing to a PVC does it
//! (copy to a temporary name in the directory, then rename), hot-reloaded.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use sha2::Digest as _;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::guests;
use wasm_provisioner_tests::host::Host;

/// Loading a 13-19 MB component compiles it (several seconds on two cores): the host
/// gets a compile cache, as in production, and the tests wait longer for a reload.
const RELOAD_WAIT: Duration = Duration::from_secs(120);

fn sha256_of(module: &str) -> String {
    hex::encode(sha2::Sha256::digest(
        std::fs::read(guests::module(module)).unwrap(),
    ))
}

/// The mean time of one guest call (fresh instance, call, answer checks) as the host's
/// `wasm_provisioner_guest_call_duration_seconds` histogram has it, over every outcome.
fn mean_call_seconds(host: &Host, module: &str, call: &str) -> Option<f64> {
    let (_, body) = host.get("/metrics").ok()?;
    let total = |suffix: &str| -> f64 {
        body.lines()
            .filter(|line| {
                line.starts_with(&format!(
                    "wasm_provisioner_guest_call_duration_seconds_{suffix}{{"
                )) && line.contains(&format!("module=\"{module}\""))
                    && line.contains(&format!("call=\"{call}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let count = total("count");
    (count > 0.0).then(|| total("sum") / count)
}

async fn python_or_js_guest_lives_and_refuses(built: &str) -> anyhow::Result<()> {
    let mut fx = Fixture::new(&format!("polyglot-{built}")).await?;
    fx.write_grants(&[built])?;
    fx.install_module(built, built);
    let class = fx
        .class(
            built,
            &[
                ("nodePath", "/var/lib/wasm-provisioner/quota"),
                ("maxSize", "2Gi"),
                ("poolSize", "2Gi"),
            ],
            json!({ "reclaimPolicy": "Delete" }),
        )
        .await?;
    let ignoring = fx
        .class(
            built,
            &[
                ("nodePath", "/var/lib/wasm-provisioner/quota"),
                ("maxSize", "2Gi"),
                ("namespaces", "some-other-team"),
            ],
            json!({}),
        )
        .await?;
    let cache = fx.root.join("cache");
    let host = fx.host(&[&format!("--cache-dir={}", cache.display())]);

    let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
    let pv = fx.wait_bound("data").await?;
    let uid = claim.uid().unwrap();
    assert_eq!(pv.name_any(), format!("pvc-{uid}"));
    assert_eq!(
        pv.annotations()
            .get("wasm-provisioner.dev/module-sha256")
            .map(String::as_str),
        Some(sha256_of(built).as_str())
    );
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| h.path.clone()),
        Some(format!("/var/lib/wasm-provisioner/quota/pvc-{uid}"))
    );
    let dir = fx.module_data(built).join(format!("pvc-{uid}"));
    assert!(dir.is_dir(), "{} was not created", dir.display());
    let record = fx
        .module_data(built)
        .join(".quota-dir")
        .join(format!("pvc-{uid}"));
    assert!(record.is_file(), "no usage record {}", record.display());

    // Refusals become the Events a Rust guest's do.
    fx.claim("too-big", &class, "3Gi", json!({})).await?;
    let note = fx.wait_claim_event("too-big", "ProvisioningFailed").await?;
    assert!(note.contains("maxSize 2Gi"), "infeasible: {note}");
    fx.claim("no-room", &class, "2Gi", json!({})).await?;
    let note = fx.wait_claim_event("no-room", "ProvisioningFailed").await?;
    assert!(note.contains("the pool is full"), "failed: {note}");
    // Ignored: no Warning and no PV; the claim stays Pending.
    fx.claim("not-mine", &ignoring, "1Gi", json!({})).await?;

    fx.claims().delete("data", &DeleteParams::default()).await?;
    fx.wait_volume_gone(&pv.name_any()).await?;
    assert!(!dir.exists(), "{} survived the delete", dir.display());
    assert!(!record.exists(), "{} survived the delete", record.display());
    // With the pool's space back, the failed claim is provisioned on a retry.
    fx.wait_bound("no-room").await?;

    let events = fx.events(&fx.ctx.namespace, "not-mine").await?;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "ProvisioningFailed"),
        "an ignored claim got a Warning: {events:?}"
    );
    let not_mine = fx.claims().get("not-mine").await?;
    assert_eq!(
        not_mine.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    // For the guide's table (run with --nocapture to see it).
    for call in ["provision", "delete"] {
        if let Some(mean) = mean_call_seconds(&host, built, call) {
            eprintln!("{built}: mean `{call}` call {:.2} ms", mean * 1000.0);
        }
    }
    drop(host);
    fx.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn python_guest_provisions_to_bound_refuses_and_deletes() -> anyhow::Result<()> {
    python_or_js_guest_lives_and_refuses("quota-dir").await
}

#[tokio::test]
async fn javascript_guest_provisions_to_bound_refuses_and_deletes() -> anyhow::Result<()> {
    python_or_js_guest_lives_and_refuses("quota-dir-js").await
}

/// The delivery for modules over a ConfigMap's 1 MiB: a directory the host watches
/// (an emptyDir an init container fills, or a PVC a Job writes) where a new version is
/// copied to a temporary name starting with `.` and renamed over the old one. The new
/// version serves without a restart. A copy written in place, slowly (`kubectl cp`,
/// `rsync --inplace`), is refused while it is incomplete and served once complete.
#[tokio::test]
async fn a_big_module_copied_in_and_renamed_is_hot_reloaded() -> anyhow::Result<()> {
    let mut fx = Fixture::new("polyglot-big").await?;
    fx.write_grants(&["quota"])?;
    fx.install_module("quota-dir", "quota");
    let class = fx
        .class(
            "quota",
            &[
                ("nodePath", "/var/lib/wasm-provisioner/quota"),
                ("maxSize", "2Gi"),
            ],
            json!({}),
        )
        .await?;
    let cache = fx.root.join("cache");
    let host = fx.host(&[&format!("--cache-dir={}", cache.display())]);
    let reloads = r#"wasm_provisioner_module_reloads_total{module="quota"}"#;
    fx.claim("first", &class, "1Gi", json!({})).await?;
    let first = fx.wait_bound("first").await?;
    assert_eq!(
        first.annotations()["wasm-provisioner.dev/module-sha256"],
        sha256_of("quota-dir")
    );
    assert_eq!(host.metric(reloads), Some(1.0));

    // As an init container or a Job does: copy aside in the same directory, rename.
    let staging = fx.modules.join(".quota.wasm.staging");
    std::fs::copy(guests::module("quota-dir-js"), &staging)?;
    std::fs::rename(&staging, fx.modules.join("quota.wasm"))?;
    wait_for("the renamed version in service", RELOAD_WAIT, || async {
        Ok(host.metric(reloads).filter(|n| *n >= 2.0).map(|_| ()))
    })
    .await?;
    fx.claim("second", &class, "1Gi", json!({})).await?;
    let second = fx.wait_bound("second").await?;
    assert_eq!(
        second.annotations()["wasm-provisioner.dev/module-sha256"],
        sha256_of("quota-dir-js")
    );

    // Written in place, in chunks with pauses: the half-written file is refused (the
    // JavaScript version keeps serving), the complete one served.
    let bytes = std::fs::read(guests::module("quota-dir"))?;
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(fx.modules.join("quota.wasm"))?;
        for chunk in bytes.chunks(bytes.len() / 4 + 1) {
            file.write_all(chunk)?;
            file.flush()?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
    wait_for("the in-place copy in service", RELOAD_WAIT, || async {
        Ok(host.metric(reloads).filter(|n| *n >= 3.0).map(|_| ()))
    })
    .await?;
    fx.claim("third", &class, "1Gi", json!({})).await?;
    let third = fx.wait_bound("third").await?;
    assert_eq!(
        third.annotations()["wasm-provisioner.dev/module-sha256"],
        sha256_of("quota-dir")
    );
    // Volumes made by one version are deleted by another (the contract is the same).
    for claim in ["first", "second", "third"] {
        fx.claims().delete(claim, &DeleteParams::default()).await?;
    }
    for pv in [&first, &second, &third] {
        fx.wait_volume_gone(&pv.name_any()).await?;
    }
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// Without a cluster, through the runtime calls the controller makes: the Python
/// example's capabilities (`validate-class`, `expand`) are what `describe` lists, the
/// host links their interfaces, a bad class is refused with its reason, and a volume
/// grows up to `maxSize` and no further.
#[tokio::test]
async fn python_guest_capabilities_answer_through_the_runtime() -> anyhow::Result<()> {
    use wasm_provisioner_rules::types::{Capability, ExpandError, ExpandRequest, PublishedVolume};
    use wasm_provisioner_runtime::ContractVersion;

    let granted = tempfile::tempdir()?;
    let runtime = guests::runtime(&format!(
        "allow: {{ directories: [{root}] }}\n\
         modules:\n  quota-dir:\n    directories: [{{ host: {root}, guest: /volumes, mode: read-write }}]\n",
        root = granted.path().display()
    ));
    let module = guests::load(&runtime, "quota-dir", "quota-dir").await;
    assert_eq!(module.contract(), ContractVersion::V0_2);
    assert_eq!(
        module.info().capabilities,
        [Capability::Expand, Capability::ValidateClass]
    );
    assert!(module.has(Capability::ValidateClass) && !module.has(Capability::ReportCapacity));

    let parameters = [("nodePath", "/var/lib/quota"), ("maxSize", "2Gi")];
    let request = guests::provision_request(&parameters);
    assert_eq!(module.validate_class(&request.class).await?, Ok(()));
    let typo = guests::provision_request(&[("nodepath", "/var/lib/quota"), ("maxSize", "2Gi")]);
    let refusal = module
        .validate_class(&typo.class)
        .await?
        .expect_err("a typo is refused");
    assert!(
        refusal.contains("unknown StorageClass parameter(s) nodepath"),
        "{refusal}"
    );

    let volume = module
        .provision(&request)
        .await?
        .map_err(|e| anyhow::anyhow!("provision: {e:?}"))?;
    let expand = |bytes: u64| ExpandRequest {
        volume: PublishedVolume {
            name: request.volume_name.clone(),
            source: volume.source.clone(),
            capacity_bytes: volume.capacity_bytes,
            labels: volume.labels.clone(),
            annotations: volume.annotations.clone(),
            node_affinity: volume.node_affinity.clone(),
            claim_namespace: Some("default".into()),
            claim_name: Some("data".into()),
        },
        class_name: request.class.name.clone(),
        class_parameters: request.class.parameters.clone(),
        requested_bytes: bytes,
        secret: None,
        context: Default::default(),
    };
    assert_eq!(module.expand(&expand(2 << 30)).await?, Ok(2 << 30));
    let record = granted.path().join(".quota-dir").join(&request.volume_name);
    assert!(std::fs::read_to_string(&record)?.starts_with("2147483648 "));
    match module.expand(&expand(3 << 30)).await? {
        Err(ExpandError::Infeasible(message)) => {
            assert!(message.contains("maxSize 2Gi"), "{message}")
        }
        other => panic!("beyond maxSize: {other:?}"),
    }
    assert!(std::fs::read_to_string(&record)?.starts_with("2147483648 "));
    Ok(())
}
