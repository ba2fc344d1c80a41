//! Kubelet's part, emulated: runs the first container of a rendered workload's pod
//! template (a Deployment's or a DaemonSet's: `spec.template` either way) from the image
//! tarball, the way kubelet and a container runtime would, so a test proves the shipped
//! manifests, the image and the flags work together.
//!
//! What is the same as in a cluster, exactly:
//! - the root filesystem is the image's layers, unpacked; the process is the image's
//!   entrypoint (or the container's `command`) with the container's `args`, and only the
//!   container's `env` plus what kubelet adds (`KUBERNETES_SERVICE_HOST`/`_PORT`,
//!   `HOSTNAME`); the downward API's `metadata.name`, `metadata.namespace`,
//!   `spec.nodeName` and `status.podIP`;
//! - every volume is mounted at its `mountPath`, unchanged (a private mount namespace and
//!   a chroot, so no path is rewritten): ConfigMaps read from the API server and written
//!   in kubelet's layout (a `..<timestamp>` directory, the `..data` link to it, and one
//!   `KEY -> ..data/KEY` link per key; updates swap `..data` atomically by renaming a new
//!   link over it, as kubelet's AtomicWriter does); emptyDir as an empty directory mode
//!   0777; hostPath as a directory that the admin prepared as docs/install.md says (owned
//!   by the pod's user, mode 0750, with the subdirectories the test names), one per pod
//!   (each pod stands on a node of its own); projected `serviceAccountToken` sources as
//!   a TokenRequest of the pod's ServiceAccount with the source's audience and expiry,
//!   bound to the Pod object, in the same layout; the ServiceAccount token (a
//!   TokenRequest for the pod's ServiceAccount, bound to the Pod object when there is
//!   one), the API server's CA and the namespace at
//!   `/var/run/secrets/kubernetes.io/serviceaccount`, in the same layout;
//! - `readOnly` mounts and `readOnlyRootFilesystem` are read-only mounts; the user and
//!   group are `runAsUser`/`runAsGroup` (the process has no capabilities, as with `drop:
//!   [ALL]`); `allowPrivilegeEscalation: false` is `no_new_privs`; `/proc` is mounted and
//!   `/dev` has null, zero, random and urandom;
//! - for a pod given a [`Network`], the network namespace, as a CNI bridge plugin makes
//!   it ([`network`]): its own IP on a bridge of this machine, so the pods of one
//!   DaemonSet listen on the same ports side by side and reach each other at their pod
//!   IPs; the API server, which listens on the machine's loopback, is relayed to the
//!   same loopback address in the pod's namespace. Such a pod is also reported as
//!   kubelet (with the DaemonSet controller and the scheduler) would: a Pod object made
//!   from the template (its labels and annotations, the DaemonSet as its controller,
//!   bound to its node), its status `Running` with its IP, before any token is bound to
//!   it. The test removes it ([`Pod::delete_object`]).
//!
//! What is not emulated: a network namespace for a pod given no network (it shares the
//! machine's, whose loopback the test API server listens on: `KUBERNETES_SERVICE_HOST`
//! is its address; no Pod object is made for it), DNS and Services, cgroups and
//! resource limits, seccomp, restarts, token renewal, the Pod's conditions and
//! container statuses, and probes run by kubelet (the test probes the paths and port
//! the probes name, at the pod's IP). Other volume and projection sources, `subPath`,
//! init containers and other downward API fields are refused with an error naming
//! them. It needs root (mount and network namespaces, chroot), as CI has.

pub mod network;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod as PodObject, ServiceAccount};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};

use crate::install::{Image, unpack_rootfs};
pub use network::{Network, PodNetwork};

/// The kubelet's projected ServiceAccount volume's mount path.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Where the API server is and how a pod trusts and authenticates to it.
pub struct Cluster {
    pub host: String,
    pub port: u16,
    pub ca_pem: Vec<u8>,
}

