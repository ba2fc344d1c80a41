//! Secrets through grants, on the real control plane: a class names a Secret, the
//! admin's grants file bounds which ones a module may receive, the host reads it (with
//! `deploy/rbac.yaml` plus a Role for exactly that Secret, as docs/security.md tells an
//! admin to grant) and hands it to the guest for `provision` and `delete`; the value
//! appears nowhere else. A Secret outside the grant, or missing, keeps the claim Pending
//! with a clear Event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use wasm_provisioner_tests::access::{self, Access};
use wasm_provisioner_tests::fixture::{Fixture, TEST_VOLUME_GRANTS, scenario};
use wasm_provisioner_tests::host::Host;

/// A request the test API received: (op, volume, authorization header).
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// A storage API on 127.0.0.1 that answers 200 to `Bearer <token>` and 401 otherwise,
/// recording every request. Returns its port.
async fn storage_api(token: String, seen: Seen) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (token, seen) = (token.clone(), seen.clone());
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 8192];
                let n = socket.read(&mut buffer).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&buffer[..n]).to_string();
                let query = text
                    .lines()
                    .next()
                    .and_then(|line| line.split(' ').nth(1))
                    .and_then(|target| target.split_once('?'))
                    .map(|(_, query)| query.to_string())
                    .unwrap_or_default();
                let param = |key: &str| {
                    query
                        .split('&')
                        .find_map(|pair| pair.strip_prefix(&format!("{key}=")))
                        .unwrap_or_default()
                        .to_string()
                };
                let authorization = text
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("authorization")
                            .then(|| value.trim().to_string())
                    })
                    .unwrap_or_default();
                let ok = authorization == format!("Bearer {token}");
                seen.lock()
                    .unwrap()
                    .push((param("op"), param("volume"), authorization));
                let status = if ok { "200 OK" } else { "401 Unauthorized" };
                let response =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    port
}

/// Grants module `bearer` HTTP to the test API and the Secrets `patterns`.
fn write_grants(fx: &Fixture, port: u16, patterns: &[&str]) -> anyhow::Result<()> {
    let dir = fx.data.join("bearer");
    std::fs::create_dir_all(&dir)?;
    let patterns: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
    let text = format!(
        "allow:\n  directories: [{data}]\n  httpHosts: [\"127.0.0.1:{port}\"]\nmodules:\n  bearer:\n    directories:\n      - {{ host: {dir}, guest: /volumes, mode: read-write }}\n    http: [{{ host: \"127.0.0.1:{port}\", scheme: http }}]\n    secrets: [{patterns}]\n{TEST_VOLUME_GRANTS}",
        data = fx.data.display(),
        dir = dir.display(),
        patterns = patterns.join(", "),
    );
    std::fs::write(&fx.grants, text)?;
    Ok(())
}

/// `get` on exactly the Secrets `names` of the fixture's namespace, for the host's
/// ServiceAccount: the scoped grant docs/security.md describes.
async fn let_read(fx: &Fixture, names: &[&str]) -> anyhow::Result<()> {
    let namespace = &fx.ctx.namespace;
    let client = fx.ctx.client.clone();
    let meta = ObjectMeta {
        name: Some("wasm-provisioner-secrets".into()),
        ..Default::default()
    };
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(names.iter().map(|n| n.to_string()).collect()),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .context("creating the secrets Role")?;
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "wasm-provisioner-secrets".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: access::ACCOUNT.into(),
            namespace: Some(namespace.clone()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .context("creating the secrets RoleBinding")?;
    Ok(())
}

async fn create_secret(fx: &Fixture, name: &str, token: &str) -> anyhow::Result<()> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fx.ctx.client.clone(), &fx.ctx.namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {name}"))?;
    Ok(())
}

/// A host running as the ServiceAccount of deploy/rbac.yaml, plus `let_read`'s Role.
async fn start_host(fx: &Fixture) -> anyhow::Result<(Access, Host)> {
    let (cluster_rules, leader_rules) = access::deploy_rules()?;
    let access = Access::grant(fx, cluster_rules, leader_rules).await?;
    fx.install_module("test-bearer", "bearer");
    let host = Host::start(&access.host_config(fx, &[]))?;
    Ok((access, host))
}

/// How many `provision` calls of module `bearer` were made.
fn provision_calls(host: &Host) -> f64 {
    host.metric(
        "wasm_provisioner_guest_call_duration_seconds_count{call=\"provision\",module=\"bearer\",outcome=\"success\"}",
    )
    .unwrap_or_default()
}

