//! The offline runner, as a user runs it: the built `wasm-provisioner` binary, real
//! guests, real granted directories.
//!
//! These tests live in the host package so `CARGO_BIN_EXE_wasm-provisioner` is the
//! binary of this very build. Guests are built by `guests/build.sh` (a no-op when warm).

mod common;
use common::dist_dir;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::PersistentVolume;

/// A scratch layout: modules dir with the given guests, a granted volumes dir, files.
struct Scratch {
    root: tempfile::TempDir,
}

impl Scratch {
    fn new(modules: &[&str]) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("modules")).unwrap();
        std::fs::create_dir(root.path().join("granted")).unwrap();
        for name in modules {
            std::fs::copy(
                dist_dir().join(format!("{name}.wasm")),
                root.path().join(format!("modules/{name}.wasm")),
            )
            .unwrap();
        }
        Scratch { root }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Grants `module` the `granted` directory at `guest`, and the volumes the hostpath
    /// and nfs-subdir classes below publish.
    fn grants(&self, module: &str, guest: &str) -> PathBuf {
        self.write(
            "grants.yaml",
            &format!(
                "allow: {{ directories: [{root}] }}\n\
                 modules:\n  {module}:\n    directories:\n      - {{ host: {granted}, guest: {guest}, mode: read-write }}\n\
                 \x20   volumes:\n\
                 \x20     hostPath: [{{ pathPrefix: /var/lib/volumes, directory: {guest} }}]\n\
                 \x20     nfs: [{{ server: nfs.example.com, pathPrefix: /srv/nfs }}]\n",
                root = self.root.path().display(),
                granted = self.path("granted").display(),
            ),
        )
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wasm-provisioner"));
        command
            .args(args)
            .env_clear()
            .env("WASM_PROVISIONER_LOG", "warn");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("running wasm-provisioner")
    }
}

const CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: default
  uid: 5a1d7a2e-0000-4000-8000-000000000001
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
  storageClassName: local
"#;

const VOLUME_NAME: &str = "pvc-5a1d7a2e-0000-4000-8000-000000000001";

fn hostpath_class(on_delete: &str) -> String {
    format!(
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
provisioner: wasm-provisioner.dev
parameters:
  module: hostpath
  nodePath: /var/lib/volumes
  onDelete: {on_delete}
reclaimPolicy: Delete
"#
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn provision(scratch: &Scratch, module_args: &[&str], class: &Path, grants: &Path) -> Output {
    provision_command(scratch, module_args, class, grants)
        .output()
        .expect("running wasm-provisioner")
}

fn provision_command(
    scratch: &Scratch,
    module_args: &[&str],
    class: &Path,
    grants: &Path,
) -> Command {
    let modules = scratch.path("modules");
    let claim = scratch.write("pvc.yaml", CLAIM);
    let mut args = vec![
        "guest",
        "provision",
        "--modules",
        modules.to_str().unwrap(),
        "--class",
        class.to_str().unwrap(),
        "--claim",
        claim.to_str().unwrap(),
        "--grants",
        grants.to_str().unwrap(),
    ];
    args.extend_from_slice(module_args);
    scratch.command(&args)
}

#[test]
fn hostpath_provision_creates_the_directory_and_delete_removes_it() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class("delete"));

    let output = provision(&scratch, &["--module", "hostpath"], &class, &grants);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    let pv: PersistentVolume = serde_yaml::from_slice(&output.stdout).expect("PV YAML on stdout");
    assert_eq!(pv.metadata.name.as_deref(), Some(VOLUME_NAME));
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(
        spec.host_path.as_ref().unwrap().path,
        format!("/var/lib/volumes/{VOLUME_NAME}")
    );
    let annotations = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        annotations["pv.kubernetes.io/provisioned-by"],
        "wasm-provisioner.dev"
    );
    assert_eq!(annotations["wasm-provisioner.dev/module"], "hostpath");
    assert_eq!(annotations["wasm-provisioner.dev/module-sha256"].len(), 64);
    // The backend work really happened, inside the grant.
    assert!(scratch.path("granted").join(VOLUME_NAME).is_dir());

    // Idempotent: provisioning again gives the same PV.
    let again = provision(&scratch, &[], &class, &grants);
    assert!(again.status.success(), "stderr:\n{}", text(&again.stderr));
    assert_eq!(again.stdout, output.stdout);

    let pv_file = scratch.write("pv.yaml", &text(&output.stdout));
    let modules = scratch.path("modules");
    let deleted = scratch.run(&[
        "guest",
        "delete",
        "--modules",
        modules.to_str().unwrap(),
        "--volume",
        pv_file.to_str().unwrap(),
        "--class",
        class.to_str().unwrap(),
        "--grants",
        grants.to_str().unwrap(),
    ]);
    assert!(
        deleted.status.success(),
        "stderr:\n{}",
        text(&deleted.stderr)
    );
    assert!(text(&deleted.stdout).contains(VOLUME_NAME));
    assert!(!scratch.path("granted").join(VOLUME_NAME).exists());
}