impl Cluster {
    /// Reads the server address and CA out of a kubeconfig file.
    pub fn from_kubeconfig(path: &Path) -> anyhow::Result<Cluster> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        let cluster = kubeconfig
            .clusters
            .first()
            .and_then(|c| c.cluster.clone())
            .context("the kubeconfig has no cluster")?;
        let server = cluster
            .server
            .context("the kubeconfig's cluster has no server")?;
        let authority = server
            .strip_prefix("https://")
            .with_context(|| format!("the API server {server} is not https"))?
            .trim_end_matches('/');
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse()?),
            None => (authority.to_string(), 443),
        };
        let ca_pem = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            // ByteString's deserialiser is a base64 decoder.
            (Some(data), _) => {
                serde_json::from_value::<k8s_openapi::ByteString>(Value::String(
                    data.trim().into(),
                ))?
                .0
            }
            (None, Some(file)) => std::fs::read(file)?,
            _ => bail!("the kubeconfig's cluster has no certificate authority"),
        };
        Ok(Cluster {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            ca_pem,
        })
    }
}

/// Writes `files` into the volume directory `dir` the way kubelet's AtomicWriter does:
/// a new `..<timestamp>` directory with the files (mode 0644), a `..data_tmp` link to it
/// renamed over `..data` (the atomic swap), `KEY -> ..data/KEY` links for new keys,
/// links of keys no longer present removed, and the previous timestamped directory
/// removed.
pub fn project(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let previous = std::fs::read_link(dir.join("..data")).ok();
    let stamp = format!(
        "..{}",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S.%f")
    );
    let new = dir.join(&stamp);
    std::fs::create_dir(&new)?;
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755))?;
    for (key, bytes) in files {
        let path = new.join(key);
        std::fs::write(&path, bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    for key in files.keys() {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("..") && !files.contains_key(name.as_ref()) {
            std::fs::remove_file(dir.join(name.as_ref()))?;
        }
    }
    if let Some(previous) = previous
        && previous != Path::new(&stamp)
    {
        std::fs::remove_dir_all(dir.join(previous))?;
    }
    Ok(())
}

/// The keys and bytes of a ConfigMap (`data` and `binaryData`).
pub fn config_map_files(config_map: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for (key, value) in config_map.data.iter().flatten() {
        files.insert(key.clone(), value.clone().into_bytes());
    }
    for (key, value) in config_map.binary_data.iter().flatten() {
        files.insert(key.clone(), value.0.clone());
    }
    files
}

/// One volume as materialised on this machine.
#[derive(Debug, Clone)]
pub struct Volume {
    pub name: String,
    pub dir: PathBuf,
    /// The ConfigMap it projects, if it is one.
    pub config_map: Option<String>,
}

/// The pod, running.
pub struct Pod {
    child: Child,
    /// The pod's name.
    pub name: String,
    /// The node it is bound to.
    pub node: String,
    pub namespace: String,
    /// The Pod object's uid, for a pod given a network (the emulation makes its Pod
    /// object then).
    pub uid: Option<String>,
    /// Its network namespace, if it was given a network; dropped (torn down) after
    /// the process is killed.
    network: Option<PodNetwork>,
    pub dir: PathBuf,
    pub log: PathBuf,
    pub volumes: BTreeMap<String, Volume>,
    /// `containerPort` by port name.
    pub ports: BTreeMap<String, u16>,
    pub container: Value,
}

/// How the pod is started.
pub struct PodSpec<'a> {
    /// The workload whose pod template runs: a Deployment or a DaemonSet, as rendered
    /// or as the API server returned it (then a DaemonSet's uid makes it the Pod
    /// object's controller, as the DaemonSet controller sets it).
    pub workload: &'a Value,
    pub image: &'a Image,
    pub cluster: &'a Cluster,
    /// The token kubelet mounts at [`SERVICE_ACCOUNT_DIR`]. `None`: kubelet's own, a
    /// TokenRequest for the pod's ServiceAccount (bound to the Pod object when there
    /// is one, an hour and 7 seconds, as kubelet asks).
    pub token: Option<&'a str>,
    /// Everything of the pod lives under here.
    pub dir: &'a Path,
    pub pod_name: &'a str,
    /// The node the pod is bound to (`spec.nodeName`).
    pub node_name: &'a str,
    /// Subdirectories the admin made in each hostPath directory, as docs/install.md's
    /// install steps say (owned by the pod's user, mode 0750).
    pub host_path_subdirs: &'a [&'a str],
    /// The pod network. `None`: the machine's (as `hostNetwork`; no Pod object).
    /// `Some`: a network namespace of its own on it, and the Pod object in the API.
    pub network: Option<&'a Arc<Network>>,
}

