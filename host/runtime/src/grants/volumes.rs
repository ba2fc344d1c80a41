//! Volume-source grants: which volume sources a module may publish as a PV.
//!
//! A PV's volume source is what kubelet mounts into a tenant's pod, with the node's
//! authority: `hostPath: /` is root on the node, a CSI `nodePublishSecretRef` naming a
//! Secret in `kube-system` hands that Secret to the driver on the tenant's behalf. So the
//! host checks every volume a module answers against the module's `volumes` grants in the
//! admin's grants file before anything is published, default deny: a module without a
//! grant of a source kind cannot publish that kind at all.
//!
//! ```yaml
//! modules:
//!   hostpath:
//!     volumes:
//!       hostPath: [{ pathPrefix: /var/lib/wasm-provisioner/hostpath }]   # types: [Directory, DirectoryOrCreate]
//!       local:    [{ pathPrefix: /mnt/disks }]
//!   nfs-subdir:
//!     volumes:
//!       nfs:      [{ server: nfs.example.com, pathPrefix: /exports }]
//!   cloud:
//!     volumes:
//!       csi:      [{ driver: ebs.csi.aws.com, secrets: [kube-system/ebs-publish] }]
//!       iscsi:    [{ portals: ["10.0.0.5:3260"], secrets: [storage/chap] }]
//!       other:    { cephfs: { secrets: [ceph/admin] } }
//! ```
//!
//! Rules. Paths are compared after checking they are absolute and already normal (no
//! `.`, `..` or empty components). A hostPath or local path must be exactly
//! `<granted pathPrefix>/<pv name>`: the prefix is the node path of one of the module's
//! directory grants (its `directory`), whose top level only the module writes, never a
//! tenant, and where the sandbox lets no symlink appear (see `fs_rules`); the host then
//! checks through its own handle of that grant that `<pv name>` is no symlink
//! ([`VolumeDirectory`]). A deeper path would lie inside some volume, where a tenant
//! may put a symlink to the node's `/` at any time. hostPath and local volumes are
//! filesystem volumes (`volumeMode: Block` would hand out a node device). An NFS path
//! lies at or below a granted prefix on the granted server; a hostPath `type` must be
//! set and one of the grant's directory kinds. Mount options the module adds (beyond
//! the class's, which the admin wrote) must each be listed by the grant's
//! `mountOptions` (`name=*` allows any value of `name`), default none. Every secret reference anywhere in the source (all CSI
//! `*SecretRef`s, `secretRef` of iSCSI and the other kinds, azureFile's `secretName`)
//! must name a namespace and be listed, as `namespace/name`, by the grant that allowed
//! the source; a field that looks like a secret but is not a known reference is refused.
//! Any source kind other than the five typed ones needs an `other` grant by its key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::DirectoryGrant;
use wasm_provisioner_rules::volume::SOURCE_KEYS;

/// hostPath types a grant may allow: the directory kinds. `""` (no check), `File`,
/// `Socket`, `CharDevice` and `BlockDevice` would let a module hand out node files,
/// sockets (`/var/run/docker.sock`) and devices.
pub const DIRECTORY_TYPES: [&str; 2] = ["Directory", "DirectoryOrCreate"];

/// The typed kinds; anything else in [`SOURCE_KEYS`] is an `other` kind.
const TYPED_KINDS: [&str; 5] = ["hostPath", "local", "nfs", "csi", "iscsi"];

/// A Secret a source may reference, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretName {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// hostPath or local: the node directory whose entries `<pv name>` may be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathGrant {
    pub path_prefix: String,
    /// hostPath types allowed (a subset of [`DIRECTORY_TYPES`]); unused for local.
    pub types: Vec<String>,
    /// The guest path of the module's directory grant that is this node directory as
    /// the host sees it: where the host checks each published volume.
    pub directory: String,
    pub mount_options: Vec<String>,
}

/// A published hostPath or local volume's directory, for the host to check in the
/// module's directory grant `directory` (a guest path) before publishing: `name` must
/// not be a symlink or anything but a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDirectory {
    pub directory: String,
    pub name: String,
    /// The grants rule that allowed it, for a refusal of the directory.
    pub rule: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsGrant {
    /// Lowercase server name or address.
    pub server: String,
    pub path_prefix: String,
    pub mount_options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiGrant {
    pub driver: String,
    pub secrets: Vec<SecretName>,
    pub mount_options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiGrant {
    /// `host:port` portals; the target portal and every extra portal must be listed.
    pub portals: Vec<String>,
    pub secrets: Vec<SecretName>,
    pub mount_options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OtherGrant {
    pub secrets: Vec<SecretName>,
    /// For a kind that names a driver (`flexVolume`): the drivers allowed; such a kind
    /// cannot be granted without them.
    pub drivers: Vec<String>,
    pub mount_options: Vec<String>,
}

/// Source kinds whose `driver` field picks node code to run: granting the kind must
/// name the drivers.
const DRIVER_KINDS: [&str; 1] = ["flexVolume"];

/// Everything a module may publish. The default publishes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeGrants {
    pub host_path: Vec<PathGrant>,
    pub local: Vec<PathGrant>,
    pub nfs: Vec<NfsGrant>,
    pub csi: Vec<CsiGrant>,
    pub iscsi: Vec<IscsiGrant>,
    /// By PersistentVolumeSource key, such as `cephfs`.
    pub other: BTreeMap<String, OtherGrant>,
}

/// A volume source a module may not publish: which rule refused it and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "module {module} may not publish volume {volume}: {reason} (rule {rule}); nothing was published. If the module should publish it, the cluster admin grants it in modules.{module}.volumes of the grants file"
)]
pub struct SourceRefused {
    pub module: String,
    pub volume: String,
    /// The grants-file field whose rule refused the source, e.g.
    /// `modules.hostpath.volumes.hostPath`.
    pub rule: String,
    pub reason: String,
}

