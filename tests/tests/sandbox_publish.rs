//! The attack of issue 9.1 on the real control plane: a module that answers volume
//! sources it was never granted (`hostPath: /`, the Docker socket, a CSI source naming a
//! Secret in kube-system, any source through the raw JSON variant). Each must end in a
//! ProvisioningFailed Event naming the grants rule, no PV, and the backend volume the
//! module made deleted again through its own `delete`; a granted source still binds.

use std::path::Path;

use anyhow::{Context as _, ensure};
use serde_json::json;
use wasm_provisioner_tests::cluster::wait_for;
use wasm_provisioner_tests::fixture::{Fixture, WAIT};

/// The hostile module, installed twice: `publish` has a narrow volume grant, `nogrants`
/// has a directory but may publish nothing.
fn write_grants(fx: &Fixture) -> anyhow::Result<()> {
    for module in ["publish", "nogrants"] {
        std::fs::create_dir_all(fx.module_data(module))?;
    }
    let text = format!(
        r#"
allow: {{ directories: [{data}] }}
modules:
  publish:
    directories: [{{ host: {publish}, guest: /volumes, mode: read-write }}]
    volumes:
      hostPath: [{{ pathPrefix: /srv/publish }}]
      csi: [{{ driver: csi.example.com, secrets: [storage/publish-creds] }}]
  nogrants:
    directories: [{{ host: {nogrants}, guest: /volumes, mode: read-write }}]
"#,
        data = fx.data.display(),
        publish = fx.module_data("publish").display(),
        nogrants = fx.module_data("nogrants").display(),
    );
    std::fs::write(&fx.grants, text)?;
    Ok(())
}

