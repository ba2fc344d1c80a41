//! The Python and JavaScript example guests (`quota-dir`, `quota-dir-js`) in the offline
//! runner, as a user runs it: the built binary, the components `guests/build.sh` made
//! (it installs the pinned componentize-py and componentize-js; a missing python3 or
//! node fails the build, and so these tests), real granted directories. Both guests
//! answer every outcome the Rust guests do, and the runner maps them the same way.
//!
//! Each call compiles a 13-19 MB component unless the compile cache has it: the calls
//! share one `--cache-dir` outside the clone, kept between runs (entries are keyed by
//! the module's sha256 and the engine, and verified by the host), so a module compiles
//! once per version.

mod common;
use common::dist_dir;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::PersistentVolume;

/// The compile cache every call shares, `~/.cache/wasm-provisioner/offline-runner-cwasm`
/// (`WASM_PROVISIONER_CACHE` moves the parent); the host creates it mode 0700.
fn cache_dir() -> PathBuf {
    std::env::var_os("WASM_PROVISIONER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/wasm-provisioner")
        })
        .join("offline-runner-cwasm")
}

struct Scratch {
    root: tempfile::TempDir,
    module: &'static str,
}

impl Scratch {
    /// A modules directory with the built guest `module`, and a granted directory.
    fn new(module: &'static str) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("modules")).unwrap();
        std::fs::create_dir(root.path().join("granted")).unwrap();
        std::fs::copy(
            dist_dir().join(format!("{module}.wasm")),
            root.path().join(format!("modules/{module}.wasm")),
        )
        .unwrap_or_else(|e| panic!("{module}.wasm was not built by guests/build.sh: {e}"));
        let scratch = Scratch { root, module };
        scratch.write(
            "grants.yaml",
            &format!(
                "allow: {{ directories: [{granted}] }}\n\
                 modules:\n  {module}:\n    directories:\n      - {{ host: {granted}, guest: /volumes, mode: read-write }}\n\
                 \x20   volumes:\n      hostPath: [{{ pathPrefix: /var/lib/quota, directory: /volumes }}]\n",
                granted = scratch.granted().display(),
            ),
        );
        scratch
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn granted(&self) -> PathBuf {
        self.path("granted")
    }

    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn class(&self, file: &str, parameters: &[(&str, &str)]) -> PathBuf {
        let mut text = format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: quota\n\
             provisioner: wasm-provisioner.dev\nparameters:\n  module: {}\n",
            self.module
        );
        for (key, value) in parameters {
            text.push_str(&format!("  {key}: {value:?}\n"));
        }
        self.write(file, &text)
    }

    fn claim(&self, name: &str, namespace: &str, n: u32, size: &str) -> PathBuf {
        self.write(
            &format!("{namespace}-{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
                 \x20 uid: {}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n",
                uid(n)
            ),
        )
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wasm-provisioner"));
        command
            .args(args)
            .arg("--modules")
            .arg(self.path("modules"))
            .arg("--grants")
            .arg(self.path("grants.yaml"))
            .arg("--cache-dir")
            .arg(cache_dir())
            .env_clear()
            .env("WASM_PROVISIONER_LOG", "warn")
            // The debug build's compiler needs more memory than the release build's
            // default allows for the 13 MB JavaScript guest.
            .env("WASM_PROVISIONER_COMPILE_MEMORY_BYTES", "536870912");
        command.output().expect("running wasm-provisioner")
    }

    fn provision(&self, class: &Path, claim: &Path) -> Output {
        self.run(&[
            "guest",
            "provision",
            "--class",
            class.to_str().unwrap(),
            "--claim",
            claim.to_str().unwrap(),
        ])
    }

    fn delete(&self, class: &Path, pv: &Path) -> Output {
        self.run(&[
            "guest",
            "delete",
            "--class",
            class.to_str().unwrap(),
            "--volume",
            pv.to_str().unwrap(),
        ])
    }
}

fn uid(n: u32) -> String {
    format!("5a1d7a2e-0000-4000-8000-{n:012}")
}

