//! The claim controller's decisions over time, on the real control plane: an update of a
//! claim that changes nothing the decision reads (kube-controller-manager's provisioner
//! announcement arriving just after the host's first attempt, or the echo of the host's
//! own write) leaves the claim's back-off alone, as the Go library's queue does; and a
//! claim held because its cleanup cannot run says why in an Event, not only in the
//! host's log.
//!
//! The binder announces a claim to its provisioner by writing two annotations in one
//! update, `volume.kubernetes.io/storage-provisioner` and its beta twin. In the field
//! that update often lands just after the host, which takes a claim at first sight
//! (`--provision-before-binder`), asked the module; on an idle machine it usually lands
//! first. So that the order is always the late one, each claim here is created with the
//! GA annotation already (the binder then has nothing to write) and the test writes the
//! beta one right after the module's first answer: an update that changes nothing the
//! decision reads, since the GA annotation wins.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::{wait_for, wait_for_every};
use wasm_provisioner_tests::fixture::{Fixture, WAIT, scenario};
use wasm_provisioner_tests::host::Host;

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

/// How many `provision` calls of module `echo` answered `outcome` so far.
fn provision_answers(host: &Host, outcome: &str) -> f64 {
    host.metric(&format!(
        "wasm_provisioner_guest_call_failures_total{{call=\"provision\",module=\"echo\",outcome=\"{outcome}\"}}"
    ))
    .unwrap_or_default()
}

/// A claim of `class` named `name`, announced to this provisioner as the binder does
/// but with the GA annotation only (see the module's documentation).
async fn announced_claim(fx: &Fixture, name: &str, class: &str) -> anyhow::Result<()> {
    let announced = json!({ "metadata": { "annotations": {
        ANN_STORAGE_PROVISIONER: fx.provisioner,
    } } });
    fx.claim(name, class, "1Gi", announced).await?;
    Ok(())
}

/// Waits for the module's first `outcome` answer, writes the rest of the binder's
/// announcement (the beta annotation) at once, then returns the moments the module
/// answered `outcome`, polled every 50 ms for `window` from the first answer on (the
/// first at zero).
async fn answers_after_late_announcement(
    fx: &Fixture,
    host: &Host,
    claim: &str,
    outcome: &str,
    window: Duration,
) -> anyhow::Result<Vec<f64>> {
    wait_for_every(
        &format!("the first {outcome} answer"),
        WAIT,
        Duration::from_millis(20),
        || async { Ok((provision_answers(host, outcome) >= 1.0).then_some(())) },
    )
    .await
    .with_context(|| host.log_tail())?;
    let first = Instant::now();
    let late = json!({ "metadata": { "annotations": {
        ANN_BETA_STORAGE_PROVISIONER: fx.provisioner,
    } } });
    fx.claims()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&late))
        .await
        .context("the late announcement")?;
    let mut seen = provision_answers(host, outcome);
    let mut moments = vec![0.0; seen as usize];
    while first.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = provision_answers(host, outcome);
        while seen < now {
            moments.push(first.elapsed().as_secs_f64());
            seen += 1.0;
        }
    }
    Ok(moments)
}

/// A module that answers "ignored" (not mine) is asked once, as the Go library asks:
/// no retry, and the binder's announcement arriving after the first answer does not
/// count as a change of the claim. Before, the announcement made the host ask again at
/// once.
#[tokio::test]
async fn an_ignored_claim_is_asked_once() {
    scenario("ignored-once", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[("outcome", "ignored")], json!({}))
            .await?;
        let host = fx.host(&[]);
        announced_claim(fx, "ignored", &class).await?;
        let answers = answers_after_late_announcement(
            fx,
            &host,
            "ignored",
            "ignored",
            Duration::from_secs(10),
        )
        .await?;
        eprintln!("ignored answers at {answers:?} s");
        ensure!(
            answers.len() == 1,
            "the module was asked {} times in 10 s (at {answers:?} s), not once\n{}",
            answers.len(),
            host.log_tail()
        );
        Ok(())
    })
    .await;
}

/// A claim the module finds infeasible waits the slow interval (`--retry-interval-max`)
/// before it is asked again, whatever the binder writes to it meanwhile. Before, the
/// announcement made the host ask again at once.
#[tokio::test]
async fn an_infeasible_claim_waits_the_slow_interval() {
    scenario("infeasible-slow", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[("outcome", "infeasible")], json!({}))
            .await?;
        let host = fx.host(&["--retry-interval-max=15s"]);
        announced_claim(fx, "infeasible", &class).await?;
        let answers = answers_after_late_announcement(
            fx,
            &host,
            "infeasible",
            "infeasible",
            Duration::from_secs(20),
        )
        .await?;
        eprintln!("infeasible answers at {answers:?} s (slow interval 15 s)");
        ensure!(
            answers.len() == 2 && answers[1] >= 14.0,
            "asked at {answers:?} s: once, then again after the slow interval (15 s)\n{}",
            host.log_tail()
        );
        Ok(())
    })
    .await;
}

