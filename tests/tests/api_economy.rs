//! The host's API bill, counted by its own client
//! (`wasm_provisioner_kube_api_requests_total`) on the real control plane (issues 11.2
//! and 11.3): a provisioned volume costs the PV create, the Provisioning and
//! ProvisioningSucceeded Events and its share of the provisioning journal's group
//! commits (at most one: its record, which carries the clears due; fewer when claims
//! arrive together), under 5 writes, no claim write, no read and no 409; its deletion 2
//! writes (the PV delete, the PV finalizer removed), no read and no 409; a
//! WaitForFirstConsumer claim waiting for its node costs nothing. The claim is never
//! edited on the way (no finalizer in any state the watch shows), so the binder never
//! syncs a Pending claim again for us.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use wasm_provisioner_tests::cluster::{wait_for, wait_for_every};
use wasm_provisioner_tests::fixture::{Fixture, WAIT};
use wasm_provisioner_tests::metrics::{host_requests, settled_requests};

#[tokio::test]
async fn a_volume_costs_under_five_writes_and_no_claim_write_and_its_deletion_two()
-> anyhow::Result<()> {
    const CLAIMS: usize = 20;
    let mut fx = Fixture::new("economy").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class("hostpath", &[("nodePath", "/srv/economy")], json!({}))
        .await?;
    let host = fx.host(&[]);
    let before = settled_requests(&host, Duration::from_secs(2)).await?;
    let states = record_claim_states(&fx).await?;

    let names: Vec<String> = (0..CLAIMS).map(|i| format!("economy-{i:02}")).collect();
    try_join_all(
        names
            .iter()
            .map(|name| fx.claim(name, &class, "1Gi", json!({}))),
    )
    .await?;
    let mut volumes = Vec::new();
    for name in &names {
        volumes.push(fx.wait_bound(name).await?.name_any());
    }
    let provisioned = settled_requests(&host, Duration::from_secs(2)).await?;
    let provisioning = provisioned.since(&before);
    let per_volume = |n: f64| n / CLAIMS as f64;
    let kinds = provisioning.by_kind();
    let writes_of = |resource: &str| per_volume(provisioning.writes_to(resource));
    assert_eq!(
        (
            writes_of("persistentvolumes"),
            writes_of("events"),
            writes_of("persistentvolumeclaims"),
            provisioning.reads(),
            provisioning.conflicts()
        ),
        (1.0, 2.0, 0.0, 0.0, 0.0),
        "provisioning per volume: PV creates, Events, claim writes, reads, 409s; by kind: {kinds:?}"
    );
    let journal = writes_of("configmaps");
    assert!(
        journal > 0.0
            && journal <= per_volume((CLAIMS + 3) as f64)
            && provisioning.writes() < 5.0 * CLAIMS as f64,
        "provisioning: {journal} journal writes per volume (at most a record each, the clears riding along, and 3 more), {} writes per volume in all (under 5); by kind: {kinds:?}",
        per_volume(provisioning.writes())
    );
    println!(
        "{CLAIMS} claims at once: {journal} journal writes and {} writes in all per volume",
        per_volume(provisioning.writes())
    );
    assert!(
        fx.journal_entries().await?.is_empty(),
        "every intent was cleared once its PV existed"
    );

    // Every state the watch showed: our finalizer was never on (the intent was in the
    // journal), and each claim ended Bound.
    for (claim, seen) in states.lock().unwrap().iter() {
        assert!(
            seen.iter().all(|(finalizer, _)| !finalizer),
            "{claim}: the claim was given our finalizer (finalizer, phase): {seen:?}"
        );
        assert_eq!(
            seen.last()
                .map(|(finalizer, phase)| (*finalizer, phase.as_str())),
            Some((false, "Bound")),
            "{claim}: (finalizer, phase) at the end: {seen:?}"
        );
    }

    let claims = fx.claims();
    let delete = DeleteParams::default();
    try_join_all(names.iter().map(|name| claims.delete(name, &delete))).await?;
    for volume in &volumes {
        fx.wait_volume_gone(volume).await?;
    }
    let deletion = settled_requests(&host, Duration::from_secs(2))
        .await?
        .since(&provisioned);
    assert_eq!(
        (
            per_volume(deletion.writes()),
            deletion.reads(),
            deletion.conflicts()
        ),
        (2.0, 0.0, 0.0),
        "deletion: writes per volume, reads, 409s; by kind: {:?}",
        deletion.by_kind()
    );
    for volume in &volumes {
        assert!(
            !fx.module_data("hostpath").join(volume).exists(),
            "the backend volume {volume} was deleted"
        );
    }
    fx.cleanup().await;
    Ok(())
}