impl VolumeGrants {
    /// Checks the volume source of `spec`, the PV that `module`'s answer for `volume`
    /// became, and `mount_options`, the options the module added to the class's. `Ok`
    /// only when one grant covers the source, every secret it names and every mount
    /// option; with the directory the host must still check for a hostPath or local
    /// volume.
    pub fn check(
        &self,
        module: &str,
        volume: &str,
        spec: &PersistentVolumeSpec,
        mount_options: &[String],
    ) -> Result<Option<VolumeDirectory>, SourceRefused> {
        let refuse = |rule: String, reason: String| SourceRefused {
            module: module.to_string(),
            volume: volume.to_string(),
            rule,
            reason,
        };
        let base = format!("modules.{module}.volumes");
        let spec = serde_json::to_value(spec).unwrap_or(Value::Null);
        let present: Vec<(&str, &Value)> = SOURCE_KEYS
            .into_iter()
            .filter_map(|key| spec.get(key).filter(|v| !v.is_null()).map(|v| (key, v)))
            .collect();
        let [(kind, source)] = present.as_slice() else {
            return Err(refuse(
                base,
                format!(
                    "it has {} volume sources; exactly one is needed",
                    present.len()
                ),
            ));
        };
        let (kind, empty) = (*kind, Map::new());
        let source_object = source.as_object().unwrap_or(&empty);
        let field = |name: &str| source_object.get(name).and_then(Value::as_str);
        let rule = if TYPED_KINDS.contains(&kind) {
            format!("{base}.{kind}")
        } else {
            format!("{base}.other.{kind}")
        };

        // The grant that covers the source: the secrets and mount options it lists.
        let mut directory = None;
        let (secrets, options): (&[SecretName], &[String]) = match kind {
            "hostPath" | "local" => {
                let grants = if kind == "hostPath" {
                    &self.host_path
                } else {
                    &self.local
                };
                let path = field("path").unwrap_or_default();
                if grants.is_empty() {
                    return Err(refuse(rule, format!("no {kind} grant (default deny)")));
                }
                normal_path(path)
                    .map_err(|why| refuse(rule.clone(), format!("{kind} path {path:?} {why}")))?;
                let Some(grant) = grants.iter().find(|g| strictly_below(path, &g.path_prefix))
                else {
                    return Err(refuse(
                        rule,
                        format!(
                            "{kind} path {path:?} is not below a granted pathPrefix ({})",
                            granted(grants.iter().map(|g| g.path_prefix.as_str()))
                        ),
                    ));
                };
                let expected = format!("{}/{volume}", grant.path_prefix.trim_end_matches('/'));
                if path != expected {
                    return Err(refuse(
                        rule,
                        format!(
                            "{kind} path {path:?} is not {expected:?}: a volume is the directory named for its PV directly in the granted pathPrefix, where only the module writes (a deeper path lies inside some volume, where a tenant may have put a symlink)"
                        ),
                    ));
                }
                if spec.get("volumeMode").and_then(Value::as_str) == Some("Block") {
                    return Err(refuse(
                        rule,
                        format!(
                            "{kind} volume {path:?} has volumeMode Block: node paths are published as filesystem volumes only (a block device of the node is never handed out)"
                        ),
                    ));
                }
                directory = Some(VolumeDirectory {
                    directory: grant.directory.clone(),
                    name: volume.to_string(),
                    rule: rule.clone(),
                });
                if kind == "hostPath" {
                    let path_type = field("type").unwrap_or_default();
                    if !grant.types.iter().any(|t| t == path_type) {
                        return Err(refuse(
                            format!("{rule}.types"),
                            format!(
                                "hostPath type {path_type:?} of {path:?} is not one of the granted types ({}); a module must set the type to a directory kind",
                                grant.types.join(", ")
                            ),
                        ));
                    }
                }
                (&[], &grant.mount_options)
            }
            "nfs" => {
                let server = field("server").unwrap_or_default();
                let path = field("path").unwrap_or_default();
                if self.nfs.is_empty() {
                    return Err(refuse(rule, "no nfs grant (default deny)".into()));
                }
                normal_path(path)
                    .map_err(|why| refuse(rule.clone(), format!("nfs path {path:?} {why}")))?;
                let server_normal = server.trim_end_matches('.').to_ascii_lowercase();
                let on_server: Vec<&NfsGrant> = self
                    .nfs
                    .iter()
                    .filter(|g| g.server == server_normal)
                    .collect();
                if on_server.is_empty() {
                    return Err(refuse(
                        rule,
                        format!(
                            "nfs server {server:?} is not granted ({})",
                            granted(self.nfs.iter().map(|g| g.server.as_str()))
                        ),
                    ));
                }
                let Some(grant) = on_server.iter().find(|g| at_or_below(path, &g.path_prefix))
                else {
                    return Err(refuse(
                        rule,
                        format!(
                            "nfs path {path:?} on {server} is not at or below a granted pathPrefix ({})",
                            granted(on_server.iter().map(|g| g.path_prefix.as_str()))
                        ),
                    ));
                };
                (&[], &grant.mount_options)
            }
            "csi" => {
                let driver = field("driver").unwrap_or_default();
                if self.csi.is_empty() {
                    return Err(refuse(rule, "no csi grant (default deny)".into()));
                }
                let Some(grant) = self.csi.iter().find(|g| g.driver == driver) else {
                    return Err(refuse(
                        rule,
                        format!(
                            "csi driver {driver:?} is not granted ({})",
                            granted(self.csi.iter().map(|g| g.driver.as_str()))
                        ),
                    ));
                };
                (&grant.secrets, &grant.mount_options)
            }
            "iscsi" => {
                if self.iscsi.is_empty() {
                    return Err(refuse(rule, "no iscsi grant (default deny)".into()));
                }
                let mut portals: Vec<&str> = field("targetPortal").into_iter().collect();
                portals.extend(
                    source_object
                        .get("portals")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str),
                );
                let Some(grant) = self
                    .iscsi
                    .iter()
                    .find(|g| portals.iter().all(|p| g.portals.iter().any(|a| a == p)))
                else {
                    return Err(refuse(
                        rule,
                        format!(
                            "iscsi portals {} are not all listed by one grant",
                            portals.join(", ")
                        ),
                    ));
                };
                (&grant.secrets, &grant.mount_options)
            }
            other => match self.other.get(other) {
                Some(grant) => {
                    if DRIVER_KINDS.contains(&other) {
                        let driver = field("driver").unwrap_or_default();
                        if !grant.drivers.iter().any(|d| d == driver) {
                            return Err(refuse(
                                format!("{rule}.drivers"),
                                format!(
                                    "{other} driver {driver:?} is not granted ({})",
                                    granted(grant.drivers.iter().map(String::as_str))
                                ),
                            ));
                        }
                    }
                    (&grant.secrets, &grant.mount_options)
                }
                None => {
                    return Err(refuse(
                        rule,
                        format!("no grant for {other} volumes (default deny)"),
                    ));
                }
            },
        };

