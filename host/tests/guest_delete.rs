//! Volumes a tenant shaped to be undeletable, deleted through the offline runner (`guest
//! delete`, the controller's code path) with the real hostpath guest: names that are not
//! UTF-8, a 20 000-deep tree, 300 000 files. The test process makes each shape on the
//! host side, inside the granted directory, as a pod writing into its volume would; the
//! runner is run again while it exits with the in-background status (3), as a script
//! would loop, until it exits 0.

mod common;
use common::dist_dir;

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// `guest delete`'s exit status for "continues in the background".
const IN_BACKGROUND: i32 = 3;

/// Rounds a delete may take before the test calls it stuck.
const MAX_ROUNDS: usize = 400;

const VOLUME: &str = "pvc-6b2e8f3a-0000-4000-8000-000000000006";

/// A modules directory with hostpath, a directory granted to it at `/volumes`, and the
/// PV and class files of one volume in it.
struct Scratch {
    root: tempfile::TempDir,
}

impl Scratch {
    /// `chunk`: the class's `deleteChunkEntries`, if any.
    fn new(chunk: Option<u64>) -> Self {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir(at("modules")).unwrap();
        std::fs::create_dir(at("granted")).unwrap();
        std::fs::copy(
            dist_dir().join("hostpath.wasm"),
            at("modules/hostpath.wasm"),
        )
        .unwrap();
        std::fs::write(
            at("grants.yaml"),
            format!(
                "allow: {{ directories: [{root}] }}\n\
                 modules:\n  hostpath:\n    directories:\n      - {{ host: {granted}, guest: /volumes, mode: read-write }}\n",
                root = root.path().display(),
                granted = at("granted").display(),
            ),
        )
        .unwrap();
        let chunk = chunk
            .map(|n| format!("  deleteChunkEntries: \"{n}\"\n"))
            .unwrap_or_default();
        std::fs::write(
            at("sc.yaml"),
            format!(
                "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: local\n\
                 provisioner: wasm-provisioner.dev\nparameters:\n  module: hostpath\n  \
                 nodePath: /var/lib/volumes\n{chunk}reclaimPolicy: Delete\n"
            ),
        )
        .unwrap();
        std::fs::write(
            at("pv.yaml"),
            format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {VOLUME}\n  \
                 annotations:\n    wasm-provisioner.dev/module: hostpath\n    \
                 hostpath/guest-root: /volumes\n    hostpath/on-delete: delete\n\
                 spec:\n  capacity: {{ storage: 1Gi }}\n  accessModes: [ReadWriteOnce]\n  \
                 persistentVolumeReclaimPolicy: Delete\n  storageClassName: local\n  \
                 hostPath: {{ path: /var/lib/volumes/{VOLUME}, type: Directory }}\n"
            ),
        )
        .unwrap();
        let scratch = Scratch { root };
        std::fs::create_dir(scratch.volume()).unwrap();
        scratch
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// The volume's directory on the host, where the tenant's pod writes.
    fn volume(&self) -> PathBuf {
        self.path("granted").join(VOLUME)
    }

    /// The hostpath guest's trash directory on the host.
    fn trash(&self) -> PathBuf {
        self.path("granted/.wasm-provisioner-trash")
    }

    fn delete_once(&self) -> Output {
        let arg = |p: &str| self.path(p).to_str().unwrap().to_string();
        Command::new(env!("CARGO_BIN_EXE_wasm-provisioner"))
            .args(["guest", "delete", "--modules", &arg("modules")])
            .args([
                "--grants",
                &arg("grants.yaml"),
                "--cache-dir",
                &arg("cache"),
            ])
            .args(["--volume", &arg("pv.yaml"), "--class", &arg("sc.yaml")])
            .env_clear()
            .env("WASM_PROVISIONER_LOG", "warn")
            .output()
            .expect("running wasm-provisioner")
    }

    /// Runs `guest delete` until it exits 0; answers how many runs it took and the
    /// last run's stderr. Panics on any other exit status, or after [`MAX_ROUNDS`].
    fn delete_until_done(&self) -> (usize, String) {
        let started = Instant::now();
        for round in 1..=MAX_ROUNDS {
            let output = self.delete_once();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            match output.status.code() {
                Some(0) => {
                    assert!(stdout.contains("deleted the backend volume"), "{stdout}");
                    eprintln!("deleted in {round} rounds, {:?}", started.elapsed());
                    return (round, stderr);
                }
                Some(IN_BACKGROUND) => assert!(
                    stdout.contains("continues in the background") && stdout.contains(VOLUME),
                    "round {round}: exit 3 must say so on stdout:\n{stdout}"
                ),
                _ => panic!(
                    "round {round}: guest delete failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                    output.status
                ),
            }
        }
        panic!("the delete was still in the background after {MAX_ROUNDS} rounds");
    }
}

impl Drop for Scratch {
    /// A shape the delete did not remove (a failed test) is too deep for the recursive
    /// `remove_dir_all` of the temporary directory (it would overflow the stack and
    /// abort every test): flatten it first.
    fn drop(&mut self) {
        flatten_and_remove(&self.path("granted"));
    }
}