#[test]
fn hostpath_delete_archives_when_asked() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class("archive"));
    let output = provision(&scratch, &[], &class, &grants);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    std::fs::write(
        scratch.path("granted").join(VOLUME_NAME).join("data.txt"),
        b"keep me",
    )
    .unwrap();

    let pv_file = scratch.write("pv.yaml", &text(&output.stdout));
    let modules = scratch.path("modules");
    // No --module and no --class: the PV's module annotation names the module.
    let deleted = scratch.run(&[
        "guest",
        "delete",
        "--modules",
        modules.to_str().unwrap(),
        "--volume",
        pv_file.to_str().unwrap(),
        "--grants",
        grants.to_str().unwrap(),
    ]);
    assert!(
        deleted.status.success(),
        "stderr:\n{}",
        text(&deleted.stderr)
    );
    assert!(!scratch.path("granted").join(VOLUME_NAME).exists());
    let archived: Vec<_> = std::fs::read_dir(scratch.path("granted"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(archived.len(), 1, "{archived:?}");
    assert_eq!(
        std::fs::read(archived[0].join("data.txt")).unwrap(),
        b"keep me"
    );
}

#[test]
fn nfs_subdir_provisions_into_the_granted_export() {
    let scratch = Scratch::new(&["nfs-subdir"]);
    let grants = scratch.grants("nfs-subdir", "/export");
    let class = scratch.write(
        "sc.yaml",
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
provisioner: wasm-provisioner.dev
parameters:
  module: nfs-subdir
  server: nfs.example.com
  share: /srv/nfs
"#,
    );
    let output = provision(&scratch, &[], &class, &grants);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    let pv: PersistentVolume = serde_yaml::from_slice(&output.stdout).unwrap();
    let nfs = pv.spec.unwrap().nfs.expect("an nfs PV");
    assert_eq!(nfs.server, "nfs.example.com");
    assert!(nfs.path.starts_with("/srv/nfs/"), "{}", nfs.path);
    let subdir = nfs.path.trim_start_matches("/srv/nfs/");
    assert!(
        scratch.path("granted").join(subdir).is_dir(),
        "{subdir} was not created"
    );
}

#[test]
fn missing_module_is_a_clear_error() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class("delete"));
    let output = provision(&scratch, &["--module", "nope"], &class, &grants);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    // --module contradicts the class's module parameter.
    assert!(stderr.contains("--module nope contradicts"), "{stderr}");

    let class = scratch.write(
        "sc2.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: { name: x }\nprovisioner: p\nparameters: { module: nope }\n",
    );
    let output = provision(&scratch, &[], &class, &grants);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("module nope not found"), "{stderr}");
    assert!(stderr.contains("modules there: hostpath"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// A pin key spelled in other letter cases (`moduleSha256`, `modulesha256`, ...) is a
/// typo of `moduleSHA256`: refused, naming the key, never read as an unpinned class (the
/// plugin used to get it as a plain parameter and any version ran). A wrong digest under
/// the right key is refused as ever. The echo guest takes any parameter (hostpath
/// refuses unknown ones, which hid the typo).
#[test]
fn a_misspelled_pin_key_is_refused_not_ignored() {
    let scratch = Scratch::new(&["test-echo"]);
    let grants = scratch.grants("test-echo", "/volumes");
    let wrong = "0".repeat(64);
    for key in [
        "moduleSha256",
        "modulesha256",
        "MODULESHA256",
        "moduleSHA256",
    ] {
        let class = scratch.write(
            "sc.yaml",
            &format!(
                "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{ name: local }}\n\
                 provisioner: wasm-provisioner.dev\n\
                 parameters: {{ module: test-echo, {key}: \"{wrong}\" }}\n"
            ),
        );
        let output = provision(&scratch, &[], &class, &grants);
        let stderr = text(&output.stderr);
        assert!(
            !output.status.success(),
            "{key}: provisioned unpinned\n{}",
            text(&output.stdout)
        );
        assert!(stderr.contains(key), "{key}: {stderr}");
        assert!(output.stdout.is_empty(), "{key}");
    }
}

#[test]
fn bad_yaml_is_a_clear_error() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", "this: [is not: a class");
    let output = provision(&scratch, &[], &class, &grants);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("is not a valid StorageClass"), "{stderr}");
    assert!(stderr.contains("sc.yaml"), "{stderr}");
}

#[test]
fn bad_grants_are_a_clear_error() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.write(
        "grants.yaml",
        "allow: { directories: [/srv] }\nmodules:\n  hostpath:\n    directories: [{ host: /etc, guest: /volumes, mode: read-write }]\n",
    );
    let class = scratch.write("sc.yaml", &hostpath_class("delete"));
    let output = provision(&scratch, &[], &class, &grants);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("modules.hostpath.directories[0].host /etc"),
        "{stderr}"
    );
}