fn pv_name(n: u32) -> String {
    format!("pvc-{}", uid(n))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}",
        output.status,
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Fails with `outcome` (as the runner names it) and a message containing `contains`.
fn refused(output: &Output, outcome: &str, contains: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "expected exit 1:\n{stderr}");
    assert!(
        stderr.contains(&format!("{outcome}: ")) && stderr.contains(contains),
        "expected `{outcome}` with {contains:?}:\n{stderr}"
    );
}

/// The whole life of quota-dir volumes, and every answer the guest gives.
fn quota_dir_life(module: &'static str) {
    let s = Scratch::new(module);
    let class = s.class(
        "sc.yaml",
        &[
            ("nodePath", "/var/lib/quota"),
            ("maxSize", "2Gi"),
            ("poolSize", "2Gi"),
        ],
    );

    // A volume: the directory and its usage record in the grant, the PV as published.
    let claim = s.claim("data", "default", 1, "1Gi");
    let pv_yaml = ok(&s.provision(&class, &claim), "provision");
    let pv: PersistentVolume = serde_yaml::from_str(&pv_yaml).expect("PV YAML on stdout");
    let name = pv_name(1);
    assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(
        spec.host_path.as_ref().unwrap().path,
        format!("/var/lib/quota/{name}")
    );
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
    let annotations = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["wasm-provisioner.dev/module"], module);
    assert_eq!(annotations["quota-dir/size"], "1Gi");
    assert!(s.granted().join(&name).is_dir());
    let record = std::fs::read_to_string(s.granted().join(".quota-dir").join(&name)).unwrap();
    assert_eq!(record, "1073741824 default/data\n");

    // Idempotent: the same PV again.
    assert_eq!(ok(&s.provision(&class, &claim), "provision again"), pv_yaml);

    // Above maxSize: infeasible, naming the limit.
    let big = s.claim("big", "default", 2, "3Gi");
    refused(&s.provision(&class, &big), "infeasible", "maxSize 2Gi");
    // The pool holds 1Gi of 2Gi: another 2Gi is failed (it fits once volumes go).
    let second = s.claim("second", "default", 3, "2Gi");
    refused(&s.provision(&class, &second), "failed", "the pool is full");
    assert!(!s.granted().join(pv_name(3)).exists());
    // A namespace the class does not serve: ignored.
    let only = s.class(
        "only.yaml",
        &[
            ("nodePath", "/var/lib/quota"),
            ("maxSize", "2Gi"),
            ("namespaces", "team-a, team-b"),
        ],
    );
    refused(
        &s.provision(&only, &s.claim("x", "default", 4, "1Gi")),
        "ignored",
        "not one of this class's namespaces",
    );
    // A typo in the class: infeasible, naming the parameter.
    let typo = s.class(
        "typo.yaml",
        &[("nodepath", "/var/lib/quota"), ("maxSize", "2Gi")],
    );
    refused(
        &s.provision(&typo, &claim),
        "infeasible",
        "unknown StorageClass parameter(s) nodepath",
    );

    // Delete: the directory, its contents and the record go; the pool is free again.
    std::fs::create_dir_all(s.granted().join(&name).join("sub/dir")).unwrap();
    std::fs::write(s.granted().join(&name).join("sub/dir/file"), "x").unwrap();
    let pv_file = s.write("pv.yaml", &pv_yaml);
    let deleted = ok(&s.delete(&class, &pv_file), "delete");
    assert!(deleted.contains(&name), "{deleted}");
    assert!(!s.granted().join(&name).exists());
    assert!(!s.granted().join(".quota-dir").join(&name).exists());
    ok(
        &s.provision(&class, &second),
        "provision once the pool has room",
    );

    // onDelete: archive keeps the data under archived-<pv-name>.
    let archive = s.class(
        "archive.yaml",
        &[
            ("nodePath", "/var/lib/quota"),
            ("maxSize", "2Gi"),
            ("onDelete", "archive"),
        ],
    );
    let kept = s.claim("kept", "default", 5, "1Mi");
    let pv_yaml = ok(&s.provision(&archive, &kept), "provision to archive");
    std::fs::write(s.granted().join(pv_name(5)).join("data.txt"), "keep me").unwrap();
    let pv_file = s.write("pv-archive.yaml", &pv_yaml);
    ok(&s.delete(&archive, &pv_file), "delete (archive)");
    assert!(!s.granted().join(pv_name(5)).exists());
    let archived = s.granted().join(format!("archived-{}", pv_name(5)));
    assert_eq!(
        std::fs::read_to_string(archived.join("data.txt")).unwrap(),
        "keep me"
    );
    // Deleting again finds nothing left: success (idempotent).
    ok(&s.delete(&archive, &pv_file), "delete again");

    // Without a grant: failed, saying what the admin grants; nothing traps.
    s.write("grants.yaml", "modules: {}\n");
    let output = s.provision(&class, &s.claim("ungranted", "default", 6, "1Mi"));
    refused(&output, "failed", "grants file");
}