/// Removes `dir` and everything below it without recursion: a subdirectory's
/// subdirectories are moved up into `dir` until none is left.
fn flatten_and_remove(dir: &Path) {
    let mut fresh = 0u64;
    loop {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut any = false;
        for entry in entries.flatten() {
            any = true;
            let path = entry.path();
            if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let _ = std::fs::remove_file(&path);
            } else if std::fs::remove_dir(&path).is_err() {
                for child in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    fresh += 1;
                    let _ = std::fs::rename(child.path(), dir.join(format!(".flat-{fresh}")));
                }
            }
        }
        if !any {
            let _ = std::fs::remove_dir(dir);
            return;
        }
    }
}

/// Everything below `dir`, as paths relative to it (bytes, names not UTF-8 included).
fn listing(dir: &Path) -> Vec<Vec<u8>> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            found.push(
                path.strip_prefix(dir)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            );
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

fn os(bytes: &[u8]) -> &std::ffi::OsStr {
    std::ffi::OsStr::from_bytes(bytes)
}

/// Names WASI cannot express cannot be deleted by the guest, but they no longer keep
/// the volume: everything nameable is deleted, the directories still holding such
/// names are moved aside in the trash for the admin, and the delete succeeds.
#[test]
fn names_that_are_not_utf8_do_not_make_a_volume_undeletable() {
    let scratch = Scratch::new(None);
    let volume = scratch.volume();
    std::fs::write(volume.join(os(b"latin1-caf\xe9")), "x").unwrap();
    std::fs::write(volume.join("plain"), "x").unwrap();
    std::fs::create_dir(volume.join(os(b"dir-\xff"))).unwrap();
    std::fs::write(volume.join(os(b"dir-\xff/inside")), "x").unwrap();
    std::fs::create_dir_all(volume.join("nested/deeper")).unwrap();
    std::fs::write(volume.join(os(b"nested/deeper/\xfe\xfe")), "x").unwrap();
    std::fs::write(volume.join("nested/deeper/fine"), "x").unwrap();
    std::fs::write(volume.join("nested/also-fine"), "x").unwrap();

    let (_, stderr) = scratch.delete_until_done();
    assert!(!volume.exists(), "{} survived the delete", volume.display());
    // What remains: the three unnameable entries, what is inside the unnameable
    // directory (unreachable without its name), and the directory that held the
    // nested one (hoisted under a fresh name); nothing else. The admin is told where.
    let trash = scratch.trash();
    let remnants = trash.join(format!("{VOLUME}.remnants-1"));
    assert!(
        stderr.contains("not UTF-8") && stderr.contains(&format!("{VOLUME}.remnants-1")),
        "the remnants must be reported:\n{stderr}"
    );
    let left: Vec<String> = listing(&remnants)
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let expected = ["latin1-caf\u{fffd}", "dir-\u{fffd}", "dir-\u{fffd}/inside"];
    for name in expected {
        assert!(left.iter().any(|p| p == name), "{name} missing in {left:?}");
    }
    let hoisted: Vec<&String> = left.iter().filter(|p| p.starts_with(".hoisted-")).collect();
    assert_eq!(hoisted.len(), 2, "{left:?}");
    assert!(
        hoisted.iter().any(|p| p.ends_with("/\u{fffd}\u{fffd}")),
        "{left:?}"
    );
    assert_eq!(
        left.len(),
        expected.len() + 2,
        "only those are left: {left:?}"
    );
    assert_eq!(
        listing(&trash).len(),
        1 + left.len(),
        "only the remnants stay in the trash: {:?}",
        listing(&trash)
    );
}

/// A chain of directories far deeper than any stack or `PATH_MAX` allows to walk by
/// recursion or by full paths.
#[test]
fn a_20000_deep_tree_is_deleted() {
    let scratch = Scratch::new(None);
    let volume = scratch.volume();
    // Built bottom-up by renames, so the test itself never uses a path longer than two
    // components (a full path to the bottom is ~40 KB, ten times PATH_MAX).
    std::fs::create_dir(volume.join("d")).unwrap();
    std::fs::write(volume.join("d/bottom"), "x").unwrap();
    for level in 1..20_000 {
        std::fs::create_dir(volume.join("up")).unwrap();
        if level % 1000 == 0 {
            std::fs::write(volume.join("up/file"), "x").unwrap();
        }
        std::fs::rename(volume.join("d"), volume.join("up/d")).unwrap();
        std::fs::rename(volume.join("up"), volume.join("d")).unwrap();
    }

    scratch.delete_until_done();
    assert!(!volume.exists(), "{} survived the delete", volume.display());
    assert!(
        !scratch.trash().exists(),
        "nothing left behind, not even the trash"
    );
}

/// More files than one call can delete within its timeout: the delete goes in chunks,
/// the runner exits 3 between them, and the volume is gone in the end.
#[test]
fn three_hundred_thousand_files_are_deleted_in_chunks() {
    let scratch = Scratch::new(None);
    let volume = scratch.volume();
    std::fs::create_dir(volume.join("sub")).unwrap();
    for i in 0..300_000 {
        let at = if i % 2 == 0 {
            volume.join(format!("f{i}"))
        } else {
            volume.join(format!("sub/f{i}"))
        };
        std::fs::File::create(at).unwrap();
    }

    let (rounds, _) = scratch.delete_until_done();
    assert!(
        rounds >= 3,
        "300000 entries at most 100000 per call take 3 calls or more; took {rounds}"
    );
    assert!(!volume.exists(), "{} survived the delete", volume.display());
    assert!(
        !scratch.trash().exists(),
        "nothing left behind, not even the trash"
    );
    // How long it took is a figure `delete_until_done` prints, not an assertion (speed
    // is for benchmarks): 10 to 300 s depending on the machine's load.
}
