//! Hostile answers on the real control plane: a module that answers volume sources it
//! was never granted (`hostPath: /`, the Docker socket, a CSI source naming a Secret in
//! kube-system, any source through the raw JSON variant, a path inside a tenant's
//! volume where the tenant put a symlink to `/`, a node device as a Block volume, mount
//! options that send the node's mount elsewhere, a node keyring, an ungranted flex
//! driver). Each must end in a ProvisioningFailed Event naming the grants rule, no PV,
//! and the backend volume the module made deleted again through its own `delete`; a
//! granted source still binds. A module that moves a tenant's symlink up to where
//! volumes are published is refused by the sandbox itself.

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
      hostPath: [{{ pathPrefix: /srv/publish, directory: /volumes, mountOptions: [noatime] }}]
      local: [{{ pathPrefix: /srv/publish, directory: /volumes }}]
      nfs: [{{ server: nfs.example.com, pathPrefix: /exports, mountOptions: [nfsvers=4.1, rsize=*] }}]
      csi: [{{ driver: csi.example.com, secrets: [storage/publish-creds] }}]
      other: {{ rbd: {{}}, flexVolume: {{ drivers: [example.com/lvm] }} }}
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
    /// Merged into the claim (a Block volume mode).
    claim_extra: serde_json::Value,
    rule: &'static str,
}

