//! Proves the test control plane is the real thing: the pinned release, the real PV
//! binder and protection controllers, and RBAC enforced.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use wasm_provisioner_tests::cluster::{
    TestContext, client_with_token, pinned_kubernetes_version, random_suffix,
    service_account_token, wait_for,
};

const WAIT: Duration = Duration::from_secs(60);

fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("1Gi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn version_reports_the_pinned_release() -> anyhow::Result<()> {
    let ctx = TestContext::new("version").await?;
    let version = ctx.client.apiserver_version().await?;
    assert_eq!(version.git_version, pinned_kubernetes_version());
    assert_eq!(version.major, "1");
    ctx.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn binder_annotates_claims_of_an_external_provisioner() -> anyhow::Result<()> {
    let ctx = TestContext::new("binder-annotates").await?;
    let class_name = format!("external-{}", random_suffix());
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some(class_name.clone()),
                    ..Default::default()
                },
                provisioner: "example.com/external".into(),
                ..Default::default()
            },
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    claims
        .create(&PostParams::default(), &claim("data", &class_name))
        .await?;

    let provisioner = wait_for("the binder to annotate the claim", WAIT, || async {
        let claim = claims.get("data").await?;
        Ok(claim
            .annotations()
            .get("volume.kubernetes.io/storage-provisioner")
            .cloned())
    })
    .await?;
    assert_eq!(provisioner, "example.com/external");

    classes
        .delete(&class_name, &DeleteParams::default())
        .await?;
    ctx.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn hand_made_volume_binds_and_is_released_when_the_claim_goes() -> anyhow::Result<()> {
    let ctx = TestContext::new("bind-release").await?;
    let volume_name = format!("manual-{}", random_suffix());
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    volumes
        .create(
            &PostParams::default(),
            &PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(volume_name.clone()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    capacity: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    persistent_volume_reclaim_policy: Some("Retain".into()),
                    storage_class_name: Some(String::new()),
                    host_path: Some(HostPathVolumeSource {
                        path: format!("/tmp/{volume_name}"),
                        ..Default::default()
                    }),
                    // Pre-bind so no other test's claim can take this volume.
                    claim_ref: Some(ObjectReference {
                        namespace: Some(ctx.namespace.clone()),
                        name: Some("data".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    claims
        .create(&PostParams::default(), &claim("data", ""))
        .await?;

    wait_for("the claim to be Bound", WAIT, || async {
        let claim = claims.get("data").await?;
        let bound = claim.status.and_then(|s| s.phase).as_deref() == Some("Bound");
        Ok(bound.then_some(()))
    })
    .await?;
    let bound_to = claims.get("data").await?.spec.and_then(|s| s.volume_name);
    assert_eq!(bound_to.as_deref(), Some(volume_name.as_str()));
    let volume = volumes.get(&volume_name).await?;
    assert_eq!(
        volume.status.and_then(|s| s.phase).as_deref(),
        Some("Bound")
    );

    claims.delete("data", &DeleteParams::default()).await?;
    wait_for("the claim to be really gone", WAIT, || async {
        Ok(claims.get_opt("data").await?.is_none().then_some(()))
    })
    .await?;
    wait_for("the volume to be Released", WAIT, || async {
        let volume = volumes.get(&volume_name).await?;
        Ok((volume.status.and_then(|s| s.phase).as_deref() == Some("Released")).then_some(()))
    })
    .await?;

    volumes
        .delete(&volume_name, &DeleteParams::default())
        .await?;
    wait_for("the volume to be really gone", WAIT, || async {
        Ok(volumes.get_opt(&volume_name).await?.is_none().then_some(()))
    })
    .await?;
    ctx.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn rbac_refuses_a_token_without_the_permission() -> anyhow::Result<()> {
    let ctx = TestContext::new("rbac").await?;
    let token = service_account_token(&ctx.client, &ctx.namespace, "nobody").await?;
    let restricted = client_with_token(&token).await?;

    let volumes: Api<PersistentVolume> = Api::all(restricted.clone());
    match volumes.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "expected Forbidden, got {status:?}");
            assert!(
                status.message.contains("system:serviceaccount:")
                    && status.message.contains(":nobody"),
                "the refusal names the account: {}",
                status.message
            );
        }
        other => panic!("listing PVs without RBAC must be refused with 403, got {other:?}"),
    }

    // The same token works for what it is allowed: its own identity.
    let version = restricted.apiserver_version().await?;
    assert_eq!(version.git_version, pinned_kubernetes_version());
    ctx.cleanup().await;
    Ok(())
}

/// `controlplane run` stops every component it started, and removes its directory,
/// when the process that started it dies (even with the read end of its stdout gone).
#[tokio::test]
async fn launcher_leaves_nothing_behind_when_its_parent_dies() -> anyhow::Result<()> {
    let launcher = wasm_provisioner_tests::cluster::launcher_binary()?;
    // A parent that reads the kubeconfig line, then exits at once.
    let output = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"exec 3< <("$0" run 2>/dev/null); read -r line <&3; echo "$line""#)
        .arg(&launcher)
        .output()?;
    let line = String::from_utf8(output.stdout)?;
    let kubeconfig = line
        .trim()
        .strip_prefix("kubeconfig: ")
        .ok_or_else(|| anyhow::anyhow!("no kubeconfig line from the launcher: {line:?}"))?
        .to_string();
    let dir = std::path::Path::new(&kubeconfig)
        .parent()
        .unwrap()
        .to_path_buf();
    wait_for(
        "the launcher to clean up after its parent died",
        Duration::from_secs(60),
        || async {
            let running = std::process::Command::new("pgrep")
                .args(["-f", &dir.display().to_string()])
                .output()?;
            let gone = !dir.exists() && running.stdout.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    Ok(())
}
