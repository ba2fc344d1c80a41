//! StorageClass validation and backend capacity (contract 0.2's `validate-class` and
//! `report-capacity`), on the real control plane:
//!
//! - a class its module rejects is told on the class (a `ClassRejected` Warning naming
//!   the bad parameter), and its claims fail at once with that message as
//!   `ProvisioningFailed`, without the module's `provision` ever being called; the class
//!   fixed (classes are immutable: deleted and made again), its claim binds;
//! - a new module version that rejects a class the version in service accepts is held
//!   back: the old version keeps serving (a claim binds with the old version's digest),
//!   a `ModuleVersionHeldBack` Warning on the class and the host's log say why, and
//!   once the class is gone the new version is tried again and serves;
//! - the leader polls `get-capacity` into `wasm_provisioner_backend_capacity_bytes`:
//!   the granted filesystem's size.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;
use sha2::Digest as _;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT, scenario};
use wasm_provisioner_tests::guests;
use wasm_provisioner_tests::host::Host;
use wasm_provisioner_tests::metrics::parse_samples;

const HOSTPATH_NODE_PATH: (&str, &str) = ("nodePath", "/var/lib/wasm-provisioner/hostpath");

/// Every call `call` of module `module` so far, whatever its outcome.
fn calls(host: &Host, module: &str, call: &str) -> f64 {
    let Ok((_, body)) = host.get("/metrics") else {
        return 0.0;
    };
    parse_samples(&body)
        .into_iter()
        .filter(|s| {
            s.name == "wasm_provisioner_guest_call_duration_seconds_count"
                && s.labels.get("module").map(String::as_str) == Some(module)
                && s.labels.get("call").map(String::as_str) == Some(call)
        })
        .map(|s| s.value)
        .sum()
}

/// Waits for an Event with `reason` on StorageClass `class` (cluster-scoped: its Events
/// are in namespace `default`); returns its note.
async fn wait_class_event(fx: &Fixture, class: &str, reason: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("Event {reason} on StorageClass {class}"),
        WAIT,
        || async {
            let events = fx.events("default", class).await?;
            Ok(events
                .into_iter()
                .find(|(r, _)| r == reason)
                .map(|(_, note)| note))
        },
    )
    .await
}