        for option in mount_options.iter().flat_map(|o| o.split(',')) {
            if !mount_option_allowed(option.trim(), options) {
                return Err(refuse(
                    format!("{rule}.mountOptions"),
                    format!(
                        "mount option {option:?} is not granted ({}); a mount option can send the node's mount elsewhere or relabel what it mounts",
                        if options.is_empty() {
                            "none are".to_string()
                        } else {
                            granted(options.iter().map(String::as_str))
                        }
                    ),
                ));
            }
        }

        let mut references = Vec::new();
        secret_references(source, kind, &mut references);
        for reference in references {
            match reference {
                SecretReference::Named(secret) if secrets.contains(&secret) => {}
                SecretReference::Named(secret) => {
                    return Err(refuse(
                        format!("{rule}.secrets"),
                        format!("it references Secret {secret}, which its grant does not list"),
                    ));
                }
                SecretReference::Unusable { at, why } => {
                    return Err(refuse(format!("{rule}.secrets"), format!("{at}: {why}")));
                }
            }
        }
        Ok(directory)
    }

    /// Whether nothing may be published.
    pub fn is_empty(&self) -> bool {
        self == &VolumeGrants::default()
    }
}

/// "granted: a, b": what the grants of one kind allow, for a refusal's reason.
fn granted<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<&str> = items.collect();
    format!("granted: {}", items.join(", "))
}

/// `Ok` when `path` is absolute and normal: no `.`, `..` or empty components and no
/// trailing `/`, so that comparing it with a prefix means what it says.
fn normal_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("is not an absolute path");
    }
    if path == "/" {
        return Ok(());
    }
    if path[1..]
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err("is not a normal path (no '.', '..', '//' or trailing '/' allowed)");
    }
    Ok(())
}

