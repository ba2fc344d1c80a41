//! What must survive a crash, a deleted claim and a change of leader: no backend volume
//! is ever orphaned and no claim is provisioned twice.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT};
use wasm_provisioner_tests::host::Host;

const FINALIZER_CLAIM: &str = "wasm-provisioner.dev/provisioning";

/// A host killed between the plugin's provision and the PV create (the fault hook exits
/// exactly there, as kill -9 would): the intent is in the provisioning journal, not on
/// the claim (no claim write on the fast path), and the next host publishes the same
/// backend volume instead of making a second one, then clears the journal.
#[tokio::test]
async fn crash_between_provision_and_pv_create_then_restart_publishes_the_volume()
-> anyhow::Result<()> {
    let mut fx = Fixture::new("crash-publish").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class("hostpath", &[("nodePath", "/srv/volumes")], json!({}))
        .await?;
    let mut crashing = fx.host(&["--fault-exit-after=guest-provision"]);
    let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
    let status = crashing.wait(WAIT)?;
    assert_eq!(
        status.code(),
        Some(137),
        "the fault hook exits like kill -9"
    );

    let uid = claim.uid().unwrap();
    let dir = fx.module_data("hostpath").join(format!("pvc-{uid}"));
    assert!(dir.is_dir(), "the backend volume was made before the crash");
    assert!(
        fx.volumes().get_opt(&format!("pvc-{uid}")).await?.is_none(),
        "no PV yet"
    );
    let claim = fx.claims().get("data").await?;
    assert!(
        !claim.finalizers().iter().any(|f| f == FINALIZER_CLAIM),
        "no claim write on the fast path"
    );
    assert_eq!(
        fx.journal_entries().await?,
        std::slice::from_ref(&uid),
        "intent persisted in the journal"
    );

    let host = fx.host(&[]);
    let pv = fx.wait_bound("data").await?;
    assert_eq!(pv.name_any(), format!("pvc-{uid}"));
    let entries: Vec<_> = std::fs::read_dir(fx.module_data("hostpath"))?.collect();
    assert_eq!(entries.len(), 1, "exactly one backend volume: {entries:?}");
    wait_for("the journal to be cleared", WAIT, || async {
        Ok(fx.journal_entries().await?.is_empty().then_some(()))
    })
    .await?;
    drop(host);
    fx.cleanup().await;
    Ok(())
}

/// The same crash, but the claim is deleted while no host runs: it vanishes from the
/// API at once (nothing of ours holds it), and the next host finds the intent in the
/// journal, deletes the backend volume and clears the entry.
#[tokio::test]
async fn crash_then_claim_deleted_leaves_no_orphan() -> anyhow::Result<()> {
    let mut fx = Fixture::new("crash-orphan").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class("hostpath", &[("nodePath", "/srv/volumes")], json!({}))
        .await?;
    let mut crashing = fx.host(&["--fault-exit-after=guest-provision"]);
    let claim = fx.claim("data", &class, "1Gi", json!({})).await?;
    assert_eq!(crashing.wait(WAIT)?.code(), Some(137));
    let dir = fx
        .module_data("hostpath")
        .join(format!("pvc-{}", claim.uid().unwrap()));
    assert!(dir.is_dir());

    fx.claims().delete("data", &DeleteParams::default()).await?;
    fx.wait_claim("data", "gone", |c| c.is_none()).await?;
    assert!(
        dir.is_dir(),
        "no host ran: the backend volume is still there"
    );

    let host = fx.host(&[]);
    wait_for("the orphan to be cleaned up", WAIT, || async {
        Ok((!dir.exists()).then_some(()))
    })
    .await
    .with_context(|| host.log_text())?;
    wait_for("the journal to be cleared", WAIT, || async {
        Ok(fx.journal_entries().await?.is_empty().then_some(()))
    })
    .await?;
    drop(host);
    fx.cleanup().await;
    Ok(())
}

fn leader_gauge(host: &Host) -> Option<f64> {
    host.metric("wasm_provisioner_leader")
}