#[test]
fn python_quota_dir_provisions_refuses_and_deletes_like_a_rust_guest() {
    quota_dir_life("quota-dir");
}

#[test]
fn javascript_quota_dir_provisions_refuses_and_deletes_like_a_rust_guest() {
    quota_dir_life("quota-dir-js");
}

/// The contract interfaces a built guest exports (without componentize-py's own).
fn contract_exports(module: &str) -> Vec<String> {
    common::component_exports(&dist_dir().join(format!("{module}.wasm")))
        .into_iter()
        .filter(|e| e.starts_with("wasm-provisioner:"))
        .collect()
}

/// What `guest capacity|validate` say of a module without the capability: the module's
/// own `describe` list ("its capabilities: ...").
fn lacks(output: &Output, capability: &str, describe_lists: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("has no capability `{capability}`"))
            && stderr.contains(&format!("(its capabilities: {describe_lists})")),
        "{stderr}"
    );
}

/// The Python quota-dir has `validate-class` and `expand`: exactly those interfaces are
/// exported and listed by `describe`; a bad class is refused with the reason; a volume
/// grows (its usage record with it) up to `maxSize` and within the pool, idempotently.
#[test]
fn python_quota_dir_validates_classes_and_expands_within_max_size() {
    assert_eq!(
        contract_exports("quota-dir"),
        [
            "wasm-provisioner:plugin/class-validator@0.2.0",
            "wasm-provisioner:plugin/expander@0.2.0",
            "wasm-provisioner:plugin/provisioner@0.2.0",
        ]
    );
    let s = Scratch::new("quota-dir");
    let class = s.class(
        "sc.yaml",
        &[
            ("nodePath", "/var/lib/quota"),
            ("maxSize", "2Gi"),
            ("poolSize", "3Gi"),
        ],
    );
    let class_arg = class.to_str().unwrap();
    // describe lists what the component exports, and nothing else.
    lacks(
        &s.run(&["guest", "capacity", "--class", class_arg]),
        "report-capacity",
        "expand, validate-class",
    );

    // validate-class: the class is fine; each bad one is refused with the reason.
    let verdict = ok(
        &s.run(&["guest", "validate", "--class", class_arg]),
        "validate",
    );
    assert!(
        verdict.contains("accepts the StorageClass quota"),
        "{verdict}"
    );
    for (parameters, reason) in [
        (
            &[("nodepath", "/var/lib/quota"), ("maxSize", "2Gi")][..],
            "unknown StorageClass parameter(s) nodepath",
        ),
        (
            &[("nodePath", "quota"), ("maxSize", "2Gi")][..],
            "StorageClass parameter `nodePath`",
        ),
        (
            &[("nodePath", "/var/lib/quota")][..],
            "StorageClass parameter `maxSize` is required",
        ),
        (
            &[
                ("nodePath", "/var/lib/quota"),
                ("maxSize", "4Gi"),
                ("poolSize", "3Gi"),
            ][..],
            "is larger than `poolSize`",
        ),
    ] {
        let bad = s.class("bad.yaml", parameters);
        let output = s.run(&["guest", "validate", "--class", bad.to_str().unwrap()]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{parameters:?}: {stderr}");
        assert!(
            stderr.contains("module quota-dir")
                && stderr.contains("refused the StorageClass quota: ")
                && stderr.contains(reason),
            "{parameters:?}: {stderr}"
        );
    }

    // expand: the record grows, the PV comes back with the new capacity.
    let pv_yaml = ok(
        &s.provision(&class, &s.claim("data", "default", 1, "1Gi")),
        "provision",
    );
    let pv_file = s.write("pv.yaml", &pv_yaml);
    let record = s.granted().join(".quota-dir").join(pv_name(1));
    let expand = |pv: &Path, size: &str| {
        s.run(&[
            "guest",
            "expand",
            "--class",
            class_arg,
            "--volume",
            pv.to_str().unwrap(),
            "--size",
            size,
        ])
    };
    let grown = ok(&expand(&pv_file, "2Gi"), "expand to 2Gi");
    let pv: PersistentVolume = serde_yaml::from_str(&grown).expect("PV YAML on stdout");
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "2147483648 default/data\n"
    );
    // Asked again (the host retries): the same answer.
    assert_eq!(ok(&expand(&pv_file, "2Gi"), "expand again"), grown);
    // Beyond maxSize: infeasible, and the record is unchanged.
    refused(&expand(&pv_file, "3Gi"), "infeasible", "maxSize 2Gi");
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "2147483648 default/data\n"
    );
    // Beyond the pool (2Gi of 3Gi taken by the first volume): failed.
    let second = ok(
        &s.provision(&class, &s.claim("second", "default", 2, "1Gi")),
        "provision a second volume",
    );
    let second = s.write("pv-2.yaml", &second);
    refused(&expand(&second, "2Gi"), "failed", "the pool is full");
    // A volume this class never made: failed, nothing written.
    let stranger = s.write("pv-3.yaml", &pv_yaml.replace(&pv_name(1), &pv_name(3)));
    refused(&expand(&stranger, "2Gi"), "failed", "has no usage record");
    assert!(!s.granted().join(".quota-dir").join(pv_name(3)).exists());
}

