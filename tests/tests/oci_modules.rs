//! Modules pulled from an OCI registry (a real local registry, `crane registry serve`;
//! modules pushed by `oras` in the wasm artifact layout, signed as cosign does), served
//! by a real host on the real control plane: by digest and by tag, a re-tag hot-reloads,
//! a restart with the registry down pulls nothing (the module store), and what must
//! never run does not (tampered bytes, unsigned, signed by another key, too large
//! before download) while the last good version keeps serving.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sha2::Digest as _;
use sigstore::crypto::{SigStoreSigner, SigningScheme};
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, TEST_VOLUME_GRANTS, WAIT};
use wasm_provisioner_tests::guests;
use wasm_provisioner_tests::host::Host;
use wasm_provisioner_tests::registry::{Registry, TamperingMirror};

/// Two versions of one module that both serve the same classes: the last 0.1 contract
/// build of hostpath, and the current one.
fn old_hostpath() -> std::path::PathBuf {
    guests::fixture("hostpath-0.1.0")
}
fn new_hostpath() -> std::path::PathBuf {
    guests::module("hostpath")
}

fn sha256_of(path: &Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// The grants file: the registries (YAML entries), and per module its grants and
/// `source` (YAML lines under `source:`).
fn write_grants(
    fx: &Fixture,
    registries: &[String],
    modules: &[(&str, String)],
) -> anyhow::Result<()> {
    let mut text = format!(
        "allow:\n  directories: [{}]\nregistries:\n",
        fx.data.display()
    );
    for registry in registries {
        text.push_str(&format!("  - {registry}\n"));
    }
    text.push_str("modules:\n");
    for (module, source) in modules {
        let dir = fx.data.join(module);
        std::fs::create_dir_all(&dir)?;
        text.push_str(&format!(
            "  {module}:\n    source:\n{source}    directories:\n      - {{ host: {}, guest: /volumes, mode: read-write }}\n{TEST_VOLUME_GRANTS}",
            dir.display()
        ));
    }
    std::fs::write(&fx.grants, text)?;
    Ok(())
}

fn oci(registry: &Registry, reference: &str) -> String {
    format!("      oci: \"{}/{reference}\"\n", registry.host())
}

/// Whether `wasm_provisioner_module_version_info` says `sha256` serves `module`.
fn serving(host: &Host, module: &str, sha256: &str) -> bool {
    host.get("/metrics").is_ok_and(|(_, body)| {
        body.lines().any(|line| {
            line.starts_with("wasm_provisioner_module_version_info{")
                && line.contains(&format!("module=\"{module}\""))
                && line.contains(&format!("sha256=\"{sha256}\""))
                && line.ends_with(" 1")
        })
    })
}

async fn wait_serving(host: &Host, module: &str, sha256: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("module {module} serving sha256:{sha256}"),
        WAIT,
        || async { Ok(serving(host, module, sha256).then_some(())) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}\nhost log:\n{}", host.log_tail()))
}

fn pulls(host: &Host, module: &str, outcome: &str) -> f64 {
    host.metric(&format!(
        "wasm_provisioner_module_pulls_total{{module=\"{module}\",outcome=\"{outcome}\"}}"
    ))
    .unwrap_or(0.0)
}

async fn wait_pulls(host: &Host, module: &str, outcome: &str, at_least: f64) -> anyhow::Result<()> {
    wait_for(
        &format!("{outcome} pulls of module {module} >= {at_least}"),
        WAIT,
        || async { Ok((pulls(host, module, outcome) >= at_least).then_some(())) },
    )
    .await
    .map_err(|error| anyhow::anyhow!("{error}\nhost log:\n{}", host.log_tail()))
}

const NODE_PATH: (&str, &str) = ("nodePath", "/var/lib/wasm-provisioner/hostpath");

/// By digest and by tag; a re-tag to a new digest is hot-reloaded; a restart with the
/// registry down serves both from the module store, downloading nothing.
#[tokio::test]
async fn pulled_by_digest_and_tag_retag_reloads_restart_hits_the_store() -> anyhow::Result<()> {
    let mut fx = Fixture::new("oci-pull").await?;
    let mut registry = Registry::start()?;
    let v1 = registry.push_wasm("wp/hostpath", "v1", &old_hostpath())?;
    let v2 = registry.push_wasm("wp/hostpath", "v2", &new_hostpath())?;
    registry.tag("wp/hostpath", &v1, "stable")?;
    write_grants(
        &fx,
        &[format!(
            "{{ host: \"{}\", insecure: true }}",
            registry.host()
        )],
        &[
            ("tagged", oci(&registry, "wp/hostpath:stable")),
            ("pinned", oci(&registry, &format!("wp/hostpath@{v2}"))),
        ],
    )?;
    let store = fx.root.join("store");
    let flags = [
        format!("--module-store={}", store.display()),
        "--module-poll-interval=1s".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut host = fx.host(&flags);
    let tagged = fx.class("tagged", &[NODE_PATH], json!({})).await?;
    let pinned = fx.class("pinned", &[NODE_PATH], json!({})).await?;
    fx.claim("by-tag", &tagged, "1Mi", json!({})).await?;
    fx.claim("by-digest", &pinned, "1Mi", json!({})).await?;
    fx.wait_bound("by-tag").await?;
    fx.wait_bound("by-digest").await?;
    wait_serving(&host, "tagged", &sha256_of(&old_hostpath())).await?;
    wait_serving(&host, "pinned", &sha256_of(&new_hostpath())).await?;
    assert_eq!(pulls(&host, "pinned", "pulled"), 1.0, "{}", host.log_tail());
    // The store holds what was pulled, by digest.
    for digest in [&v1, &v2] {
        let hex = digest.trim_start_matches("sha256:");
        assert!(
            store.join("blobs/sha256").join(hex).is_file(),
            "manifest {digest} not in the store"
        );
    }

    // A re-tag: the tag is polled, the new digest pulled, the new version serves.
    registry.tag("wp/hostpath", &v2, "stable")?;
    wait_serving(&host, "tagged", &sha256_of(&new_hostpath())).await?;
    fx.claim("after-retag", &tagged, "1Mi", json!({})).await?;
    fx.wait_bound("after-retag").await?;
    // The digest is never resolved again: one pull, then nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pulls(&host, "pinned", "pulled"), 1.0);
    assert_eq!(pulls(&host, "pinned", "unchanged"), 0.0);
    assert!(pulls(&host, "tagged", "unchanged") >= 1.0);

    // The registry goes down: the tag's poll fails (after its retries), the version in
    // service keeps serving.
    registry.stop();
    wait_pulls(&host, "tagged", "registry_error", 1.0).await?;
    assert!(serving(&host, "tagged", &sha256_of(&new_hostpath())));
    fx.claim("registry-down", &tagged, "1Mi", json!({})).await?;
    fx.wait_bound("registry-down").await?;

    // A restart with the registry down: both served from the store.
    host.terminate(Duration::from_secs(30))?;
    let host = fx.host(&flags);
    wait_pulls(&host, "pinned", "store_hit", 1.0).await?;
    wait_pulls(&host, "tagged", "store_hit", 1.0).await?;
    wait_serving(&host, "pinned", &sha256_of(&new_hostpath())).await?;
    wait_serving(&host, "tagged", &sha256_of(&new_hostpath())).await?;
    fx.claim("after-restart", &pinned, "1Mi", json!({})).await?;
    fx.wait_bound("after-restart").await?;
    assert_eq!(pulls(&host, "pinned", "pulled"), 0.0, "{}", host.log_tail());
    fx.cleanup().await;
    Ok(())
}

fn public_key(dir: &Path, name: &str, signer: &SigStoreSigner) -> String {
    let pem = signer
        .to_sigstore_keypair()
        .unwrap()
        .public_key_to_pem()
        .unwrap();
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path.display().to_string()
}

/// With a signature rule: an unsigned version, one signed by another key, and one whose
/// bytes were changed in the registry are each refused (pull outcome, refusal metric,
/// log) while the last good version keeps serving; a module with nothing good to serve
/// fails its claims with the reason as a Warning Event; a module over
/// `--max-module-bytes` is refused from its manifest, never downloaded.
#[tokio::test]
async fn tampered_unsigned_wrongly_signed_and_oversize_modules_never_run() -> anyhow::Result<()> {
    let mut fx = Fixture::new("oci-verify").await?;
    let registry = Registry::start()?;
    let release = SigningScheme::default().create_signer().unwrap();
    let stranger = SigningScheme::default().create_signer().unwrap();
    let release_pub = public_key(&fx.root, "release.pub", &release);

    let good = registry.push_wasm("wp/signed", "good", &old_hostpath())?;
    registry.sign("wp/signed", &good, &release)?;
    registry.tag("wp/signed", &good, "stable")?;
    let unsigned = registry.push_wasm("wp/signed", "unsigned", &new_hostpath())?;
    // Too large: more than --max-module-bytes (1 MiB here), only its manifest is read.
    let big_file = fx.root.join("big.wasm");
    std::fs::write(&big_file, vec![0u8; 2 << 20])?;
    let big = registry.push_wasm("wp/big", "v1", &big_file)?;
    let big_layer = registry.manifest(&format!("wp/big@{big}"))?["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();

    // Every pull goes through a mirror that serves what the registry does, except the
    // blobs the test has it tamper with.
    let mirror = TamperingMirror::start(&registry)?;
    let signatures = format!("      signatures: {{ allOf: [{{ publicKey: {release_pub} }}] }}\n");
    write_grants(
        &fx,
        &[
            format!(
                "{{ host: \"{}\", insecure: true, mirror: \"{}\" }}",
                registry.host(),
                mirror.host()
            ),
            format!("{{ host: \"{}\", insecure: true }}", mirror.host()),
        ],
        &[
            ("signed", oci(&registry, "wp/signed:stable") + &signatures),
            (
                "never-good",
                oci(&registry, &format!("wp/signed@{unsigned}")) + &signatures,
            ),
            ("big", oci(&registry, &format!("wp/big@{big}"))),
        ],
    )?;
    let store = fx.root.join("store");
    let flags = [
        format!("--module-store={}", store.display()),
        "--module-poll-interval=1s".to_string(),
        "--max-module-bytes=1048576".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let host = fx.host(&flags);
    let signed = fx.class("signed", &[NODE_PATH], json!({})).await?;
    fx.claim("good", &signed, "1Mi", json!({})).await?;
    fx.wait_bound("good").await?;
    let good_sha = sha256_of(&old_hostpath());
    wait_serving(&host, "signed", &good_sha).await?;

    // Nothing good to serve: its claims fail with the reason.
    let never_good = fx.class("never-good", &[NODE_PATH], json!({})).await?;
    fx.claim("refused", &never_good, "1Mi", json!({})).await?;
    let note = fx.wait_claim_event("refused", "ProvisioningFailed").await?;
    assert!(note.contains("not signed"), "{note}");
    assert!(note.contains("never-good"), "{note}");
    assert!(pulls(&host, "never-good", "unsigned") >= 1.0);

    // Oversize: refused from the manifest; the layer never reaches the store.
    wait_pulls(&host, "big", "too_large", 1.0).await?;
    assert!(
        !store
            .join("blobs/sha256")
            .join(big_layer.trim_start_matches("sha256:"))
            .exists(),
        "the oversize layer was downloaded"
    );
    assert!(
        host.log_text().contains("not downloaded"),
        "{}",
        host.log_tail()
    );

    let refusals = |host: &Host| {
        host.metric("wasm_provisioner_module_refusals_total{module=\"signed\"}")
            .unwrap_or(0.0)
    };
    let last_good_serves = async |fx: &Fixture, host: &Host, claim: &str| -> anyhow::Result<()> {
        assert!(
            serving(host, "signed", &good_sha),
            "the last good version stopped serving"
        );
        fx.claim(claim, &signed, "1Mi", json!({})).await?;
        fx.wait_bound(claim).await?;
        Ok(())
    };

    // Unsigned.
    registry.tag("wp/signed", &unsigned, "stable")?;
    wait_pulls(&host, "signed", "unsigned", 1.0).await?;
    assert!(refusals(&host) >= 1.0);
    last_good_serves(&fx, &host, "after-unsigned").await?;

    // Signed, by a key the grants file does not name.
    registry.sign("wp/signed", &unsigned, &stranger)?;
    wait_pulls(&host, "signed", "bad_signature", 1.0).await?;
    last_good_serves(&fx, &host, "after-wrong-key").await?;

    // Signed by the right key, but its bytes changed on the way (by the mirror).
    let tampered = registry.push_wasm("wp/signed", "tampered", &guests::module("minimal"))?;
    registry.sign("wp/signed", &tampered, &release)?;
    let tampered_layer =
        registry.manifest(&format!("wp/signed@{tampered}"))?["layers"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
    mirror.tamper(&tampered_layer);
    registry.tag("wp/signed", &tampered, "stable")?;
    wait_pulls(&host, "signed", "digest_mismatch", 1.0).await?;
    last_good_serves(&fx, &host, "after-tampering").await?;
    assert!(
        host.log_text().contains("refused"),
        "the refusals are not in the log:\n{}",
        host.log_tail()
    );

    // The same bytes, whole and signed by the right key: served.
    let fixed = registry.push_wasm("wp/signed", "fixed", &new_hostpath())?;
    registry.sign("wp/signed", &fixed, &release)?;
    registry.tag("wp/signed", &fixed, "stable")?;
    wait_serving(&host, "signed", &sha256_of(&new_hostpath())).await?;
    fx.cleanup().await;
    Ok(())
}

/// Air-gapped: the module store filled beforehand with `oras cp --to-oci-layout` (the
/// module by digest and its cosign signature), no registry at all: the module is
/// verified and served from the store alone.
#[tokio::test]
async fn an_air_gapped_store_filled_by_oras_serves_a_signed_module() -> anyhow::Result<()> {
    let mut fx = Fixture::new("oci-air-gapped").await?;
    let mut registry = Registry::start()?;
    let release = SigningScheme::default().create_signer().unwrap();
    let release_pub = public_key(&fx.root, "release.pub", &release);
    let digest = registry.push_wasm("wp/hostpath", "v1", &old_hostpath())?;
    registry.sign("wp/hostpath", &digest, &release)?;
    let store = fx.root.join("store");
    let hex = digest.trim_start_matches("sha256:");
    registry.copy_to_layout(&format!("wp/hostpath@{digest}"), &store, "v1")?;
    let signature_tag = format!("sha256-{hex}.sig");
    registry.copy_to_layout(
        &format!("wp/hostpath:{signature_tag}"),
        &store,
        &signature_tag,
    )?;
    let host_name = registry.host();
    registry.stop();

    write_grants(
        &fx,
        &[format!("{{ host: \"{host_name}\", insecure: true }}")],
        &[(
            "hostpath",
            format!("      oci: \"{host_name}/wp/hostpath@{digest}\"\n")
                + &format!("      signatures: {{ allOf: [{{ publicKey: {release_pub} }}] }}\n"),
        )],
    )?;
    let flags = [format!("--module-store={}", store.display())];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let host = fx.host(&flags);
    let class = fx.class("hostpath", &[NODE_PATH], json!({})).await?;
    fx.claim("offline", &class, "1Mi", json!({})).await?;
    fx.wait_bound("offline").await?;
    wait_serving(&host, "hostpath", &sha256_of(&old_hostpath())).await?;
    assert_eq!(
        pulls(&host, "hostpath", "store_hit"),
        1.0,
        "{}",
        host.log_tail()
    );
    assert_eq!(pulls(&host, "hostpath", "pulled"), 0.0);
    fx.cleanup().await;
    Ok(())
}