#[test]
fn hostpath_without_a_grant_fails_with_the_plugins_message() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.write("grants.yaml", "");
    let class = scratch.write("sc.yaml", &hostpath_class("delete"));
    let output = provision(&scratch, &[], &class, &grants);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("did not provision the volume: failed"),
        "{stderr}"
    );
    assert!(stderr.contains("module hostpath"), "{stderr}");
}

/// A class of the hostile `test-publish` guest with these parameters.
fn publish_class(scratch: &Scratch, parameters: &[(&str, &str)]) -> PathBuf {
    let mut text = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: local\n\
                    provisioner: wasm-provisioner.dev\nparameters:\n  module: test-publish\n"
        .to_string();
    for (key, value) in parameters {
        text.push_str(&format!("  {key}: {value:?}\n"));
    }
    scratch.write("sc.yaml", &text)
}

/// In the offline runner: a module answering a source its grants do not
/// cover (`hostPath: /`) is refused with the rule, and its backend volume is deleted
/// through its own `delete`, exactly as the controller does.
#[test]
fn a_source_the_module_was_not_granted_is_refused_and_cleaned_up() {
    let scratch = Scratch::new(&["test-publish"]);
    let grants = scratch.grants("test-publish", "/volumes");
    let class = publish_class(
        &scratch,
        &[("hostPath", "/"), ("hostPathType", "Directory")],
    );
    let output = provision(&scratch, &[], &class, &grants);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "stderr:\n{stderr}");
    assert!(output.stdout.is_empty(), "no PV may be printed");
    assert!(
        stderr.contains("module test-publish may not publish volume")
            && stderr.contains("(rule modules.test-publish.volumes.hostPath)")
            && stderr.contains("the backend volume was deleted through the module"),
        "stderr:\n{stderr}"
    );
    assert!(
        !scratch.path("granted").join(VOLUME_NAME).exists(),
        "the backend volume the module made must be deleted"
    );

    // The same module, publishing its volume's directory in the granted prefix, is
    // accepted; anything deeper is not (a tenant's symlink may stand there).
    let class = publish_class(
        &scratch,
        &[
            ("hostPath", "/var/lib/volumes/x"),
            ("hostPathType", "Directory"),
        ],
    );
    let output = provision(&scratch, &[], &class, &grants);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "stderr:\n{stderr}");
    assert!(
        stderr.contains("is not \"/var/lib/volumes/pvc-"),
        "stderr:\n{stderr}"
    );
    let class = publish_class(
        &scratch,
        &[
            ("hostPath", "/var/lib/volumes/{volume}"),
            ("hostPathType", "Directory"),
        ],
    );
    let output = provision(&scratch, &[], &class, &grants);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
}

/// A module cannot plant a symlink in its grant: published as a hostPath below its
/// granted prefix, `pvc-x -> ../../..` would be the node's `/` for kubelet.
#[test]
fn a_module_cannot_create_symlinks_in_its_grant() {
    let scratch = Scratch::new(&["test-publish"]);
    let grants = scratch.grants("test-publish", "/volumes");
    let class = publish_class(
        &scratch,
        &[
            ("hostPath", &format!("/var/lib/volumes/{VOLUME_NAME}")),
            ("hostPathType", "Directory"),
            ("symlinkTarget", "../../../../../../.."),
        ],
    );
    let output = provision(&scratch, &[], &class, &grants);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "stderr:\n{stderr}");
    assert!(
        stderr.contains("creating the symlink") && stderr.contains("not-permitted"),
        "stderr:\n{stderr}"
    );
    let planted = scratch.path("granted").join(VOLUME_NAME);
    assert!(
        std::fs::symlink_metadata(&planted).is_err(),
        "{} must not exist",
        planted.display()
    );
}

