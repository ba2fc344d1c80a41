//! A compile bomb beside a real module, on a real control plane: `wasm-provisioner run`
//! answers `/healthz` at once, the real module is in service and provisions while the
//! bomb still compiles, the bomb is stopped at `--compile-timeout`, refused (metric,
//! warning, a Warning Event on its claim naming the flag) and not compiled again when
//! the directory is scanned again. Before compiles ran in a bounded child, the host
//! compiled the bomb before it served anything, for minutes.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::json;
use wasm_provisioner_tests::bomb;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::Fixture;
use wasm_provisioner_tests::host::Host;

const COMPILE_TIMEOUT: &str = "--compile-timeout=4s";
/// What the host logs each time it starts a compile child.
const COMPILE_LINE: &str = "compiling module in a child process";

fn compiles_of(log: &str, module: &str) -> usize {
    log.lines()
        .filter(|line| line.contains(COMPILE_LINE) && line.contains(module))
        .count()
}

async fn run(fx: &mut Fixture) -> anyhow::Result<()> {
    fx.install_module("hostpath", "hostpath");
    std::fs::write(fx.modules.join("bomb.wasm"), bomb::default_bomb())?;
    let hostpath = fx
        .class(
            "hostpath",
            &[("nodePath", "/var/lib/wasm-provisioner/hostpath")],
            json!({ "reclaimPolicy": "Delete" }),
        )
        .await?;
    let bomb_class = fx.class("bomb", &[], json!({})).await?;
    // Both claims wait for the host: they are reconciled while the modules load.
    fx.claim("data", &hostpath, "1Gi", json!({})).await?;
    fx.claim("boom", &bomb_class, "1Gi", json!({})).await?;

    let started = Instant::now();
    let host = Host::spawn(&fx.host_config(&[COMPILE_TIMEOUT]))?;
    wait_for("/healthz", Duration::from_secs(60), || async {
        Ok(host
            .get("/healthz")
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|_| ()))
    })
    .await
    .with_context(|| host.log_text())?;
    let healthy = started.elapsed();
    ensure!(
        healthy < Duration::from_secs(10),
        "/healthz first answered after {healthy:?}:\n{}",
        host.log_text()
    );

    fx.wait_bound("data")
        .await
        .with_context(|| host.log_text())?;
    let bound = started.elapsed();
    let log = host.log_text();
    let in_service = log
        .find("module version in service")
        .filter(|at| {
            log[*at..]
                .lines()
                .next()
                .is_some_and(|l| l.contains("hostpath"))
        })
        .context("no hostpath in service line")?;
    let refused = log.find("module version refused");
    ensure!(
        refused.is_none_or(|refused| in_service < refused),
        "hostpath came in service only after the bomb was refused:\n{log}"
    );
    println!("/healthz after {healthy:?}, hostpath claim bound after {bound:?}");

    // The bomb: stopped at the timeout, refused and counted.
    let sample =
        "wasm_provisioner_module_compile_limit_refusals_total{limit=\"timeout\",module=\"bomb\"}";
    wait_for("the bomb's refusal", Duration::from_secs(60), || async {
        Ok(host.metric(sample).filter(|v| *v >= 1.0))
    })
    .await
    .with_context(|| host.log_text())?;
    let note = fx
        .wait_claim_event("boom", "ProvisioningFailed")
        .await
        .with_context(|| host.log_text())?;
    ensure!(
        note.contains("--compile-timeout") && note.contains("module bomb"),
        "the bomb claim's Event does not name the limit: {note}"
    );
    for (reason, note) in fx.events(&fx.ctx.namespace, "boom").await? {
        ensure!(
            !note.contains("still loading"),
            "a claim waiting for its module got an Event: {reason}: {note}"
        );
    }
    for (reason, note) in fx.events(&fx.ctx.namespace, "data").await? {
        ensure!(
            reason != "ProvisioningFailed",
            "the hostpath claim failed while the bomb compiled: {note}"
        );
    }

    // A change in the directory makes the host scan it again: the bomb is not compiled
    // again (its bytes did not change).
    std::fs::write(fx.modules.join("unrelated.txt"), b"a change")?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = host.log_text();
    ensure!(
        log.contains("modules directory scanned"),
        "no re-scan seen:\n{log}"
    );
    ensure!(
        compiles_of(&log, "bomb") == 1,
        "the bomb was compiled {} times:\n{log}",
        compiles_of(&log, "bomb")
    );
    ensure!(host.metric(sample) == Some(1.0), "counted more than once");
    ensure!(
        host.metric("wasm_provisioner_module_refusals_total{module=\"bomb\"}") == Some(1.0),
        "refusals not counted once"
    );
    Ok(())
}

#[tokio::test]
async fn a_compile_bomb_delays_neither_healthz_nor_another_module_and_is_refused_once() {
    let mut fx = Fixture::new("compile-bomb").await.expect("a fixture");
    match run(&mut fx).await {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}