/// One hostile answer: the module, its class parameters, and the rule the refusal names.
struct Attack {
    claim: &'static str,
    module: &'static str,
    parameters: Vec<(&'static str, String)>,
    rule: &'static str,
}

fn attacks() -> Vec<Attack> {
    let csi_secret = |namespace: &str, name: &str| {
        json!({"csi": {"driver": "csi.example.com", "volumeHandle": "h",
            "nodePublishSecretRef": {"namespace": namespace, "name": name}}})
        .to_string()
    };
    vec![
        Attack {
            claim: "root",
            module: "publish",
            parameters: vec![
                ("hostPath", "/".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim: "docker-socket",
            module: "publish",
            parameters: vec![("hostPath", "/var/run/docker.sock".into())],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim: "climb",
            module: "publish",
            parameters: vec![
                ("hostPath", "/srv/publish/../../etc".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim: "socket-type",
            module: "publish",
            parameters: vec![
                ("hostPath", "/srv/publish/sock".into()),
                ("hostPathType", "Socket".into()),
            ],
            rule: "modules.publish.volumes.hostPath.types",
        },
        Attack {
            claim: "kube-system-secret",
            module: "publish",
            parameters: vec![("json", csi_secret("kube-system", "admin-token"))],
            rule: "modules.publish.volumes.csi.secrets",
        },
        Attack {
            claim: "other-driver",
            module: "publish",
            parameters: vec![("csiDriver", "evil.example.com".into())],
            rule: "modules.publish.volumes.csi",
        },
        Attack {
            claim: "raw-json",
            module: "publish",
            parameters: vec![(
                "json",
                json!({"cephfs": {"monitors": ["10.0.0.1:6789"], "path": "/"}}).to_string(),
            )],
            rule: "modules.publish.volumes.other.cephfs",
        },
        Attack {
            claim: "no-grants",
            module: "nogrants",
            parameters: vec![
                ("hostPath", "/srv/publish/x".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.nogrants.volumes.hostPath",
        },
        Attack {
            claim: "no-grants-nfs",
            module: "nogrants",
            parameters: vec![("nfsServer", "10.0.0.9".into())],
            rule: "modules.nogrants.volumes.nfs",
        },
    ]
}

fn backend_dir(fx: &Fixture, module: &str, volume: &str) -> std::path::PathBuf {
    fx.module_data(module).join(volume)
}

async fn run(fx: &mut Fixture) -> anyhow::Result<()> {
    write_grants(fx)?;
    fx.install_module("test-publish", "publish");
    fx.install_module("test-publish", "nogrants");
    let host = fx.host(&[]);

    // The control: a granted source binds, so the refusals below are not a broken host.
    let class = fx
        .class(
            "publish",
            &[
                ("hostPath", "/srv/publish/granted"),
                ("hostPathType", "DirectoryOrCreate"),
            ],
            json!({}),
        )
        .await?;
    fx.claim("granted", &class, "1Mi", json!({})).await?;
    let pv = fx.wait_bound("granted").await?;
    let host_path = pv.spec.and_then(|s| s.host_path).context("a hostPath PV")?;
    ensure!(host_path.path == "/srv/publish/granted");
    // With a secret the grant names, a CSI source is published too.
    let class = fx
        .class(
            "publish",
            &[(
                "json",
                &json!({"csi": {"driver": "csi.example.com", "volumeHandle": "h",
                    "nodePublishSecretRef": {"namespace": "storage", "name": "publish-creds"}}})
                .to_string(),
            )],
            json!({}),
        )
        .await?;
    fx.claim("granted-secret", &class, "1Mi", json!({})).await?;
    fx.wait_bound("granted-secret").await?;

    let mut claims = Vec::new();
    for attack in attacks() {
        let parameters: Vec<(&str, &str)> = attack
            .parameters
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let class = fx.class(attack.module, &parameters, json!({})).await?;
        let claim = fx.claim(attack.claim, &class, "1Mi", json!({})).await?;
        let volume = format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default());
        claims.push((attack, volume));
    }
    for (attack, volume) in &claims {
        // The refusal's Event (an earlier one may say the class was not in the host's
        // cache yet: a different note is an Event of its own).
        let note = wait_for(
            &format!(
                "attack {}: a ProvisioningFailed Event naming a rule",
                attack.claim
            ),
            WAIT,
            || async {
                let events = fx.events(&fx.ctx.namespace, attack.claim).await?;
                Ok(events
                    .into_iter()
                    .find(|(reason, note)| {
                        reason == "ProvisioningFailed" && note.contains("(rule ")
                    })
                    .map(|(_, note)| note))
            },
        )
        .await
        .with_context(|| format!("attack {}\n{}", attack.claim, host.log_text()))?;
        ensure!(
            note.contains(&format!("(rule {})", attack.rule)),
            "attack {}: the Event must name the rule {}: {note}",
            attack.claim,
            attack.rule
        );
        ensure!(
            note.contains("the backend volume was deleted"),
            "attack {}: the Event must say the backend volume was cleaned up: {note}",
            attack.claim
        );
        ensure!(
            fx.volumes().get_opt(volume).await?.is_none(),
            "attack {}: volume {volume} was published",
            attack.claim
        );
        // The module made a backend directory and was made to delete it again.
        let dir = backend_dir(fx, attack.module, volume);
        wait_for(
            &format!("attack {}: backend {} deleted", attack.claim, dir.display()),
            WAIT,
            || async { Ok((!Path::new(&dir).exists()).then_some(())) },
        )
        .await?;
    }
    // Nothing hostile is published on any retry either.
    let published: Vec<String> = fx
        .volumes()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.namespace.as_deref())
                == Some(fx.ctx.namespace.as_str())
        })
        .filter_map(|pv| pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.name))
        .collect();
    let mut published = published;
    published.sort();
    ensure!(
        published == ["granted", "granted-secret"],
        "only the granted claims may have PVs, found {published:?}"
    );
    Ok(())
}

#[tokio::test]
async fn module_cannot_publish_a_volume_source_it_was_not_granted() {
    let mut fx = Fixture::new("publish-grants").await.expect("a fixture");
    match run(&mut fx).await {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}

/// An answer that can never become a PV (here: less capacity than the claim asked for)
/// is discarded at once: its backend volume is deleted through the module, and deleting
/// the claim afterwards is never stuck behind the provisioning finalizer.
#[tokio::test]
async fn an_answer_that_cannot_be_published_is_cleaned_up_at_once() {
    let mut fx = Fixture::new("publish-invalid").await.expect("a fixture");
    let result: anyhow::Result<()> = async {
        write_grants(&fx)?;
        fx.install_module("test-publish", "publish");
        let host = fx.host(&[]);
        let class = fx
            .class(
                "publish",
                &[
                    ("hostPath", "/srv/publish/small"),
                    ("hostPathType", "Directory"),
                    ("capacityBytes", "1"),
                ],
                json!({}),
            )
            .await?;
        let claim = fx.claim("small", &class, "1Mi", json!({})).await?;
        let volume = format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default());
        let note = fx
            .wait_claim_event("small", "ProvisioningFailed")
            .await
            .with_context(|| host.log_text())?;
        ensure!(
            note.contains("cannot be published") && note.contains("the backend volume was deleted"),
            "{note}"
        );
        let dir = backend_dir(&fx, "publish", &volume);
        wait_for("the backend volume deleted", WAIT, || async {
            Ok((!dir.exists()).then_some(()))
        })
        .await?;
        fx.claims().delete("small", &Default::default()).await?;
        fx.wait_claim("small", "gone", |claim| claim.is_none())
            .await
            .with_context(|| host.log_text())?;
        ensure!(fx.volumes().get_opt(&volume).await?.is_none());
        Ok(())
    }
    .await;
    match result {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}