/// The JavaScript quota-dir has `report-capacity` only: the pool's size and what is
/// left of it, or the granted filesystem's without a pool.
#[test]
fn javascript_quota_dir_reports_its_pools_capacity() {
    assert_eq!(
        contract_exports("quota-dir-js"),
        [
            "wasm-provisioner:plugin/capacity-reporter@0.2.0",
            "wasm-provisioner:plugin/provisioner@0.2.0",
        ]
    );
    let s = Scratch::new("quota-dir-js");
    let class = s.class(
        "sc.yaml",
        &[
            ("nodePath", "/var/lib/quota"),
            ("maxSize", "2Gi"),
            ("poolSize", "4Gi"),
        ],
    );
    let class_arg = class.to_str().unwrap();
    lacks(
        &s.run(&["guest", "validate", "--class", class_arg]),
        "validate-class",
        "report-capacity",
    );
    ok(
        &s.provision(&class, &s.claim("data", "default", 1, "1Gi")),
        "provision",
    );
    let capacity = |class: &Path| -> serde_yaml::Value {
        let out = ok(
            &s.run(&["guest", "capacity", "--class", class.to_str().unwrap()]),
            "capacity",
        );
        serde_yaml::from_str(&out).unwrap()
    };
    let pool = capacity(&class);
    assert_eq!(pool["totalBytes"].as_u64(), Some(4 << 30));
    assert_eq!(pool["availableBytes"].as_u64(), Some(3 << 30));
    assert_eq!(pool["maximumVolumeBytes"].as_u64(), Some(2 << 30));
    // Without a pool: the granted filesystem (a real statvfs through the host).
    let unpooled = s.class(
        "fs.yaml",
        &[("nodePath", "/var/lib/quota"), ("maxSize", "1Ki")],
    );
    let fs = capacity(&unpooled);
    let total = fs["totalBytes"].as_u64().unwrap();
    let available = fs["availableBytes"].as_u64().unwrap();
    assert!(
        total > 0 && available <= total && total != 4 << 30,
        "{fs:?}"
    );
    assert_eq!(fs["maximumVolumeBytes"].as_u64(), Some(1024));
}