/// Whether the mount option `option` (one of a comma-separated list) is listed: exactly,
/// or as `name=*` for any value of `name`.
fn mount_option_allowed(option: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|a| match a.strip_suffix("=*") {
        Some(name) => option.split_once('=').is_some_and(|(n, _)| n == name),
        None => a == option,
    })
}

fn at_or_below(path: &str, prefix: &str) -> bool {
    Path::new(path).starts_with(prefix)
}

fn strictly_below(path: &str, prefix: &str) -> bool {
    at_or_below(path, prefix) && Path::new(path) != Path::new(prefix)
}

/// A secret reference found in a source.
#[derive(Debug, PartialEq, Eq)]
enum SecretReference {
    Named(SecretName),
    /// A field that refers to a secret in a way that cannot be checked.
    Unusable {
        at: String,
        why: &'static str,
    },
}

/// Collects every secret reference in `value` (the source object at `at`): objects
/// under `secretRef` or `*SecretRef`, and azureFile's `secretName`/`secretNamespace`.
/// Any other field whose name mentions a secret or a keyring (CephFS `secretFile`, RBD
/// `keyring`: paths to credentials on the node) is unusable: default deny. CSI `volumeAttributes` is the driver's own
/// string map and is not searched.
fn secret_references(value: &Value, at: &str, out: &mut Vec<SecretReference>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let here = format!("{at}.{key}");
                if key == "volumeAttributes" || item.is_null() {
                    continue;
                }
                if key == "secretRef" || key.ends_with("SecretRef") {
                    out.push(named(
                        item.get("namespace").and_then(Value::as_str),
                        item.get("name").and_then(Value::as_str),
                        here,
                    ));
                } else if key == "secretName" {
                    out.push(named(
                        map.get("secretNamespace").and_then(Value::as_str),
                        item.as_str(),
                        here,
                    ));
                } else if key == "secretNamespace" {
                    // Read with secretName.
                } else if ["secret", "keyring"]
                    .iter()
                    .any(|word| key.to_ascii_lowercase().contains(word))
                {
                    out.push(SecretReference::Unusable {
                        at: here,
                        why: "a secret field the host cannot check (only secret references by namespace and name can be granted)",
                    });
                } else {
                    secret_references(item, &here, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                secret_references(item, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn named(namespace: Option<&str>, name: Option<&str>, at: String) -> SecretReference {
    match (
        namespace.filter(|n| !n.is_empty()),
        name.filter(|n| !n.is_empty()),
    ) {
        (Some(namespace), Some(name)) => SecretReference::Named(SecretName {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        (None, _) => SecretReference::Unusable {
            at,
            why: "a secret reference without a namespace (its namespace would be implied; name it)",
        },
        (_, None) => SecretReference::Unusable {
            at,
            why: "a secret reference without a name",
        },
    }
}

// ---- the `volumes` section as written ------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct VolumesFile {
    #[serde(default)]
    host_path: Vec<HostPathFile>,
    #[serde(default)]
    local: Vec<NodeDirectoryFile>,
    #[serde(default)]
    nfs: Vec<NfsFile>,
    #[serde(default)]
    csi: Vec<CsiFile>,
    #[serde(default)]
    iscsi: Vec<IscsiFile>,
    #[serde(default)]
    other: BTreeMap<String, OtherFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HostPathFile {
    path_prefix: String,
    types: Option<Vec<String>>,
    directory: Option<String>,
    #[serde(default)]
    mount_options: Vec<String>,
}

/// A local grant, and the node-directory part of a hostPath grant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeDirectoryFile {
    path_prefix: String,
    directory: Option<String>,
    #[serde(default)]
    mount_options: Vec<String>,
}

impl NodeDirectoryFile {
    /// The grant, if its prefix, its directory grant and its mount options are valid.
    fn validate(
        self,
        types: Vec<String>,
        field: &str,
        directories: &[DirectoryGrant],
        problems: &mut Vec<String>,
    ) -> Option<PathGrant> {
        let path_prefix = prefix(&self.path_prefix, field, false, problems)?;
        let directory = volume_directory(
            &path_prefix,
            self.directory.as_deref(),
            directories,
            field,
            problems,
        )?;
        Some(PathGrant {
            path_prefix,
            types,
            directory,
            mount_options: options(self.mount_options, field, problems),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NfsFile {
    server: String,
    path_prefix: String,
    #[serde(default)]
    mount_options: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CsiFile {
    driver: String,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    mount_options: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IscsiFile {
    portals: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    mount_options: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OtherFile {
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    drivers: Vec<String>,
    #[serde(default)]
    mount_options: Vec<String>,
}

impl VolumesFile {
    /// The grants, with every problem (naming its field under `at`) added to `problems`;
    /// `directories` are the module's directory grants.
    pub(super) fn validate(
        self,
        at: &str,
        directories: &[DirectoryGrant],
        problems: &mut Vec<String>,
    ) -> VolumeGrants {
        let mut grants = VolumeGrants::default();
        for (i, entry) in self.host_path.into_iter().enumerate() {
            let field = format!("{at}.hostPath[{i}]");
            let types = entry
                .types
                .unwrap_or_else(|| DIRECTORY_TYPES.map(str::to_string).to_vec());
            if types.is_empty() || types.iter().any(|t| !DIRECTORY_TYPES.contains(&t.as_str())) {
                problems.push(format!(
                    "{field}.types {types:?}: only directory kinds can be granted ({}); files, sockets and devices of a node are never handed out",
                    DIRECTORY_TYPES.join(", ")
                ));
                continue;
            }
            let place = NodeDirectoryFile {
                path_prefix: entry.path_prefix,
                directory: entry.directory,
                mount_options: entry.mount_options,
            };
            if let Some(grant) = place.validate(types, &field, directories, problems) {
                grants.host_path.push(grant);
            }
        }
        for (i, entry) in self.local.into_iter().enumerate() {
            let field = format!("{at}.local[{i}]");
            if let Some(grant) = entry.validate(Vec::new(), &field, directories, problems) {
                grants.local.push(grant);
            }
        }
        for (i, entry) in self.nfs.into_iter().enumerate() {
            let field = format!("{at}.nfs[{i}]");
            let server = entry.server.trim_end_matches('.').to_ascii_lowercase();
            if server.is_empty() || server.contains(['/', ' ']) {
                problems.push(format!(
                    "{field}.server {:?}: must be a host name or address",
                    entry.server
                ));
                continue;
            }
            if let Some(path_prefix) = prefix(&entry.path_prefix, &field, true, problems) {
                let mount_options = options(entry.mount_options, &field, problems);
                grants.nfs.push(NfsGrant {
                    server,
                    path_prefix,
                    mount_options,
                });
            }
        }
        for (i, entry) in self.csi.into_iter().enumerate() {
            let field = format!("{at}.csi[{i}]");
            if entry.driver.is_empty() {
                problems.push(format!("{field}.driver: must name the CSI driver"));
                continue;
            }
            grants.csi.push(CsiGrant {
                driver: entry.driver,
                secrets: secret_names(&entry.secrets, &field, problems),
                mount_options: options(entry.mount_options, &field, problems),
            });
        }
        for (i, entry) in self.iscsi.into_iter().enumerate() {
            let field = format!("{at}.iscsi[{i}]");
            if entry.portals.is_empty() || entry.portals.iter().any(|p| p.is_empty()) {
                problems.push(format!(
                    "{field}.portals: must list the portals (host:port) the module may use"
                ));
                continue;
            }
            grants.iscsi.push(IscsiGrant {
                portals: entry.portals,
                secrets: secret_names(&entry.secrets, &field, problems),
                mount_options: options(entry.mount_options, &field, problems),
            });
        }
        for (kind, entry) in self.other {
            let field = format!("{at}.other.{kind}");
            if TYPED_KINDS.contains(&kind.as_str()) {
                problems.push(format!(
                    "{field}: {kind} has its own rules; grant it as {at}.{kind}"
                ));
                continue;
            }
            if !SOURCE_KEYS.contains(&kind.as_str()) {
                problems.push(format!(
                    "{field}: {kind:?} is not a PersistentVolume source; use one of {}",
                    SOURCE_KEYS
                        .iter()
                        .filter(|k| !TYPED_KINDS.contains(k))
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                continue;
            }
            let secrets = secret_names(&entry.secrets, &field, problems);
            if DRIVER_KINDS.contains(&kind.as_str()) {
                if entry.drivers.is_empty() || entry.drivers.iter().any(String::is_empty) {
                    problems.push(format!(
                        "{field}.drivers: must name the {kind} drivers the module may use (a driver is node code run as root)"
                    ));
                    continue;
                }
            } else if !entry.drivers.is_empty() {
                problems.push(format!(
                    "{field}.drivers: {kind} volumes name no driver; remove the field"
                ));
                continue;
            }
            let mount_options = options(entry.mount_options, &field, problems);
            grants.other.insert(
                kind,
                OtherGrant {
                    secrets,
                    drivers: entry.drivers,
                    mount_options,
                },
            );
        }
        grants
    }
}

/// A `pathPrefix`: absolute and normal; `/` only where `root_allowed` (an NFS export
/// root is one server's, a node's root is the whole node).
fn prefix(
    text: &str,
    field: &str,
    root_allowed: bool,
    problems: &mut Vec<String>,
) -> Option<String> {
    let trimmed = if text.len() > 1 {
        text.trim_end_matches('/')
    } else {
        text
    };
    if let Err(why) = normal_path(trimmed) {
        problems.push(format!("{field}.pathPrefix {text:?}: {why}"));
        return None;
    }
    if !root_allowed
        && Path::new(trimmed)
            .components()
            .all(|c| c == Component::RootDir)
    {
        problems.push(format!(
            "{field}.pathPrefix {text:?}: / would grant the whole node; name the directory volumes live in"
        ));
        return None;
    }
    Some(trimmed.to_string())
}

/// The directory grant (by guest path) that holds the volumes of a hostPath or local
/// grant: the one named by `directory`, else the one whose host path is the prefix.
fn volume_directory(
    path_prefix: &str,
    named: Option<&str>,
    directories: &[DirectoryGrant],
    field: &str,
    problems: &mut Vec<String>,
) -> Option<String> {
    let found = match named {
        Some(guest) => directories
            .iter()
            .find(|d| d.guest == guest.trim_end_matches('/')),
        None => directories
            .iter()
            .find(|d| d.host == Path::new(path_prefix)),
    };
    match (found, named) {
        (Some(grant), _) => Some(grant.guest.clone()),
        (None, Some(guest)) => {
            problems.push(format!(
                "{field}.directory {guest:?}: not one of the module's directories (guest paths: {}); name the directory grant whose host directory is {path_prefix} on the nodes",
                directories.iter().map(|d| d.guest.as_str()).collect::<Vec<_>>().join(", ")
            ));
            None
        }
        (None, None) => {
            problems.push(format!(
                "{field}.pathPrefix {path_prefix}: the host checks every volume it publishes there through the module's own grant of that directory, and the module has none with host {path_prefix}; grant it in directories (mounting the node directory at the same path in the host's container), or name the grant that holds it with directory: <guest path>"
            ));
            None
        }
    }
}

/// Mount options as granted: non-empty, one option each (no commas), `name=*` allowed.
fn options(texts: Vec<String>, field: &str, problems: &mut Vec<String>) -> Vec<String> {
    let mut kept = Vec::new();
    for (i, text) in texts.into_iter().enumerate() {
        let option = text.trim();
        if option.is_empty() || option.contains(',') || option.contains(char::is_whitespace) {
            problems.push(format!(
                "{field}.mountOptions[{i}] {text:?}: one mount option per entry (such as nfsvers=4.1, or rsize=* for any value)"
            ));
            continue;
        }
        kept.push(option.to_string());
    }
    kept
}

fn secret_names(texts: &[String], field: &str, problems: &mut Vec<String>) -> Vec<SecretName> {
    let mut names = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                names.push(SecretName {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                });
            }
            _ => problems.push(format!(
                "{field}.secrets[{i}] {text:?}: must be namespace/name of one Secret"
            )),
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The module's directory grants the tests' hostPath and local grants refer to.
    fn directories() -> Vec<DirectoryGrant> {
        ["/var/lib/wp/hostpath", "/mnt/disks"]
            .iter()
            .enumerate()
            .map(|(i, host)| DirectoryGrant {
                host: host.into(),
                guest: format!("/d{i}"),
                mode: super::super::DirectoryMode::ReadWrite,
            })
            .collect()
    }

    fn grants(yaml: &str) -> Result<VolumeGrants, Vec<String>> {
        let file: VolumesFile = serde_yaml::from_str(yaml).expect("valid YAML");
        let mut problems = Vec::new();
        let grants = file.validate("modules.m.volumes", &directories(), &mut problems);
        if problems.is_empty() {
            Ok(grants)
        } else {
            Err(problems)
        }
    }

    fn spec(source: Value) -> PersistentVolumeSpec {
        serde_json::from_value(source).expect("a PV spec")
    }

    fn check(grants: &VolumeGrants, source: Value) -> Result<(), SourceRefused> {
        check_options(grants, source, &[])
    }

    fn check_options(
        grants: &VolumeGrants,
        source: Value,
        options: &[&str],
    ) -> Result<(), SourceRefused> {
        let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        grants
            .check("m", "pvc-1", &spec(source), &options)
            .map(|_| ())
    }

    fn refused_rule(grants: &VolumeGrants, source: Value) -> String {
        let error = check(grants, source).expect_err("refused");
        assert!(
            error.to_string().contains("nothing was published"),
            "{error}"
        );
        error.rule
    }

    #[test]
    fn nothing_is_granted_by_default() {
        let none = VolumeGrants::default();
        for source in [
            json!({"hostPath": {"path": "/", "type": "Directory"}}),
            json!({"local": {"path": "/mnt/x"}}),
            json!({"nfs": {"server": "a", "path": "/x"}}),
            json!({"csi": {"driver": "d", "volumeHandle": "h"}}),
            json!({"iscsi": {"targetPortal": "1.2.3.4:3260", "iqn": "i", "lun": 0}}),
            json!({"cephfs": {"monitors": ["m"]}}),
        ] {
            let error = check(&none, source.clone()).expect_err("default deny");
            assert!(error.reason.contains("default deny"), "{source}: {error}");
        }
    }

    #[test]
    fn host_path_must_be_below_a_prefix_normal_and_a_directory_kind() {
        let g = grants("hostPath: [{ pathPrefix: /var/lib/wp/hostpath/ }]").unwrap();
        assert_eq!(g.host_path[0].path_prefix, "/var/lib/wp/hostpath");
        check(
            &g,
            json!({"hostPath": {"path": "/var/lib/wp/hostpath/pvc-1", "type": "Directory"}}),
        )
        .unwrap();
        for path in [
            "/",
            "/var/run/docker.sock",
            "/var/lib/wp/hostpath",
            // Inside a volume (a tenant's symlink), or not the PV's own name.
            "/var/lib/wp/hostpath/pvc-T/escape",
            "/var/lib/wp/hostpath/pvc-T/pvc-1",
            "/var/lib/wp/hostpath/pvc-2",
            "/var/lib/wp/hostpathx/pvc",
            "/var/lib/wp/hostpath/../../../etc",
            "/var/lib/wp/hostpath/./pvc",
            "/var/lib/wp/hostpath//pvc",
            "var/lib/wp/hostpath/pvc",
        ] {
            let rule = refused_rule(
                &g,
                json!({"hostPath": {"path": path, "type": "DirectoryOrCreate"}}),
            );
            assert_eq!(rule, "modules.m.volumes.hostPath", "{path}");
        }
        for path_type in [
            None,
            Some(""),
            Some("Socket"),
            Some("File"),
            Some("CharDevice"),
        ] {
            let rule = refused_rule(
                &g,
                json!({"hostPath": {"path": "/var/lib/wp/hostpath/pvc-1", "type": path_type}}),
            );
            assert_eq!(rule, "modules.m.volumes.hostPath.types", "{path_type:?}");
        }
    }

    #[test]
    fn a_published_node_path_is_the_pv_s_directory_in_the_granted_grant() {
        let g = grants(
            "hostPath: [{ pathPrefix: /var/lib/wp/hostpath }]\nlocal: [{ pathPrefix: /srv/v, directory: /d1 }]",
        )
        .unwrap();
        let found = g
            .check(
                "m",
                "pvc-1",
                &spec(json!({"hostPath": {"path": "/var/lib/wp/hostpath/pvc-1", "type": "Directory"}})),
                &[],
            )
            .unwrap();
        assert_eq!(
            found,
            Some(VolumeDirectory {
                directory: "/d0".into(),
                name: "pvc-1".into(),
                rule: "modules.m.volumes.hostPath".into(),
            })
        );
        let found = g
            .check(
                "m",
                "pvc-1",
                &spec(json!({"local": {"path": "/srv/v/pvc-1"}})),
                &[],
            )
            .unwrap();
        let found = found.unwrap();
        assert_eq!(found.directory, "/d1");
        assert_eq!(found.rule, "modules.m.volumes.local");
        // A raw node device through a local volume in Block mode.
        let error = check(
            &g,
            json!({"local": {"path": "/srv/v/pvc-1"}, "volumeMode": "Block"}),
        )
        .unwrap_err();
        assert!(error.reason.contains("Block"), "{error}");
        // Grants whose node directory the host cannot check are refused at load.
        let problems = grants(
            "hostPath: [{ pathPrefix: /elsewhere }]\nlocal: [{ pathPrefix: /srv, directory: /nope }]",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("hostPath[0].pathPrefix /elsewhere"),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("local[0].directory \"/nope\""),
            "{problems:?}"
        );
    }

    #[test]
    fn mount_options_the_module_adds_must_be_granted() {
        let g = grants(
            "nfs: [{ server: nfs.example.com, pathPrefix: /exports, mountOptions: [nfsvers=4.1, hard, rsize=*] }]",
        )
        .unwrap();
        let source = json!({"nfs": {"server": "nfs.example.com", "path": "/exports/a"}});
        check_options(&g, source.clone(), &["nfsvers=4.1", "hard,rsize=1048576"]).unwrap();
        for options in [
            &["vers=3,mountaddr=203.0.113.9,mountport=635"][..],
            &["nfsvers=4.1,mountaddr=203.0.113.9"],
            &["context=system_u:object_r:container_file_t:s0"],
            &["nfsvers=3"],
            &["rsize"],
        ] {
            let error = check_options(&g, source.clone(), options).unwrap_err();
            assert_eq!(
                error.rule, "modules.m.volumes.nfs.mountOptions",
                "{options:?}"
            );
        }
        // None granted: none may be added (the class's own are the admin's).
        let g = grants("csi: [{ driver: d.example.com }]").unwrap();
        let error = check_options(
            &g,
            json!({"csi": {"driver": "d.example.com", "volumeHandle": "h"}}),
            &["ro"],
        )
        .unwrap_err();
        assert!(error.reason.contains("none are"), "{error}");
        let problems = grants("csi: [{ driver: d, mountOptions: ['a,b', ''] }]").unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn flex_volume_grants_name_their_drivers_and_keyrings_are_refused() {
        let g = grants("other: { flexVolume: { drivers: [example.com/lvm] }, rbd: {} }").unwrap();
        check(&g, json!({"flexVolume": {"driver": "example.com/lvm"}})).unwrap();
        assert_eq!(
            refused_rule(
                &g,
                json!({"flexVolume": {"driver": "example.com/root-shell"}})
            ),
            "modules.m.volumes.other.flexVolume.drivers"
        );
        assert_eq!(
            refused_rule(
                &g,
                json!({"rbd": {"monitors": ["m"], "image": "i", "keyring": "/etc/ceph/ceph.client.admin.keyring"}})
            ),
            "modules.m.volumes.other.rbd.secrets"
        );
        let problems = grants("other: { flexVolume: {} }").unwrap_err();
        assert!(problems[0].contains("flexVolume.drivers"), "{problems:?}");
    }

    #[test]
    fn grants_refuse_non_directory_types_and_the_root_prefix() {
        let problems = grants("hostPath: [{ pathPrefix: /x, types: [Socket] }, { pathPrefix: / }, { pathPrefix: /a/../b }]")
            .unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("hostPath[0].types"), "{problems:?}");
        assert!(problems[1].contains("whole node"), "{problems:?}");
        assert!(
            problems[2].contains("hostPath[2].pathPrefix"),
            "{problems:?}"
        );
    }

    #[test]
    fn nfs_needs_the_granted_server_and_prefix() {
        let g = grants("nfs: [{ server: NFS.example.com., pathPrefix: /exports }]").unwrap();
        check(
            &g,
            json!({"nfs": {"server": "nfs.example.com", "path": "/exports/a"}}),
        )
        .unwrap();
        check(
            &g,
            json!({"nfs": {"server": "nfs.example.com", "path": "/exports"}}),
        )
        .unwrap();
        refused_rule(
            &g,
            json!({"nfs": {"server": "evil.example.com", "path": "/exports/a"}}),
        );
        refused_rule(
            &g,
            json!({"nfs": {"server": "nfs.example.com", "path": "/"}}),
        );
        refused_rule(
            &g,
            json!({"nfs": {"server": "nfs.example.com", "path": "/exports/../etc"}}),
        );
    }

    #[test]
    fn csi_secrets_must_be_named_by_the_grant() {
        let g = grants("csi: [{ driver: d.example.com, secrets: [storage/publish] }]").unwrap();
        check(
            &g,
            json!({"csi": {"driver": "d.example.com", "volumeHandle": "h"}}),
        )
        .unwrap();
        check(
            &g,
            json!({"csi": {"driver": "d.example.com", "volumeHandle": "h",
                "nodePublishSecretRef": {"name": "publish", "namespace": "storage"}}}),
        )
        .unwrap();
        refused_rule(&g, json!({"csi": {"driver": "other", "volumeHandle": "h"}}));
        for field in [
            "nodePublishSecretRef",
            "nodeStageSecretRef",
            "controllerPublishSecretRef",
            "controllerExpandSecretRef",
            "nodeExpandSecretRef",
        ] {
            let rule = refused_rule(
                &g,
                json!({"csi": {"driver": "d.example.com", "volumeHandle": "h",
                    field: {"name": "admin-token", "namespace": "kube-system"}}}),
            );
            assert_eq!(rule, "modules.m.volumes.csi.secrets", "{field}");
        }
    }

    #[test]
    fn other_kinds_need_a_grant_by_key_and_their_secrets_too() {
        let g = grants("other: { cephfs: { secrets: [ceph/admin] } }").unwrap();
        check(
            &g,
            json!({"cephfs": {"monitors": ["m"], "secretRef": {"name": "admin", "namespace": "ceph"}}}),
        )
        .unwrap();
        assert_eq!(
            refused_rule(&g, json!({"rbd": {"monitors": ["m"], "image": "i"}})),
            "modules.m.volumes.other.rbd"
        );
        // No namespace: refused rather than guessed.
        refused_rule(
            &g,
            json!({"cephfs": {"monitors": ["m"], "secretRef": {"name": "admin"}}}),
        );
        // A node keyring path is not a reference the grant can name.
        refused_rule(
            &g,
            json!({"cephfs": {"monitors": ["m"], "secretFile": "/etc/ceph/k"}}),
        );
        let g = grants("other: { azureFile: {} }").unwrap();
        refused_rule(
            &g,
            json!({"azureFile": {"secretName": "s", "secretNamespace": "kube-system", "shareName": "x"}}),
        );
        let problems = grants("other: { hostPath: {}, nope: {} }").unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn iscsi_portals_must_all_be_granted() {
        let g =
            grants("iscsi: [{ portals: ['10.0.0.5:3260', '10.0.0.6:3260'], secrets: [s/chap] }]")
                .unwrap();
        check(
            &g,
            json!({"iscsi": {"targetPortal": "10.0.0.5:3260", "portals": ["10.0.0.6:3260"],
                "iqn": "i", "lun": 0, "secretRef": {"name": "chap", "namespace": "s"}}}),
        )
        .unwrap();
        refused_rule(
            &g,
            json!({"iscsi": {"targetPortal": "10.0.0.5:3260", "portals": ["10.9.9.9:3260"], "iqn": "i", "lun": 0}}),
        );
    }
}