/// A host whose address space is limited (`ulimit -v`, here 8 GiB) cannot reserve the
/// instance pool (about 2 TiB of address space at the default 128 instances): it warns
/// and runs with the on-demand allocator instead of refusing to start, and
/// `--max-guest-instances 0` chooses that allocator without the warning.
#[test]
fn a_host_under_an_address_space_limit_runs_without_the_pool() {
    use std::os::unix::process::CommandExt;
    const LIMIT: libc::rlim_t = 8 << 30;
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class("delete"));
    let limited = |extra: &[&str]| -> Output {
        let mut command = provision_command(&scratch, extra, &class, &grants);
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: LIMIT,
                    rlim_max: LIMIT,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.output().expect("running wasm-provisioner")
    };

    let output = limited(&[]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "stderr:\n{stderr}");
    assert!(
        stderr.contains("cannot reserve the instance pool for 128 guest instances")
            && stderr.contains("using the on-demand allocator instead"),
        "the fallback is told: {stderr}"
    );
    let pv: PersistentVolume = serde_yaml::from_slice(&output.stdout).expect("PV YAML on stdout");
    assert_eq!(pv.metadata.name.as_deref(), Some(VOLUME_NAME));
    assert!(scratch.path("granted").join(VOLUME_NAME).is_dir());

    let chosen = limited(&["--max-guest-instances", "0"]);
    let stderr = text(&chosen.stderr);
    assert!(chosen.status.success(), "stderr:\n{stderr}");
    assert!(!stderr.contains("instance pool"), "no warning: {stderr}");
    assert_eq!(chosen.stdout, output.stdout, "the same volume again");
}

/// Runs `guest COMMAND` with the scratch's modules and grants and `args`.
fn guest(scratch: &Scratch, command: &str, grants: &Path, args: &[&str]) -> Output {
    let modules = scratch.path("modules");
    let mut all = vec![
        "guest",
        command,
        "--modules",
        modules.to_str().unwrap(),
        "--grants",
        grants.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    scratch.run(&all)
}

fn hostpath_class_with(parameters: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{ name: local }}\n\
         provisioner: wasm-provisioner.dev\nallowVolumeExpansion: true\n\
         parameters: {{ module: hostpath, nodePath: /var/lib/volumes{parameters} }}\n"
    )
}

/// `guest validate`: the module's `validate-class` verdict, exit 0 or 1 with its reason.
#[test]
fn guest_validate_answers_the_modules_verdict_on_a_class() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let good = scratch.write("good.yaml", &hostpath_class_with(", maxSize: 2Gi"));
    let output = guest(
        &scratch,
        "validate",
        &grants,
        &["--class", good.to_str().unwrap()],
    );
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    assert!(
        stdout.contains("module hostpath") && stdout.contains("accepts the StorageClass local"),
        "{stdout}"
    );

    // A typo and a bad value: refused with hostpath's own message, naming the class.
    for (parameters, reason) in [
        (
            ", nodepath: /x",
            "unknown StorageClass parameter(s) nodepath",
        ),
        (", pvType: nfs", "`pvType`"),
    ] {
        let bad = scratch.write("bad.yaml", &hostpath_class_with(parameters));
        let output = guest(
            &scratch,
            "validate",
            &grants,
            &["--class", bad.to_str().unwrap()],
        );
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{parameters}: {stderr}");
        assert!(
            stderr.contains("module hostpath")
                && stderr.contains("refused the StorageClass local")
                && stderr.contains(reason),
            "{parameters}: {stderr}"
        );
        assert!(output.stdout.is_empty());
    }
}

/// `guest capacity`: the backend's space as YAML, in bytes (the granted filesystem's).
#[test]
fn guest_capacity_prints_the_backends_space() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class_with(", maxSize: 1Mi"));
    let node = scratch.write(
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: { name: node-1, labels: { zone: a } }\n",
    );
    let output = guest(
        &scratch,
        "capacity",
        &grants,
        &[
            "--class",
            class.to_str().unwrap(),
            "--node",
            node.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    let answer: serde_yaml::Value = serde_yaml::from_slice(&output.stdout).unwrap();
    let total = answer["totalBytes"].as_u64().expect("totalBytes");
    let available = answer["availableBytes"].as_u64().expect("availableBytes");
    // The filesystem of the granted directory, as statvfs says.
    let stat = statvfs_of(&scratch.path("granted"));
    assert_eq!(total, stat.0, "{}", text(&output.stdout));
    assert!(available > 0 && available <= total);
    // The class's maxSize bounds one volume.
    assert_eq!(answer["maximumVolumeBytes"].as_u64(), Some(1 << 20));
}

/// (total, available) bytes of the filesystem holding `path`.
fn statvfs_of(path: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-parameter.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut stat) }, 0);
    let frsize = stat.f_frsize as u64;
    (stat.f_blocks as u64 * frsize, stat.f_bavail as u64 * frsize)
}