async fn delete_class(fx: &Fixture, name: &str) -> anyhow::Result<()> {
    let classes = Api::<StorageClass>::all(fx.ctx.client.clone());
    classes.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("StorageClass {name} gone"), WAIT, || async {
        Ok(classes.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// A hostpath class with a misspelled parameter (`onDelte`): the module's
/// `validate-class` rejects it, the class says so, and a claim of it fails at once with
/// the module's message, `provision` never called; made again with the right spelling,
/// the claim binds.
#[tokio::test]
async fn a_rejected_class_fails_its_claims_without_provisioning_until_fixed() {
    scenario("class-rejected", async |fx| {
        fx.install_module("hostpath", "hostpath");
        let bad = fx
            .class("hostpath", &[HOSTPATH_NODE_PATH, ("onDelte", "retain")], json!({}))
            .await?;
        let host = fx.host(&[]);

        // Told on the class, before any claim: the class loop asks every class of ours.
        let note = wait_class_event(fx, &bad, "ClassRejected")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(note.contains("onDelte"), "the Event names the parameter: {note}");
        let valid = format!("wasm_provisioner_class_valid{{class=\"{bad}\",module=\"hostpath\"}}");
        ensure!(
            host.metric(&valid) == Some(0.0),
            "{valid} is {:?}\n{}",
            host.metric(&valid),
            host.log_tail()
        );

        // A claim of it fails at once with the module's message, without provision.
        fx.claim("data", &bad, "1Gi", json!({})).await?;
        let failed = fx
            .wait_claim_event("data", "ProvisioningFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            failed.contains("onDelte") && failed.contains("rejects the class"),
            "the claim is told the module's message: {failed}"
        );
        // A few seconds more: still no provision (the claim waits the slow interval).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let provisions = calls(&host, "hostpath", "provision");
        ensure!(
            provisions == 0.0,
            "provision was called {provisions} times for a rejected class\n{}",
            host.log_tail()
        );
        let validations = calls(&host, "hostpath", "validate-class");
        ensure!(
            validations == 1.0,
            "the class was validated {validations} times, not once (per class version and module version)\n{}",
            host.log_tail()
        );

        // Fixed: classes are immutable, so deleted and made again under the same name.
        delete_class(fx, &bad).await?;
        let fixed: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": { "name": bad },
            "provisioner": fx.provisioner,
            "parameters": {
                "module": "hostpath",
                HOSTPATH_NODE_PATH.0: HOSTPATH_NODE_PATH.1,
                "onDelete": "retain",
            },
        }))?;
        Api::<StorageClass>::all(fx.ctx.client.clone())
            .create(&Default::default(), &fixed)
            .await?;
        let pv = fx
            .wait_bound("data")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(calls(&host, "hostpath", "provision") >= 1.0);
        wait_for("the class's gauge at 1", WAIT, || async {
            Ok((host.metric(&valid) == Some(1.0)).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        // The class was made again under its name; tidy its volume (retained) away.
        fx.claims().delete("data", &DeleteParams::default()).await?;
        let _ = fx
            .volumes()
            .delete(&pv.metadata.name.unwrap_or_default(), &DeleteParams::default())
            .await;
        delete_class(fx, &bad).await?;
        Ok(())
    })
    .await;
}

/// A module whose `validate-class` traps: only its class's claims fail, saying the class
/// could not be validated; the host and the other modules go on.
#[tokio::test]
async fn a_validation_that_traps_fails_only_its_class() {
    scenario("class-validation-traps", async |fx| {
        fx.install_module("test-trap", "trap");
        fx.install_module("hostpath", "hostpath");
        let trapping = fx
            .class("trap", &[("calls", "validate-class")], json!({}))
            .await?;
        let good = fx
            .class("hostpath", &[HOSTPATH_NODE_PATH], json!({}))
            .await?;
        let mut host = fx.host(&[]);

        let note = wait_class_event(fx, &trapping, "ClassValidationFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("could not validate") && note.contains("trap"),
            "the Event says the validation failed: {note}"
        );
        fx.claim("trapped", &trapping, "1Gi", json!({})).await?;
        fx.claim("fine", &good, "1Gi", json!({})).await?;
        let failed = fx
            .wait_claim_event("trapped", "ProvisioningFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            failed.contains("could not validate"),
            "the claim is told its class could not be validated: {failed}"
        );
        fx.wait_bound("fine")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            calls(&host, "trap", "provision") == 0.0,
            "provision was called for a class that could not be validated\n{}",
            host.log_tail()
        );
        ensure!(
            host.exited().is_none(),
            "the host exited\n{}",
            host.log_tail()
        );
        Ok(())
    })
    .await;
}

/// Copies the last 0.1 build of hostpath (no `validate-class`: it vouches for no class)
/// into the modules directory as `hostpath`; returns its sha256.
fn install_hostpath_0_1(fx: &Fixture) -> String {
    let bytes = std::fs::read(guests::fixture("hostpath-0.1.0")).expect("the 0.1 fixture");
    let staging = fx.root.join(".hostpath.wasm.tmp");
    std::fs::write(&staging, &bytes).expect("stage the module");
    std::fs::rename(&staging, fx.modules.join("hostpath.wasm")).expect("install the module");
    hex::encode(sha2::Sha256::digest(&bytes))
}

/// Whether the host's log says the version `sha256` of a module was put in service.
fn in_service(host: &Host, sha256: &str) -> bool {
    host.log_text()
        .lines()
        .any(|line| line.contains("module version in service") && line.contains(&sha256[..12]))
}

fn sha256_of_built(name: &str) -> String {
    hex::encode(sha2::Sha256::digest(
        std::fs::read(guests::module(name)).expect("a built guest"),
    ))
}

/// A class the version in service (0.1, which validates nothing) serves, and the new
/// version (0.2, which validates) rejects: the new version is held back and the old one
/// keeps serving; the class deleted, the new version serves.
#[tokio::test]
async fn a_new_version_rejecting_a_class_the_old_one_serves_is_held_back() {
    scenario("class-held-back", async |fx| {
        let old = install_hostpath_0_1(fx);
        let new = sha256_of_built("hostpath");
        let good = fx
            .class("hostpath", &[HOSTPATH_NODE_PATH], json!({}))
            .await?;
        let bad = fx
            .class(
                "hostpath",
                &[HOSTPATH_NODE_PATH, ("sizeLimit", "1Gi")],
                json!({}),
            )
            .await?;
        let host = fx.host(&[]);
        wait_for("the 0.1 version in service", WAIT, || async {
            Ok(in_service(&host, &old).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;

        fx.install_module("hostpath", "hostpath");
        let note = wait_class_event(fx, &bad, "ModuleVersionHeldBack")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains("sizeLimit") && note.contains(&old[..12]) && note.contains(&new[..12]),
            "the Event names the parameter and both versions: {note}"
        );
        ensure!(
            fx.events("default", &good)
                .await?
                .iter()
                .all(|(reason, _)| reason != "ModuleVersionHeldBack"),
            "a class both versions accept is not warned about"
        );
        let refusals = "wasm_provisioner_module_refusals_total{module=\"hostpath\"}";
        ensure!(
            host.metric(refusals) == Some(1.0),
            "{refusals} is {:?}",
            host.metric(refusals)
        );
        ensure!(
            host.log_text().contains("held back"),
            "the log says the version was held back\n{}",
            host.log_tail()
        );

        // The old version keeps serving: a claim of the good class is its.
        fx.claim("old", &good, "1Gi", json!({})).await?;
        let pv = fx
            .wait_bound("old")
            .await
            .with_context(|| host.log_tail())?;
        let digest = pv
            .metadata
            .annotations
            .unwrap_or_default()
            .get("wasm-provisioner.dev/module-sha256")
            .cloned()
            .unwrap_or_default();
        ensure!(
            digest == old,
            "the volume was made by {digest}, not the version in service {old}"
        );

        // The class gone, the held-back version is tried again at the next scan (a
        // change in the directory starts one at once) and serves.
        delete_class(fx, &bad).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        std::fs::write(fx.modules.join(".rescan"), b"")?;
        wait_for("the new version in service", WAIT, || async {
            Ok(in_service(&host, &new).then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        fx.claim("new", &good, "1Gi", json!({})).await?;
        let pv = fx
            .wait_bound("new")
            .await
            .with_context(|| host.log_tail())?;
        let digest = pv
            .metadata
            .annotations
            .unwrap_or_default()
            .get("wasm-provisioner.dev/module-sha256")
            .cloned()
            .unwrap_or_default();
        ensure!(digest == new, "the volume was made by {digest}, not {new}");
        Ok(())
    })
    .await;
}

/// The leader polls the hostpath class's `get-capacity`: the gauges show the granted
/// directory's filesystem, as statvfs(2) sees it.
#[tokio::test]
async fn the_backend_capacity_of_a_class_is_exported() {
    scenario("class-capacity", async |fx| {
        fx.install_module("hostpath", "hostpath");
        let class = fx.class("hostpath", &[HOSTPATH_NODE_PATH], json!({})).await?;
        let host = fx.host(&["--capacity-poll-interval=1s"]);
        let gauge = |kind: &str| {
            format!(
                "wasm_provisioner_backend_capacity_bytes{{class=\"{class}\",kind=\"{kind}\",module=\"hostpath\"}}"
            )
        };
        let total = wait_for("the capacity gauges", WAIT, || async {
            Ok(host.metric(&gauge("total")))
        })
        .await
        .with_context(|| host.log_tail())?;
        let available = host.metric(&gauge("available")).context("available")?;

        let stats = statvfs(&fx.module_data("hostpath"))?;
        let expected_total = (stats.f_blocks as f64) * (stats.f_frsize as f64);
        ensure!(
            total == expected_total,
            "total {total}, but the granted filesystem has {expected_total} bytes"
        );
        ensure!(
            available > 0.0 && available <= total,
            "available {available} of {total}"
        );
        ensure!(
            host.metric(&gauge("maximum_volume")).is_none(),
            "no maxSize, so no maximum_volume"
        );
        ensure!(calls(&host, "hostpath", "get-capacity") >= 1.0);

        // The class gone, its gauges go.
        delete_class(fx, &class).await?;
        wait_for("the gauges removed", WAIT, || async {
            Ok(host.metric(&gauge("total")).is_none().then_some(()))
        })
        .await
        .with_context(|| host.log_tail())?;
        Ok(())
    })
    .await;
}

fn statvfs(path: &std::path::Path) -> anyhow::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs buffer of the right type.
    let status = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    ensure!(status == 0, "statvfs: {}", std::io::Error::last_os_error());
    Ok(stats)
}