/// Two hosts, one Lease: only the leader provisions; a graceful stop releases the
/// lease and the standby takes over at once; a host that loses its lease exits non-zero.
#[tokio::test]
async fn leader_hands_over_between_two_hosts() -> anyhow::Result<()> {
    let mut fx = Fixture::new("leader").await?;
    fx.install_module("test-echo", "echo");
    let class = fx.class("echo", &[], json!({})).await?;
    let election = [
        "--leader-elect=true",
        // A long lease: a take-over faster than it proves the leader released it.
        "--leader-election-lease-duration=30s",
        "--leader-election-renew-deadline=20s",
    ];
    let namespace_flag = format!("--leader-election-namespace={}", fx.ctx.namespace);
    let flags = |config: &mut wasm_provisioner_tests::host::HostConfig| {
        config.args.retain(|a| a != "--leader-elect=false");
        config.args.extend(election.iter().map(|s| s.to_string()));
        config.args.push(namespace_flag.clone());
    };
    let mut first_config = fx.host_config(&[]);
    flags(&mut first_config);
    let mut first = Host::start(&first_config)?;
    wait_for("the first host to lead", WAIT, || async {
        Ok((leader_gauge(&first) == Some(1.0)).then_some(()))
    })
    .await?;
    let mut second = Host::start(&first_config)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        leader_gauge(&second),
        Some(0.0),
        "the second host stands by"
    );

    fx.claim("one", &class, "1Gi", json!({})).await?;
    fx.wait_bound("one").await?;

    let status = first.terminate(Duration::from_secs(30))?;
    assert!(
        status.success(),
        "a graceful stop exits 0: {status:?}\n{}",
        first.log_text()
    );
    wait_for(
        "the second host to take over before the 30 s lease could expire",
        Duration::from_secs(10),
        || async { Ok((leader_gauge(&second) == Some(1.0)).then_some(())) },
    )
    .await
    .unwrap_or_else(|error| {
        panic!(
            "{error:#}\n--- first host ---\n{}\n--- second host ---\n{}",
            first.log_text(),
            second.log_text()
        )
    });
    fx.claim("two", &class, "1Gi", json!({})).await?;
    fx.wait_bound("two").await?;

    // Someone else takes the Lease: the second host must stop and exit non-zero.
    let leases: Api<Lease> = Api::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace);
    let lease_name = fx.provisioner.replace('/', "-");
    // MicroTime: exactly six fractional digits.
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    leases
        .patch(
            &lease_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "holderIdentity": "an-intruder",
                "acquireTime": now,
                "renewTime": now,
                "leaseDurationSeconds": 3600,
            }})),
        )
        .await?;
    let status = second.wait(Duration::from_secs(45))?;
    assert!(
        !status.success(),
        "losing the lease exits non-zero: {status:?}"
    );
    fx.cleanup().await;
    Ok(())
}

/// A namespace tenant's claim too large for the journal (20 KiB of annotations; the API
/// takes up to 256 KiB, and a few such claims together would pass the 1 MiB a ConfigMap
/// may hold, failing every other claim's journal write): its intent goes on the claim as
/// our finalizer instead, so the journal never holds it, and a crash at the same point
/// still publishes exactly one volume.
#[tokio::test]
async fn a_claim_too_large_for_the_journal_keeps_its_intent_on_the_claim() -> anyhow::Result<()> {
    let mut fx = Fixture::new("crash-large").await?;
    fx.install_module("hostpath", "hostpath");
    let class = fx
        .class("hostpath", &[("nodePath", "/srv/volumes")], json!({}))
        .await?;
    let mut crashing = fx.host(&["--fault-exit-after=guest-provision"]);
    let blob = "x".repeat(20 * 1024);
    let claim = fx
        .claim(
            "large",
            &class,
            "1Gi",
            json!({"metadata": {"annotations": {"example.com/blob": blob}}}),
        )
        .await?;
    assert_eq!(crashing.wait(WAIT)?.code(), Some(137));
    let uid = claim.uid().unwrap();
    assert!(
        fx.journal_entries().await?.is_empty(),
        "the journal never takes a claim this large"
    );
    let claim = fx.claims().get("large").await?;
    assert!(
        claim.finalizers().iter().any(|f| f == FINALIZER_CLAIM),
        "the intent is on the claim instead"
    );

    let host = fx.host(&[]);
    let pv = fx.wait_bound("large").await?;
    assert_eq!(pv.name_any(), format!("pvc-{uid}"));
    fx.wait_claim("large", "our finalizer removed once Bound", |c| {
        c.is_some_and(|c| !c.finalizers().iter().any(|f| f == FINALIZER_CLAIM))
    })
    .await?;
    let entries: Vec<_> = std::fs::read_dir(fx.module_data("hostpath"))?.collect();
    assert_eq!(entries.len(), 1, "exactly one backend volume: {entries:?}");
    drop(host);
    fx.cleanup().await;
    Ok(())
}