#[tokio::test]
async fn a_granted_secret_reaches_the_guest_and_nothing_else() {
    scenario("secret-granted", async |fx| {
        let token = format!("s3cr3t-{}", fx.ctx.namespace);
        let seen = Seen::default();
        let port = storage_api(token.clone(), seen.clone()).await;
        write_grants(fx, port, &["${pvc.namespace}/api-token"])?;
        let_read(fx, &["api-token"]).await?;
        let (access, host) = start_host(fx).await?;
        let class = fx
            .class(
                "bearer",
                &[
                    ("url", &format!("http://127.0.0.1:{port}/volumes")),
                    ("secretNamespace", "${pvc.namespace}"),
                    ("secretName", "api-token"),
                ],
                json!({ "allowVolumeExpansion": true }),
            )
            .await?;

        // Missing first: Pending, with an Event that says so; nothing is provisioned.
        fx.claim("data", &class, "1Mi", json!({})).await?;
        let note = fx
            .wait_claim_event("data", "ProvisioningFailed")
            .await
            .with_context(|| host.log_tail())?;
        let secret = format!("{}/api-token", fx.ctx.namespace);
        ensure!(
            note.contains(&format!("Secret {secret} does not exist")),
            "the Event does not say the Secret is missing: {note}"
        );
        ensure!(
            provision_calls(&host) == 0.0,
            "provisioned without its Secret"
        );

        // Created: the claim binds, the API saw the token, the PV records the reference.
        create_secret(fx, "api-token", &token).await?;
        let pv = fx
            .wait_bound("data")
            .await
            .with_context(|| host.log_tail())?;
        let bearer = format!("Bearer {token}");
        let calls = seen.lock().unwrap().clone();
        ensure!(
            calls.iter().any(|(op, volume, auth)| op == "provision"
                && *volume == pv.name_any()
                && *auth == bearer),
            "the API never saw the provision with the token: {calls:?}"
        );
        ensure!(
            pv.annotations().get("wasm-provisioner.dev/secret") == Some(&secret),
            "the PV does not record the Secret's reference: {:?}",
            pv.annotations()
        );

        // The value appears nowhere but in the call: not in the PV, Events or the log.
        let pv_json = serde_json::to_string(&pv)?;
        ensure!(
            !pv_json.contains(&token),
            "the token is in the PV: {pv_json}"
        );
        let events = fx.events(&fx.ctx.namespace, "data").await?;
        ensure!(
            !format!("{events:?}").contains(&token),
            "the token is in an Event: {events:?}"
        );

        // Expanded: the guest's expand gets the Secret again (from the PV's record).
        let grow = json!({ "spec": { "resources": { "requests": { "storage": "2Mi" } } } });
        fx.claims()
            .patch("data", &PatchParams::default(), &Patch::Merge(&grow))
            .await?;
        fx.wait_claim("data", "expanded to 2Mi", |claim| {
            claim
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .is_some_and(|q| q.0 == "2Mi")
        })
        .await
        .with_context(|| host.log_tail())?;
        let calls = seen.lock().unwrap().clone();
        ensure!(
            calls.iter().any(|(op, volume, auth)| op == "expand"
                && *volume == pv.name_any()
                && *auth == bearer),
            "the API never saw the expand with the token: {calls:?}"
        );

        // Deleted: the guest's delete gets the Secret again (from the PV's record).
        fx.claims().delete("data", &DeleteParams::default()).await?;
        fx.wait_volume_gone(&pv.name_any())
            .await
            .with_context(|| host.log_tail())?;
        let calls = seen.lock().unwrap().clone();
        ensure!(
            calls.iter().any(|(op, volume, auth)| op == "delete"
                && *volume == pv.name_any()
                && *auth == bearer),
            "the API never saw the delete with the token: {calls:?}"
        );
        ensure!(
            !host.log_text().contains(&token),
            "the token is in the host's log"
        );
        drop(host);
        access.revoke().await
    })
    .await;
}

#[tokio::test]
async fn a_secret_outside_the_grant_is_refused_with_a_clear_event() {
    scenario("secret-refused", async |fx| {
        let seen = Seen::default();
        let port = storage_api("unused".into(), seen.clone()).await;
        write_grants(fx, port, &["${pvc.namespace}/api-token"])?;
        // The host could read it (RBAC allows), but the admin's grant does not.
        create_secret(fx, "admin-token", "do-not-leak").await?;
        let_read(fx, &["api-token", "admin-token"]).await?;
        let (access, host) = start_host(fx).await?;
        let class = fx
            .class(
                "bearer",
                &[
                    ("url", &format!("http://127.0.0.1:{port}/volumes")),
                    ("secretNamespace", "${pvc.namespace}"),
                    ("secretName", "admin-token"),
                ],
                json!({}),
            )
            .await?;
        fx.claim("data", &class, "1Mi", json!({})).await?;
        let note = fx
            .wait_claim_event("data", "ProvisioningFailed")
            .await
            .with_context(|| host.log_tail())?;
        ensure!(
            note.contains(&format!(
                "Secret {}/admin-token is not granted to module bearer",
                fx.ctx.namespace
            )) && note.contains("modules.bearer.secrets"),
            "the Event does not say the Secret is not granted: {note}"
        );
        // Still Pending a while later (retried with back-off), and the guest never called.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let claim = fx.claims().get("data").await?;
        let phase = claim.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(phase == "Pending", "the claim is {phase}, not Pending");
        ensure!(provision_calls(&host) == 0.0, "the guest was called");
        ensure!(seen.lock().unwrap().is_empty(), "the API was called");
        drop(host);
        access.revoke().await
    })
    .await;
}