/// A failing claim's attempts follow the back-off from the first one on: 2, 4, 8 s
/// apart with `--retry-interval-start=2s`. Before, the binder's announcement arriving
/// after the first attempt started the second at once (gaps of 0, 4, 8 s in one run,
/// 2, 4, 8 in another).
#[tokio::test]
async fn a_failing_claims_attempts_follow_the_back_off() {
    scenario("failing-gaps", async |fx| {
        fx.install_module("test-echo", "echo");
        let class = fx
            .class("echo", &[("outcome", "failed")], json!({}))
            .await?;
        let host = fx.host(&["--retry-interval-start=2s", "--retry-interval-max=60s"]);
        announced_claim(fx, "failing", &class).await?;
        let answers = answers_after_late_announcement(
            fx,
            &host,
            "failing",
            "failed",
            Duration::from_secs(17),
        )
        .await?;
        let gaps: Vec<f64> = answers.windows(2).map(|w| w[1] - w[0]).collect();
        eprintln!("failed answers at {answers:?} s, gaps {gaps:?} s");
        let expected = [2.0, 4.0, 8.0];
        ensure!(
            gaps.len() == expected.len()
                && gaps
                    .iter()
                    .zip(expected)
                    .all(|(gap, want)| *gap >= want * 0.9 && *gap <= want + 1.5),
            "attempt gaps {gaps:?} s, not {expected:?} s\n{}",
            host.log_tail()
        );
        // Each failed attempt is counted by its error's kind.
        let sample =
            r#"wasm_provisioner_reconcile_errors_total{controller="claims",error="failed"}"#;
        let counted = host.metric(sample).unwrap_or(0.0);
        ensure!(
            counted >= answers.len() as f64,
            "{sample} is {counted} after {} failed attempts",
            answers.len()
        );
        Ok(())
    })
    .await;
}

/// A claim deleted while its module works in the background is held (our finalizer)
/// until the module is asked once more and its volume deleted; when its class is gone,
/// the host cannot ask the module, and the claim stays Terminating. The user is told
/// why in a Warning Event on the claim (before, only the host's log said it); recreating
/// the class lets the claim go.
#[tokio::test]
async fn a_claim_held_after_its_class_was_deleted_says_why() {
    scenario("class-gone-held", async |fx| {
        fx.install_module("test-echo", "echo");
        let outcome_file = fx.module_data("echo").join("outcome");
        std::fs::write(&outcome_file, "in-background")?;
        let class = fx
            .class("echo", &[("outcomeFile", "/volumes/outcome")], json!({}))
            .await?;
        let host = fx.host(&[]);
        fx.claim("held", &class, "1Gi", json!({})).await?;
        fx.wait_claim(
            "held",
            "our finalizer (the module works in the background)",
            |c| c.is_some_and(|c| c.finalizers().iter().any(|f| f == FINALIZER_CLAIM)),
        )
        .await
        .with_context(|| host.log_tail())?;

        let classes: Api<StorageClass> = Api::all(fx.ctx.client.clone());
        let mut saved = classes.get(&class).await?;
        classes.delete(&class, &DeleteParams::default()).await?;
        wait_for("the class to be gone", WAIT, || async {
            Ok(classes.get_opt(&class).await?.is_none().then_some(()))
        })
        .await?;
        fx.claims().delete("held", &DeleteParams::default()).await?;

        let note = wait_for(
            "a Warning Event saying why the claim is held",
            WAIT,
            || async {
                let events = fx.events(&fx.ctx.namespace, "held").await?;
                Ok(events
                    .into_iter()
                    .find(|(reason, note)| {
                        reason == "ProvisioningCleanupFailed" && note.contains(&class)
                    })
                    .map(|(_, note)| note))
            },
        )
        .await
        .with_context(|| host.log_tail())?;
        eprintln!("the Event: {note}");
        ensure!(
            note.contains("recreate"),
            "the Event says what to do: {note}"
        );
        let claim = fx.claims().get_opt("held").await?;
        ensure!(
            claim.is_some_and(|c| c.finalizers().iter().any(|f| f == FINALIZER_CLAIM)),
            "the claim is held while the backend may hold its volume"
        );

        // As the Event says: the class recreated, the module is asked, the volume goes
        // and so does the claim.
        std::fs::write(&outcome_file, "ok")?;
        saved.metadata = kube::api::ObjectMeta {
            name: Some(class.clone()),
            ..Default::default()
        };
        classes.create(&PostParams::default(), &saved).await?;
        fx.wait_claim("held", "gone once its class is back", |c| c.is_none())
            .await
            .with_context(|| host.log_tail())?;
        Ok(())
    })
    .await;
}
