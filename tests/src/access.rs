//! A host that runs with exactly the RBAC of `deploy/rbac.yaml` (or less of it): a
//! ServiceAccount of the fixture's namespace, its ClusterRole and leader Role, and a
//! kubeconfig with its token.

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize as _;
use std::path::PathBuf;

use crate::cluster::{admin_kubeconfig, repo_root, service_account_token, wait_for};
use crate::fixture::{Fixture, WAIT};
use crate::host::HostConfig;
use crate::kubeconfig;

/// The ServiceAccount the host runs as, in the fixture's namespace.
pub const ACCOUNT: &str = "wasm-provisioner";
/// The leader-election Role and RoleBinding, in the fixture's namespace.
pub const LEADER_ROLE: &str = "wasm-provisioner-leader";

/// The rules of the ClusterRole and of the leader-election Role in `deploy/rbac.yaml`.
pub fn deploy_rules() -> anyhow::Result<(Vec<PolicyRule>, Vec<PolicyRule>)> {
    let path = repo_root().join("deploy/rbac.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut cluster_roles = Vec::new();
    let mut roles = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("parsing {}", path.display()))?;
        match value.get("kind").and_then(serde_yaml::Value::as_str) {
            Some("ClusterRole") => {
                cluster_roles.push(serde_yaml::from_value::<ClusterRole>(value)?)
            }
            Some("Role") => roles.push(serde_yaml::from_value::<Role>(value)?),
            _ => {}
        }
    }
    let ([cluster_role], [role]) = (cluster_roles.as_slice(), roles.as_slice()) else {
        bail!(
            "{} should hold one ClusterRole and one Role, not {} and {}",
            path.display(),
            cluster_roles.len(),
            roles.len()
        );
    };
    let cluster_rules = cluster_role.rules.clone().unwrap_or_default();
    let leader_rules = role.rules.clone().unwrap_or_default();
    ensure!(
        !cluster_rules.is_empty() && !leader_rules.is_empty(),
        "{} has a role without rules",
        path.display()
    );
    Ok((cluster_rules, leader_rules))
}

/// Takes `verb` away from every core-group rule on `resource`; fails if none granted it.
pub fn without_verb(rules: &mut [PolicyRule], resource: &str, verb: &str) -> anyhow::Result<()> {
    let mut removed = false;
    for rule in rules.iter_mut() {
        let core = rule
            .api_groups
            .as_ref()
            .is_some_and(|groups| groups.iter().any(|g| g.is_empty()));
        let on_resource = rule
            .resources
            .as_ref()
            .is_some_and(|resources| resources.iter().any(|r| r == resource));
        if core && on_resource {
            let before = rule.verbs.len();
            rule.verbs.retain(|v| v != verb);
            removed |= rule.verbs.len() != before;
        }
    }
    ensure!(removed, "no rule granted {verb:?} on {resource:?}");
    Ok(())
}

/// A ServiceAccount of the fixture's namespace with a ClusterRole and a leader Role of
/// their own (test-unique names), and a kubeconfig that authenticates as it.
pub struct Access {
    client: Client,
    /// The name of the ClusterRole and of its ClusterRoleBinding.
    name: String,
    kubeconfig: PathBuf,
}

impl Access {
    pub async fn grant(
        fx: &Fixture,
        cluster_rules: Vec<PolicyRule>,
        leader_rules: Vec<PolicyRule>,
    ) -> anyhow::Result<Access> {
        let client = fx.ctx.client.clone();
        let namespace = fx.ctx.namespace.clone();
        let name = format!("wasm-provisioner-{namespace}");
        // The cluster-scoped objects are owned by the namespace too, so the garbage
        // collector removes them with it should a test fail before revoking.
        let owner = Api::<Namespace>::all(client.clone())
            .get(&namespace)
            .await?;
        let owned = |name: &str| ObjectMeta {
            name: Some(name.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name: namespace.clone(),
                uid: owner.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let subjects = Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: ACCOUNT.into(),
            namespace: Some(namespace.clone()),
            ..Default::default()
        }]);
        let post = PostParams::default();

        let cluster_role = ClusterRole {
            metadata: owned(&name),
            rules: Some(cluster_rules),
            ..Default::default()
        };
        Api::<ClusterRole>::all(client.clone())
            .create(&post, &cluster_role)
            .await
            .with_context(|| format!("creating ClusterRole {name}"))?;
        let binding = ClusterRoleBinding {
            metadata: owned(&name),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.clone(),
            },
            subjects: subjects.clone(),
        };
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&post, &binding)
            .await
            .with_context(|| format!("creating ClusterRoleBinding {name}"))?;

        let leader = LEADER_ROLE;
        let role = Role {
            metadata: ObjectMeta {
                name: Some(leader.into()),
                ..Default::default()
            },
            rules: Some(leader_rules),
        };
        Api::<Role>::namespaced(client.clone(), &namespace)
            .create(&post, &role)
            .await
            .context("creating the leader Role")?;
        let role_binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(leader.into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: leader.into(),
            },
            subjects,
        };
        Api::<RoleBinding>::namespaced(client.clone(), &namespace)
            .create(&post, &role_binding)
            .await
            .context("creating the leader RoleBinding")?;

        let token = service_account_token(&client, &namespace, ACCOUNT).await?;
        let kubeconfig = fx.root.join("service-account.kubeconfig");
        kubeconfig::write_with_token(&admin_kubeconfig(), &token, &kubeconfig)?;
        Ok(Access {
            client,
            name,
            kubeconfig,
        })
    }

    /// A host config for the fixture that runs as this account.
    pub fn host_config(&self, fx: &Fixture, flags: &[&str]) -> HostConfig {
        let mut config = fx.host_config(flags);
        config.kubeconfig = self.kubeconfig.clone();
        config
    }

    /// Takes the leader-election Role away (its RoleBinding is deleted): the host can
    /// no longer read or renew its Lease.
    pub async fn revoke_leader(&self, namespace: &str) -> anyhow::Result<()> {
        Api::<RoleBinding>::namespaced(self.client.clone(), namespace)
            .delete(LEADER_ROLE, &DeleteParams::default())
            .await
            .context("deleting the leader RoleBinding")?;
        Ok(())
    }

    /// Deletes the cluster-scoped objects and waits until they are gone.
    pub async fn revoke(self) -> anyhow::Result<()> {
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let _ = bindings.delete(&self.name, &DeleteParams::default()).await;
        let _ = roles.delete(&self.name, &DeleteParams::default()).await;
        wait_for(
            &format!(
                "ClusterRole and ClusterRoleBinding {} to be gone",
                self.name
            ),
            WAIT,
            || async {
                let gone = bindings.get_opt(&self.name).await?.is_none()
                    && roles.get_opt(&self.name).await?.is_none();
                Ok(gone.then_some(()))
            },
        )
        .await
    }
}