fn attacks() -> Vec<Attack> {
    let csi_secret = |namespace: &str, name: &str| {
        json!({"csi": {"driver": "csi.example.com", "volumeHandle": "h",
            "nodePublishSecretRef": {"namespace": namespace, "name": name}}})
        .to_string()
    };
    let attack = |claim, module, parameters: Vec<(&'static str, String)>, rule| Attack {
        claim,
        module,
        parameters,
        claim_extra: json!({}),
        rule,
    };
    vec![
        // A tenant's pod wrote `escape -> /` inside its own volume; the module answers it.
        attack(
            "tenant-symlink",
            "publish",
            vec![
                ("hostPath", "/srv/publish/pvc-tenant/escape".into()),
                ("hostPathType", "Directory".into()),
            ],
            "modules.publish.volumes.hostPath",
        ),
        // A raw node disk: a local volume in Block mode (a link to /dev/sda would do).
        Attack {
            claim: "block-device",
            module: "publish",
            parameters: vec![
                ("local", "/srv/publish/{volume}".into()),
                ("onNode", "node-1".into()),
            ],
            claim_extra: json!({"spec": {"volumeMode": "Block"}}),
            rule: "modules.publish.volumes.local",
        },
        // The node's NFS mount request sent to a host no grant named.
        attack(
            "mount-elsewhere",
            "publish",
            vec![
                ("nfsServer", "nfs.example.com".into()),
                ("nfsPath", "/exports/a".into()),
                (
                    "mountOptions",
                    "vers=3,mountaddr=203.0.113.9,mountport=635".into(),
                ),
            ],
            "modules.publish.volumes.nfs.mountOptions",
        ),
        attack(
            "selinux-context",
            "publish",
            vec![
                ("hostPath", "/srv/publish/{volume}".into()),
                ("hostPathType", "DirectoryOrCreate".into()),
                (
                    "mountOptions",
                    "context=system_u:object_r:container_file_t:s0".into(),
                ),
            ],
            "modules.publish.volumes.hostPath.mountOptions",
        ),
        attack(
            "admin-keyring",
            "publish",
            vec![(
                "json",
                json!({"rbd": {"monitors": ["10.0.0.1:6789"], "image": "i",
                    "keyring": "/etc/ceph/ceph.client.admin.keyring"}})
                .to_string(),
            )],
            "modules.publish.volumes.other.rbd.secrets",
        ),
        attack(
            "flex-driver",
            "publish",
            vec![(
                "json",
                json!({"flexVolume": {"driver": "example.com/root-shell"}}).to_string(),
            )],
            "modules.publish.volumes.other.flexVolume.drivers",
        ),
        Attack {
            claim: "root",
            claim_extra: json!({}),
            module: "publish",
            parameters: vec![
                ("hostPath", "/".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim_extra: json!({}),
            claim: "docker-socket",
            module: "publish",
            parameters: vec![("hostPath", "/var/run/docker.sock".into())],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim_extra: json!({}),
            claim: "climb",
            module: "publish",
            parameters: vec![
                ("hostPath", "/srv/publish/../../etc".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.publish.volumes.hostPath",
        },
        Attack {
            claim_extra: json!({}),
            claim: "socket-type",
            module: "publish",
            parameters: vec![
                ("hostPath", "/srv/publish/{volume}".into()),
                ("hostPathType", "Socket".into()),
            ],
            rule: "modules.publish.volumes.hostPath.types",
        },
        Attack {
            claim_extra: json!({}),
            claim: "kube-system-secret",
            module: "publish",
            parameters: vec![("json", csi_secret("kube-system", "admin-token"))],
            rule: "modules.publish.volumes.csi.secrets",
        },
        Attack {
            claim_extra: json!({}),
            claim: "other-driver",
            module: "publish",
            parameters: vec![("csiDriver", "evil.example.com".into())],
            rule: "modules.publish.volumes.csi",
        },
        Attack {
            claim_extra: json!({}),
            claim: "raw-json",
            module: "publish",
            parameters: vec![(
                "json",
                json!({"cephfs": {"monitors": ["10.0.0.1:6789"], "path": "/"}}).to_string(),
            )],
            rule: "modules.publish.volumes.other.cephfs",
        },
        Attack {
            claim_extra: json!({}),
            claim: "no-grants",
            module: "nogrants",
            parameters: vec![
                ("hostPath", "/srv/publish/x".into()),
                ("hostPathType", "Directory".into()),
            ],
            rule: "modules.nogrants.volumes.hostPath",
        },
        Attack {
            claim_extra: json!({}),
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
                ("hostPath", "/srv/publish/{volume}"),
                ("hostPathType", "DirectoryOrCreate"),
                ("mountOptions", "noatime"),
            ],
            json!({}),
        )
        .await?;
    let claim = fx.claim("granted", &class, "1Mi", json!({})).await?;
    let pv = fx.wait_bound("granted").await?;
    let spec = pv.spec.context("a PV spec")?;
    let host_path = spec.host_path.context("a hostPath PV")?;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    ensure!(host_path.path == format!("/srv/publish/pvc-{uid}"));
    ensure!(spec.mount_options == Some(vec!["noatime".to_string()]));
    // A granted NFS mount option, with any value where the grant says `rsize=*`.
    let class = fx
        .class(
            "publish",
            &[
                ("nfsServer", "nfs.example.com"),
                ("nfsPath", "/exports/b"),
                ("mountOptions", "nfsvers=4.1,rsize=1048576"),
            ],
            json!({}),
        )
        .await?;
    fx.claim("granted-nfs", &class, "1Mi", json!({})).await?;
    fx.wait_bound("granted-nfs").await?;
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
        let claim = fx
            .claim(attack.claim, &class, "1Mi", attack.claim_extra.clone())
            .await?;
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
        published == ["granted", "granted-nfs", "granted-secret"],
        "only the granted claims may have PVs, found {published:?}"
    );
    Ok(())
}

/// A tenant's pod wrote `escape -> /` inside its own volume (here `pvc-tenant`, made by
/// the test as the node would hold it). A module cannot create symlinks, but it can try
/// to rename or hard-link the tenant's one up to `<grant>/<pv name>`, which it then
/// publishes as `<pathPrefix>/<pv name>`, a normal-looking path kubelet would follow to
/// the node's `/`. The sandbox refuses both moves; the symlink stays where the tenant
/// put it and nothing is published.
#[tokio::test]
async fn a_tenant_s_symlink_cannot_be_moved_to_where_volumes_are_published() {
    let mut fx = Fixture::new("publish-rename").await.expect("a fixture");
    let result: anyhow::Result<()> = async {
        write_grants(&fx)?;
        let tenant = fx.module_data("publish").join("pvc-tenant");
        std::fs::create_dir_all(&tenant)?;
        std::os::unix::fs::symlink("/", tenant.join("escape"))?;
        std::os::unix::fs::symlink("/dev/sda", tenant.join("disk"))?;
        fx.install_module("test-publish", "publish");
        let host = fx.host(&[]);
        let attacks = [
            (
                "renamed",
                "renameFrom",
                "pvc-tenant/escape",
                "hostPath",
                "renaming",
            ),
            (
                "linked",
                "linkFrom",
                "pvc-tenant/escape",
                "hostPath",
                "linking",
            ),
            (
                "renamed-disk",
                "renameFrom",
                "pvc-tenant/disk",
                "local",
                "renaming",
            ),
        ];
        let mut volumes = Vec::new();
        for (claim, how, from, kind, _) in attacks {
            let class = fx
                .class(
                    "publish",
                    &[
                        (how, from),
                        (kind, "/srv/publish/{volume}"),
                        ("hostPathType", "Directory"),
                    ],
                    json!({}),
                )
                .await?;
            let created = fx.claim(claim, &class, "1Mi", json!({})).await?;
            volumes.push(format!("pvc-{}", created.metadata.uid.unwrap_or_default()));
        }
        for ((claim, _, from, _, verb), volume) in attacks.iter().zip(&volumes) {
            let note = wait_for(
                &format!("{claim}: the module's move refused by the sandbox"),
                WAIT,
                || async {
                    let events = fx.events(&fx.ctx.namespace, claim).await?;
                    Ok(events
                        .into_iter()
                        .find(|(reason, note)| {
                            reason == "ProvisioningFailed" && note.contains("publish: ")
                        })
                        .map(|(_, note)| note))
                },
            )
            .await
            .with_context(|| host.log_text())?;
            ensure!(
                note.contains(&format!("{verb} {from} to {volume}: not-permitted")),
                "{claim}: the sandbox must refuse the move: {note}"
            );
            ensure!(
                fx.volumes().get_opt(volume).await?.is_none(),
                "{claim}: {volume} was published"
            );
            ensure!(
                std::fs::symlink_metadata(backend_dir(&fx, "publish", volume))
                    .map(|m| !m.file_type().is_symlink())
                    .unwrap_or(true),
                "{claim}: a symlink now stands where the volume's directory is published"
            );
        }
        ensure!(
            std::fs::symlink_metadata(tenant.join("escape"))?
                .file_type()
                .is_symlink()
        );
        ensure!(
            std::fs::symlink_metadata(tenant.join("disk"))?
                .file_type()
                .is_symlink()
        );
        ensure!(
            host.log_text()
                .contains("nothing may be moved or linked into the top level"),
            "the refusal is logged for the module's author"
        );
        Ok(())
    }
    .await;
    match result {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
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
                    ("hostPath", "/srv/publish/{volume}"),
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

        // A capacity no claim allows (u64::MAX bytes for 1Mi, no limit) is no PV either.
        let class = fx
            .class(
                "publish",
                &[
                    ("hostPath", "/srv/publish/{volume}"),
                    ("hostPathType", "Directory"),
                    ("capacityBytes", "18446744073709551615"),
                ],
                json!({}),
            )
            .await?;
        let claim = fx.claim("huge", &class, "1Mi", json!({})).await?;
        let volume = format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default());
        let note = fx
            .wait_claim_event("huge", "ProvisioningFailed")
            .await
            .with_context(|| host.log_text())?;
        ensure!(
            note.contains("allows at most") && note.contains("the backend volume was deleted"),
            "{note}"
        );
        ensure!(fx.volumes().get_opt(&volume).await?.is_none());
        Ok(())
    }
    .await;
    match result {
        Ok(()) => fx.cleanup().await,
        Err(error) => panic!("{error:?}"),
    }
}