/// `guest expand`: the PV `guest provision` printed, grown to `--size` by the module,
/// printed again with its new capacity; beyond the class's maxSize it is infeasible.
#[test]
fn guest_expand_grows_a_provisioned_volume_and_refuses_beyond_max_size() {
    let scratch = Scratch::new(&["hostpath"]);
    let grants = scratch.grants("hostpath", "/volumes");
    let class = scratch.write("sc.yaml", &hostpath_class_with(", maxSize: 2Gi"));
    let output = provision(&scratch, &[], &class, &grants);
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    let pv_file = scratch.write("pv.yaml", &text(&output.stdout));
    let expand = |size: &str| {
        guest(
            &scratch,
            "expand",
            &grants,
            &[
                "--volume",
                pv_file.to_str().unwrap(),
                "--class",
                class.to_str().unwrap(),
                "--size",
                size,
            ],
        )
    };

    let output = expand("2Gi");
    assert!(output.status.success(), "stderr:\n{}", text(&output.stderr));
    let pv: PersistentVolume = serde_yaml::from_slice(&output.stdout).expect("PV YAML");
    assert_eq!(pv.metadata.name.as_deref(), Some(VOLUME_NAME));
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");

    let output = expand("3Gi");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("module hostpath")
            && stderr.contains("did not expand the volume: infeasible")
            && stderr.contains("maxSize"),
        "{stderr}"
    );
    // Not a growth: refused before the module is asked.
    let output = expand("1Gi");
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("is not larger than the volume"),
        "{stderr}"
    );
    let output = expand("lots");
    assert!(text(&output.stderr).contains("--size \"lots\" is not a size"));
}

/// A module without the capability (the 0.1 hostpath build has none; the minimal example
/// is 0.2 without any) is refused before any call, naming the module and the capability.
#[test]
fn a_capability_the_module_lacks_is_a_clear_error() {
    let scratch = Scratch::new(&["minimal"]);
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/fixtures/hostpath-0.1.0.wasm"),
        scratch.path("modules/hostpath-old.wasm"),
    )
    .unwrap();
    let grants = scratch.write("grants.yaml", "");
    let class = |module: &str| {
        scratch.write(
            &format!("{module}.yaml"),
            &format!(
                "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{ name: c }}\n\
                 provisioner: wasm-provisioner.dev\nparameters: {{ module: {module}, nodePath: /x }}\n"
            ),
        )
    };
    let pv = scratch.write(
        "pv.yaml",
        &format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{ name: {VOLUME_NAME} }}\n\
             spec:\n  capacity: {{ storage: 1Gi }}\n  hostPath: {{ path: /x/{VOLUME_NAME} }}\n"
        ),
    );
    for (module, contract) in [("hostpath-old", "0.1.0"), ("minimal", "0.2.0")] {
        let class = class(module);
        let class = class.to_str().unwrap();
        for (command, args, capability, interface) in [
            (
                "validate",
                vec!["--class", class],
                "validate-class",
                "class-validator",
            ),
            (
                "capacity",
                vec!["--class", class],
                "report-capacity",
                "capacity-reporter",
            ),
            (
                "expand",
                vec![
                    "--class",
                    class,
                    "--volume",
                    pv.to_str().unwrap(),
                    "--size",
                    "2Gi",
                ],
                "expand",
                "expander",
            ),
        ] {
            let output = guest(&scratch, command, &grants, &args);
            let stderr = text(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{module} {command}: {stderr}"
            );
            assert!(
                stderr.contains(&format!("module {module} ("))
                    && stderr.contains(&format!("contract {contract}"))
                    && stderr.contains(&format!("has no capability `{capability}`"))
                    && stderr.contains(&format!("wasm-provisioner:plugin/{interface}@0.2.0")),
                "{module} {command}: {stderr}"
            );
            assert!(output.stdout.is_empty());
        }
    }
}
