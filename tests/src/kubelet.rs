//! Kubelet's part, emulated: runs the first container of a rendered Deployment's pod
//! template from the image tarball, the way kubelet and a container runtime would, so a
//! test proves the shipped manifests, the image and the flags work together.
//!
//! What is the same as in a cluster, exactly:
//! - the root filesystem is the image's layers, unpacked; the process is the image's
//!   entrypoint (or the container's `command`) with the container's `args`, and only the
//!   container's `env` plus what kubelet adds (`KUBERNETES_SERVICE_HOST`/`_PORT`,
//!   `HOSTNAME`);
//! - every volume is mounted at its `mountPath`, unchanged (a private mount namespace and
//!   a chroot, so no path is rewritten): ConfigMaps read from the API server and written
//!   in kubelet's layout (a `..<timestamp>` directory, the `..data` link to it, and one
//!   `KEY -> ..data/KEY` link per key; updates swap `..data` atomically by renaming a new
//!   link over it, as kubelet's AtomicWriter does); emptyDir as an empty directory mode
//!   0777; hostPath as a directory that the admin prepared as docs/install.md says (owned by
//!   the pod's user, mode 0750, with the subdirectories the test names); the ServiceAccount token (a TokenRequest for the pod's
//!   ServiceAccount), the API server's CA and the namespace at
//!   `/var/run/secrets/kubernetes.io/serviceaccount`, in the same layout;
//! - `readOnly` mounts and `readOnlyRootFilesystem` are read-only mounts; the user and
//!   group are `runAsUser`/`runAsGroup` (the process has no capabilities, as with `drop:
//!   [ALL]`); `allowPrivilegeEscalation: false` is `no_new_privs`; `/proc` is mounted and
//!   `/dev` has null, zero, random and urandom.
//!
//! What is not emulated: the network namespace (the pod shares the machine's loopback,
//! where the test API server listens: `KUBERNETES_SERVICE_HOST` is its address), cgroups
//! and resource limits, seccomp, and probes run by kubelet (the test probes the paths and
//! port the probes name). It needs root (mount namespaces, chroot), as CI has.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde_json::Value;

use crate::install::{Image, unpack_rootfs};

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
    pub namespace: String,
    pub dir: PathBuf,
    pub log: PathBuf,
    pub volumes: BTreeMap<String, Volume>,
    /// `containerPort` by port name.
    pub ports: BTreeMap<String, u16>,
    pub container: Value,
}

/// How the pod is started.
pub struct PodSpec<'a> {
    /// The rendered Deployment.
    pub deployment: &'a Value,
    pub image: &'a Image,
    pub cluster: &'a Cluster,
    /// A token of the pod's ServiceAccount (TokenRequest).
    pub token: &'a str,
    /// Everything of the pod lives under here.
    pub dir: &'a Path,
    pub pod_name: &'a str,
    /// The node the pod is bound to (`spec.nodeName`).
    pub node_name: &'a str,
    /// Subdirectories the admin made in each hostPath directory, as docs/install.md's
    /// install steps say (owned by the pod's user, mode 0750).
    pub host_path_subdirs: &'a [&'a str],
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

impl Pod {
    /// Materialises the volumes and starts the container; does not wait for readiness.
    pub async fn start(client: &Client, spec: PodSpec<'_>) -> anyhow::Result<Pod> {
        let deployment = spec.deployment;
        let namespace = deployment["metadata"]["namespace"]
            .as_str()
            .context("the Deployment has no namespace")?
            .to_string();
        let pod = &deployment["spec"]["template"]["spec"];
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
        let container = containers[0].clone();
        let image_name = container["image"].as_str().context("no image")?;
        ensure!(
            spec.image.tags.iter().any(|t| t == image_name),
            "the container runs image {image_name}, the tarball is {:?}",
            spec.image.tags
        );

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
            } else {
                bail!(
                    "volume {name}: only configMap, emptyDir and hostPath are emulated: {volume}"
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
            let account = dir.join("volumes/kube-api-access");
            project(
                &account,
                &BTreeMap::from([
                    ("token".to_string(), spec.token.as_bytes().to_vec()),
                    ("ca.crt".to_string(), spec.cluster.ca_pem.clone()),
                    ("namespace".to_string(), namespace.as_bytes().to_vec()),
                ]),
            )?;
            mounts.push((account, SERVICE_ACCOUNT_DIR.to_string(), true));
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
                    _ => bail!(
                        "env {name}: only values and the pod's name, namespace and node are emulated"
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
        let child = Command::new("unshare")
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
            namespace,
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

    /// GET of `path` on the loopback `port`: (status, body).
    pub fn get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        crate::host::http_get(port, path)
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

    /// SIGTERM to the container's process (kubelet's stop), then its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.child.id()))?;
        let pid = children
            .split_whitespace()
            .next()
            .context("the container's process is gone")?
            .to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
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
}

impl Drop for Pod {
    fn drop(&mut self) {
        // unshare --kill-child: killing it kills the container; its mounts go with its
        // namespace.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