/// kubelet's expiry of the ServiceAccount token it mounts.
const KUBELET_TOKEN_SECONDS: i64 = 3607;

/// A token of ServiceAccount `account` of `namespace` (TokenRequest) for `audiences`
/// (empty: the API server's), valid `seconds`, bound to the pod `bound` (name, uid).
async fn token_request(
    client: &Client,
    namespace: &str,
    account: &str,
    audiences: Vec<String>,
    seconds: i64,
    bound: Option<(&str, &str)>,
) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences,
            expiration_seconds: Some(seconds),
            bound_object_ref: bound.map(|(name, uid)| BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!(
                "requesting a token of ServiceAccount {namespace}/{account}{}",
                bound
                    .map(|(name, _)| format!(" bound to pod {name}"))
                    .unwrap_or_default()
            )
        })?;
    Ok(issued.status.context("no token issued")?.token)
}

/// The Pod object of `spec`'s pod as the DaemonSet controller (or the ReplicaSet
/// controller), the scheduler and kubelet would leave it: the template's metadata and
/// spec, bound to the node, with the DaemonSet as its controller; then its status
/// `Running` at `ip`. Returns its uid.
async fn report_pod(
    client: &Client,
    spec: &PodSpec<'_>,
    namespace: &str,
    ip: IpAddr,
) -> anyhow::Result<String> {
    let workload = spec.workload;
    let template = &workload["spec"]["template"];
    let mut pod_spec = template["spec"].clone();
    pod_spec["nodeName"] = json!(spec.node_name);
    let mut metadata = json!({ "name": spec.pod_name, "namespace": namespace });
    for key in ["labels", "annotations"] {
        if !template["metadata"][key].is_null() {
            metadata[key] = template["metadata"][key].clone();
        }
    }
    // A Deployment's pods belong to a ReplicaSet, which nothing makes here.
    if workload["kind"] == "DaemonSet"
        && let Some(uid) = workload["metadata"]["uid"].as_str()
    {
        metadata["ownerReferences"] = json!([{
            "apiVersion": workload["apiVersion"], "kind": "DaemonSet",
            "name": workload["metadata"]["name"], "uid": uid,
            "controller": true, "blockOwnerDeletion": true,
        }]);
    }
    let object: PodObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec,
    }))?;
    let pods: Api<PodObject> = Api::namespaced(client.clone(), namespace);
    let created = pods
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating the Pod object {namespace}/{}", spec.pod_name))?;
    let uid = created.uid().context("the created Pod has no uid")?;
    let status = json!({ "status": {
        "phase": "Running",
        "podIP": ip.to_string(),
        "podIPs": [{ "ip": ip.to_string() }],
        "startTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    } });
    if let Err(error) = pods
        .patch_status(
            spec.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
    {
        delete_pod_object(client, namespace, spec.pod_name).await;
        return Err(error).with_context(|| format!("reporting pod {} Running", spec.pod_name));
    }
    Ok(uid)
}

/// Deletes a Pod object at once (grace period 0: what kubelet confirms once the
/// containers are gone; nothing else would here). Errors are ignored.
async fn delete_pod_object(client: &Client, namespace: &str, name: &str) {
    let _ = Api::<PodObject>::namespaced(client.clone(), namespace)
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

impl Pod {
    /// Gives the pod its network namespace and its Pod object (if it is given a
    /// network), materialises the volumes and starts the container; does not wait for
    /// readiness. On failure nothing of it is left.
    pub async fn start(client: &Client, spec: PodSpec<'_>) -> anyhow::Result<Pod> {
        let workload = spec.workload;
        let kind = workload["kind"].as_str().unwrap_or_default();
        ensure!(
            kind == "Deployment" || kind == "DaemonSet",
            "the emulation runs a Deployment's or a DaemonSet's pod, not a {kind:?}'s"
        );
        let namespace = workload["metadata"]["namespace"]
            .as_str()
            .with_context(|| format!("the {kind} has no namespace"))?
            .to_string();
        // What is refused is refused before anything is made.
        let pod = &workload["spec"]["template"]["spec"];
        let containers = pod["containers"].as_array().context("no containers")?;
        ensure!(
            containers.len() == 1,
            "the emulation runs one container; the pod has {}",
            containers.len()
        );
        ensure!(
            pod["initContainers"].is_null(),
            "init containers are not emulated"
        );
        let container = &containers[0];
        let image_name = container["image"].as_str().context("no image")?;
        ensure!(
            spec.image.tags.iter().any(|t| t == image_name),
            "the container runs image {image_name}, the tarball is {:?}",
            spec.image.tags
        );
        let network = match spec.network {
            Some(network) => {
                let host: IpAddr = spec.cluster.host.parse().with_context(|| {
                    format!(
                        "the API server's host {} is not an IP address",
                        spec.cluster.host
                    )
                })?;
                Some(network.attach(SocketAddr::new(host, spec.cluster.port))?)
            }
            None => None,
        };
        let uid = match &network {
            Some(network) => Some(report_pod(client, &spec, &namespace, network.ip()).await?),
            None => None,
        };
        let started = Self::run(client, &spec, namespace.clone(), network, uid.clone()).await;
        if started.is_err() && uid.is_some() {
            delete_pod_object(client, &namespace, spec.pod_name).await;
        }
        started
    }

    async fn run(
        client: &Client,
        spec: &PodSpec<'_>,
        namespace: String,
        network: Option<PodNetwork>,
        pod_uid: Option<String>,
    ) -> anyhow::Result<Pod> {
        let pod = &spec.workload["spec"]["template"]["spec"];
        let account = pod["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let bound = pod_uid.as_deref().map(|uid| (spec.pod_name, uid));
        let container = pod["containers"][0].clone();

        let dir = spec.dir.to_path_buf();
        let rootfs = dir.join("rootfs");
        unpack_rootfs(spec.image, &rootfs)?;

        // Security context: the container's wins over the pod's.
        let security = |key: &str| {
            let value = &container["securityContext"][key];
            if value.is_null() {
                pod["securityContext"][key].clone()
            } else {
                value.clone()
            }
        };
        let image_user = spec.image.config["User"]
            .as_str()
            .unwrap_or("0:0")
            .to_string();
        let (image_uid, image_gid) = image_user.split_once(':').unwrap_or((&image_user, "0"));
        let uid = security("runAsUser")
            .as_u64()
            .map(|u| u.to_string())
            .unwrap_or_else(|| image_uid.to_string());
        let gid = security("runAsGroup")
            .as_u64()
            .map(|g| g.to_string())
            .unwrap_or_else(|| image_gid.to_string());
        if security("runAsNonRoot") == Value::Bool(true) {
            ensure!(
                uid.parse::<u64>().is_ok_and(|u| u != 0),
                "runAsNonRoot, but the user would be {uid} (kubelet refuses to start it)"
            );
        }
        let read_only_root = container["securityContext"]["readOnlyRootFilesystem"] == true;
        let no_new_privs = container["securityContext"]["allowPrivilegeEscalation"] == false;
        let owner = uid.parse::<u32>().ok();
        let group = gid.parse::<u32>().ok();

        // Volumes.
        let mut volumes = BTreeMap::new();
        for volume in pod["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().context("a volume has no name")?;
            let path = dir.join("volumes").join(name);
            let mut config_map = None;
            if let Some(map) = volume["configMap"]["name"].as_str() {
                ensure!(
                    volume["configMap"]["items"].is_null(),
                    "configMap items are not emulated"
                );
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                let object = api
                    .get(map)
                    .await
                    .with_context(|| format!("the pod's ConfigMap {namespace}/{map}"))?;
                project(&path, &config_map_files(&object))?;
                config_map = Some(map.to_string());
            } else if volume.get("emptyDir").is_some() {
                std::fs::create_dir_all(&path)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))?;
            } else if volume.get("hostPath").is_some() {
                // The admin's step: `install -d -o 65532 -g 65532 -m 0750 PATH`.
                std::fs::create_dir_all(&path)?;
                std::os::unix::fs::chown(&path, owner, group)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750))?;
                for subdir in spec.host_path_subdirs {
                    let sub = path.join(subdir);
                    std::fs::create_dir_all(&sub)?;
                    std::os::unix::fs::chown(&sub, owner, group)?;
                    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o750))?;
                }
            } else if let Some(projected) = volume.get("projected") {
                let mut files = BTreeMap::new();
                for source in projected["sources"].as_array().into_iter().flatten() {
                    let token = &source["serviceAccountToken"];
                    ensure!(
                        !token.is_null(),
                        "volume {name}: only serviceAccountToken projections are emulated: {source}"
                    );
                    ensure!(
                        bound.is_some(),
                        "volume {name}: a serviceAccountToken projection is bound to the Pod \
                         object, which the emulation makes for a pod given a network"
                    );
                    let file = token["path"]
                        .as_str()
                        .with_context(|| format!("volume {name}: a token with no path"))?;
                    let audiences = token["audience"]
                        .as_str()
                        .map(|a| vec![a.to_string()])
                        .unwrap_or_default();
                    let seconds = token["expirationSeconds"].as_i64().unwrap_or(3600);
                    let issued =
                        token_request(client, &namespace, &account, audiences, seconds, bound)
                            .await?;
                    files.insert(file.to_string(), issued.into_bytes());
                }
                project(&path, &files)?;
            } else {
                bail!(
                    "volume {name}: only configMap, emptyDir, hostPath and projected \
                     serviceAccountToken are emulated: {volume}"
                );
            }
            volumes.insert(
                name.to_string(),
                Volume {
                    name: name.to_string(),
                    dir: path,
                    config_map,
                },
            );
        }

        // Mounts: (source, mountPath, read-only).
        let mut mounts: Vec<(PathBuf, String, bool)> = Vec::new();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = mount["name"].as_str().context("a mount has no name")?;
            let volume = volumes
                .get(name)
                .with_context(|| format!("mount of unknown volume {name}"))?;
            ensure!(
                mount["subPath"].is_null(),
                "subPath mounts are not emulated"
            );
            let mount_path = mount["mountPath"].as_str().context("no mountPath")?;
            mounts.push((
                volume.dir.clone(),
                mount_path.to_string(),
                mount["readOnly"] == true,
            ));
        }
        if pod["automountServiceAccountToken"] != false {
            let token = match spec.token {
                Some(token) => token.to_string(),
                None => {
                    token_request(
                        client,
                        &namespace,
                        &account,
                        Vec::new(),
                        KUBELET_TOKEN_SECONDS,
                        bound,
                    )
                    .await?
                }
            };
            let api_access = dir.join("volumes/kube-api-access");
            project(
                &api_access,
                &BTreeMap::from([
                    ("token".to_string(), token.into_bytes()),
                    ("ca.crt".to_string(), spec.cluster.ca_pem.clone()),
                    ("namespace".to_string(), namespace.as_bytes().to_vec()),
                ]),
            )?;
            mounts.push((api_access, SERVICE_ACCOUNT_DIR.to_string(), true));
        }

        // Environment: the container's, plus kubelet's.
        let mut env: Vec<(String, String)> = vec![
            ("HOSTNAME".into(), spec.pod_name.into()),
            ("KUBERNETES_SERVICE_HOST".into(), spec.cluster.host.clone()),
            (
                "KUBERNETES_SERVICE_PORT".into(),
                spec.cluster.port.to_string(),
            ),
        ];
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().context("an env var has no name")?;
            let value = if let Some(value) = var["value"].as_str() {
                value.to_string()
            } else {
                match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("metadata.namespace") => namespace.clone(),
                    Some("metadata.name") => spec.pod_name.to_string(),
                    Some("spec.nodeName") => spec.node_name.to_string(),
                    Some("status.podIP") => network
                        .as_ref()
                        .map(|n| n.ip().to_string())
                        .with_context(|| {
                            format!("env {name}: status.podIP needs a pod given a network")
                        })?,
                    _ => bail!(
                        "env {name}: only values and the pod's name, namespace, node and IP are emulated"
                    ),
                }
            };
            env.push((name.to_string(), value));
        }

        // The process: command (else the image's entrypoint) and args (else its cmd).
        let strings = |value: &Value| -> Vec<String> {
            value
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        };
        let mut argv = if container["command"].is_null() {
            strings(&spec.image.config["Entrypoint"])
        } else {
            strings(&container["command"])
        };
        argv.extend(if container["args"].is_null() {
            strings(&spec.image.config["Cmd"])
        } else {
            strings(&container["args"])
        });
        ensure!(!argv.is_empty(), "nothing to run");

        let root = rootfs.display().to_string();
        let mut script = String::from("set -eu\n");
        script.push_str(&format!("mount --bind {0} {0}\n", quote(&root)));
        for (source, target, read_only) in &mounts {
            let target = format!("{root}{target}");
            script.push_str(&format!(
                "mkdir -p {t}\nmount --bind {s} {t}\n",
                s = quote(&source.display().to_string()),
                t = quote(&target)
            ));
            if *read_only {
                script.push_str(&format!("mount -o remount,bind,ro {}\n", quote(&target)));
            }
        }
        script.push_str(&format!(
            "mkdir -p {r}/proc {r}/dev\nmount -t proc proc {r}/proc\n",
            r = quote(&root)
        ));
        for device in ["null", "zero", "random", "urandom"] {
            script.push_str(&format!(
                "touch {r}/dev/{device}\nmount --bind /dev/{device} {r}/dev/{device}\n",
                r = quote(&root)
            ));
        }
        if read_only_root {
            script.push_str(&format!("mount -o remount,bind,ro {}\n", quote(&root)));
        }
        script.push_str("exec /usr/bin/env -i");
        for (name, value) in &env {
            script.push_str(&format!(" {}", quote(&format!("{name}={value}"))));
        }
        script.push_str(" /usr/bin/setpriv");
        if no_new_privs {
            script.push_str(" --no-new-privs");
        }
        script.push_str(&format!(
            " /usr/sbin/chroot --userspec={uid}:{gid} --groups={gid} {}",
            quote(&root)
        ));
        for arg in &argv {
            script.push_str(&format!(" {}", quote(arg)));
        }
        script.push('\n');
        let script_path = dir.join("kubelet.sh");
        std::fs::write(&script_path, &script)?;

        let log = dir.join("container.log");
        let log_file = std::fs::File::create(&log)?;
        // In the pod's network namespace, if it has one (nsenter execs: the child is
        // still unshare).
        let mut command = match &network {
            Some(network) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net={}", network.path().display()))
                    .arg("unshare");
                command
            }
            None => Command::new("unshare"),
        };
        let child = command
            .args([
                "--mount",
                "--propagation",
                "private",
                "--fork",
                "--kill-child=SIGKILL",
            ])
            .arg("sh")
            .arg(&script_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting the pod (unshare; needs root)")?;

        let ports = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["name"].as_str()?.to_string(),
                    u16::try_from(p["containerPort"].as_u64()?).ok()?,
                ))
            })
            .collect();
        Ok(Pod {
            child,
            name: spec.pod_name.to_string(),
            node: spec.node_name.to_string(),
            namespace,
            uid: pod_uid,
            network,
            dir,
            log,
            volumes,
            ports,
            container,
        })
    }

    /// The container's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The port a probe names (a number or a port name).
    pub fn probe_port(&self, probe: &str) -> anyhow::Result<u16> {
        let port = &self.container[probe]["httpGet"]["port"];
        match port {
            Value::Number(n) => Ok(u16::try_from(n.as_u64().context("port")?)?),
            Value::String(name) => {
                self.ports.get(name).copied().with_context(|| {
                    format!("{probe} names port {name}, which the container lacks")
                })
            }
            _ => bail!("{probe} has no httpGet port"),
        }
    }

    /// Where the pod is reached: its IP, or the machine's loopback for a pod given no
    /// network.
    pub fn ip(&self) -> IpAddr {
        self.network
            .as_ref()
            .map(PodNetwork::ip)
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// GET of `path` on the pod's `port` ([`Pod::ip`]): (status, body).
    pub fn get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        crate::host::http_get_at(self.ip(), port, path)
    }

    /// Probes like kubelet: the probe's `httpGet` path on its port, 200..400 is success.
    pub fn probe(&self, probe: &str) -> anyhow::Result<bool> {
        let path = self.container[probe]["httpGet"]["path"]
            .as_str()
            .with_context(|| format!("the container has no {probe} httpGet path"))?;
        let (code, _) = self.get(self.probe_port(probe)?, path)?;
        Ok((200..400).contains(&code))
    }

    /// Waits until `probe` succeeds, or fails with the container's log.
    pub fn wait_probe(&mut self, probe: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the container exited ({status}); its log:\n{}",
                    self.log_text()
                );
            }
            if self.probe(probe).unwrap_or(false) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "{probe} did not succeed within {timeout:?}; the container's log:\n{}",
            self.log_text()
        )
    }

    /// Re-reads the ConfigMap behind volume `name` from the API server and projects it
    /// again, as kubelet does after a change.
    pub async fn resync_config_map(&self, client: &Client, name: &str) -> anyhow::Result<()> {
        let volume = self
            .volumes
            .get(name)
            .with_context(|| format!("no volume {name}"))?;
        let map = volume
            .config_map
            .as_deref()
            .with_context(|| format!("volume {name} is not a ConfigMap"))?;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        project(&volume.dir, &config_map_files(&api.get(map).await?))
    }

    /// The container's process: unshare's child (the script execs it).
    fn container_pid(&self) -> anyhow::Result<i32> {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.child.id()))?;
        Ok(children
            .split_whitespace()
            .next()
            .context("the container's process is gone")?
            .parse()?)
    }

    /// SIGTERM to the container's process (kubelet's stop), then its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let pid = self.container_pid()?;
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "still running {timeout:?} after SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Removes the Pod object, if the emulation made one (grace period 0: kubelet's
    /// confirmation once the containers are gone; no kubelet would give it here, and a
    /// Pod bound to a node waits for it, so its namespace would never go).
    pub async fn delete_object(&self, client: &Client) {
        if self.uid.is_some() {
            delete_pod_object(client, &self.namespace, &self.name).await;
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // SIGKILL to the container's process first: unshare's --kill-child does not
        // reach it once it runs as the pod's user (a change of user clears the
        // parent-death signal). Then unshare; the mounts go with its mount namespace,
        // then its network namespace (the field's drop).
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = self.container_pid() {
                // SAFETY: a signal to our own child's child, which unshare reaps.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