/// Claims that come one after another, each created once the previous one's PV exists:
/// the clear of an intent is not written on its own but rides along with the next
/// claim's record (within the journal's 1 s linger), so a claim costs one journal write,
/// not two (a record, then a clear).
#[tokio::test]
async fn claims_one_after_another_cost_one_journal_write_each() -> anyhow::Result<()> {
    const CLAIMS: usize = 10;
    let mut fx = Fixture::new("economy-trickle").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class(
            "hostpath",
            &[("nodePath", "/srv/economy-trickle")],
            json!({}),
        )
        .await?;
    let host = fx.host(&[]);
    let before = settled_requests(&host, Duration::from_secs(2)).await?;
    let volumes = fx.volumes();
    for i in 0..CLAIMS {
        let claim = fx
            .claim(&format!("trickle-{i:02}"), &class, "1Gi", json!({}))
            .await?;
        // Polled every 20 ms (not wait_for's 200), so the next claim follows the clear
        // well within the linger even on a loaded machine.
        let volume = format!("pvc-{}", claim.uid().unwrap_or_default());
        wait_for_every(
            &format!("PV {volume} of claim trickle-{i:02}"),
            WAIT,
            Duration::from_millis(20),
            || async { Ok(volumes.get_opt(&volume).await?.map(|_| ())) },
        )
        .await?;
    }
    wait_for("the journal to be empty", WAIT, || async {
        Ok(fx.journal_entries().await?.is_empty().then_some(()))
    })
    .await?;
    let spent = settled_requests(&host, Duration::from_secs(2))
        .await?
        .since(&before);
    let journal = spent.writes_to("configmaps");
    // One record each, the last clear alone, and slack for three gaps over the linger on
    // a slow machine; a clear written on its own each time would make 2 * CLAIMS.
    assert!(
        journal <= (CLAIMS + 4) as f64,
        "{CLAIMS} claims one after another took {journal} journal writes (at most {}); by kind: {:?}",
        CLAIMS + 4,
        spent.by_kind()
    );
    println!("{CLAIMS} claims one after another: {journal} journal writes");
    fx.cleanup().await;
    Ok(())
}

/// Each claim's states as the watch shows them, in order: (our finalizer on, phase).
type ClaimStates = Arc<Mutex<BTreeMap<String, Vec<(bool, String)>>>>;

/// Watches the fixture's claims from now on (listed first, so no state is missed).
async fn record_claim_states(fx: &Fixture) -> anyhow::Result<ClaimStates> {
    let states = ClaimStates::default();
    let recorded = states.clone();
    let (listed, ready) = tokio::sync::oneshot::channel();
    let mut listed = Some(listed);
    let mut stream = watcher(fx.claims(), watcher::Config::default()).boxed();
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let claim: PersistentVolumeClaim = match event {
                Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => claim,
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let finalizer = claim.finalizers().iter().any(|f| f == FINALIZER_CLAIM);
            let phase = claim
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let mut states = recorded.lock().unwrap();
            let seen = states.entry(claim.name_any()).or_default();
            if seen.last() != Some(&(finalizer, phase.clone())) {
                seen.push((finalizer, phase));
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), ready).await??;
    Ok(states)
}

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";

#[tokio::test]
async fn a_claim_waiting_for_its_node_costs_no_request() -> anyhow::Result<()> {
    let mut fx = Fixture::new("economy-wffc").await?;
    fx.install_module("test-echo", "echo");
    fx.node("economy-wffc-node").await.ok();
    let class = fx
        .class(
            "echo",
            &[],
            json!({ "volumeBindingMode": "WaitForFirstConsumer" }),
        )
        .await?;
    // Resynced every second: each resync is a reconcile of the waiting claim.
    let host = fx.host(&["--resync-period=1s"]);
    // Already announced to this provisioner, as a claim is once it was scheduled and
    // sent back to the scheduler (the binder keeps the annotation): the host's claim,
    // waiting for a node.
    fx.claim(
        "waiting",
        &class,
        "1Gi",
        json!({ "metadata": { "annotations": {
            "volume.kubernetes.io/storage-provisioner": fx.provisioner } } }),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = host_requests(&host)?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let spent = host_requests(&host)?.since(&before);
    assert_eq!(
        spent.total(),
        0.0,
        "a claim waiting for its node made requests: {:?}",
        spent.by_kind()
    );

    // It was the host's all along: once a node is selected it is provisioned.
    fx.claims()
        .patch(
            "waiting",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                "volume.kubernetes.io/selected-node": "economy-wffc-node" } } })),
        )
        .await?;
    fx.wait_bound("waiting").await?;
    fx.cleanup().await;
    Ok(())
}
