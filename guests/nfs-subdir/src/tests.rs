use super::*;
use sdk::testing::{delete_request, expand_request, provision_request, string_map};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory standing in for the mounted export; removed on drop.
struct Root(PathBuf);

impl Root {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nfs-subdir-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).unwrap();
        Root(dir)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
    fn has(&self, rel: &str) -> bool {
        self.0.join(rel).is_dir()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const PV: &str = "pvc-0b5c6f8e-7d1a-4c3b-9a2e-1f0d9c8b7a65";

fn nfs(v: &Volume) -> &NfsSource {
    match &v.source {
        VolumeSource::Nfs(n) => n,
        other => panic!("{other:?}"),
    }
}

fn infeasible(r: Result<Volume, ProvisionError>) -> String {
    match r {
        Err(ProvisionError::Infeasible(m)) => m,
        other => panic!("expected infeasible, got {other:?}"),
    }
}

fn failed(r: Result<(), DeleteError>) -> String {
    match r {
        Err(DeleteError::Failed(m)) => m,
        other => panic!("expected failed, got {other:?}"),
    }
}

#[test]
fn default_subdir_like_upstream_and_idempotent() {
    let root = Root::new();
    let params = [
        ("server", "nfs.example"),
        ("share", "/srv/nfs/"),
        ("guestRoot", root.s()),
    ];
    let req = provision_request(&params);
    let v = NfsSubdir::provision(&req).unwrap();
    let subdir = format!("default-data-{PV}");
    assert!(root.has(&subdir));
    assert_eq!(
        *nfs(&v),
        NfsSource {
            server: "nfs.example".into(),
            path: format!("/srv/nfs/{subdir}"),
            read_only: false
        }
    );
    assert_eq!(v.capacity_bytes, 1 << 30);
    assert!(v.node_affinity.is_empty());
    assert_eq!(sdk::lookup(&v.annotations, ANN_SHARE), Some("/srv/nfs"));
    assert_eq!(sdk::lookup(&v.annotations, ANN_ON_DELETE), Some("delete"));
    assert_eq!(NfsSubdir::provision(&req).unwrap(), v);
}

#[test]
fn path_pattern_nests_and_is_found_again() {
    let root = Root::new();
    let params = [
        ("server", "10.0.0.5"),
        ("share", "/export"),
        ("guestRoot", root.s()),
        (
            "pathPattern",
            "${.PVC.namespace}/${.PVC.labels.app}/${.PVC.name}",
        ),
    ];
    let mut req = provision_request(&params);
    req.claim.labels = string_map(&[("app", "db")]);
    let v = NfsSubdir::provision(&req).unwrap();
    assert!(root.has("default/db/data"));
    assert_eq!(nfs(&v).path, "/export/default/db/data");
    assert_eq!(NfsSubdir::provision(&req).unwrap(), v);
    NfsSubdir::delete(&delete_request(&req, &v, &params)).unwrap();
    assert!(!root.has("default/db/data") && root.has("default/db"));
}

#[test]
fn hostile_claims_are_infeasible() {
    let params = [
        ("server", "s"),
        ("share", "/x"),
        ("pathPattern", "${.PVC.namespace}/${.PVC.annotations.dir}"),
    ];
    let mut req = provision_request(&params);
    req.claim.annotations = string_map(&[("dir", "../../etc")]);
    let m = infeasible(NfsSubdir::provision(&req));
    assert!(m.contains("annotation \"dir\""), "{m}");
}

#[test]
fn bad_parameters_are_infeasible_and_named() {
    for (params, named) in [
        (vec![("share", "/x")], "`server` is required"),
        (vec![("server", "s")], "`share` is required"),
        (vec![("server", "s"), ("share", "x")], "`share`"),
        (vec![("server", "a b"), ("share", "/x")], "`server`"),
        (
            vec![("server", "s"), ("share", "/x"), ("guestRoot", "e")],
            "`guestRoot`",
        ),
        (
            vec![("server", "s"), ("share", "/x"), ("onDelete", "x")],
            "`onDelete`",
        ),
        (
            vec![("server", "s"), ("share", "/x"), ("archiveOnDelete", "y")],
            "`archiveOnDelete`",
        ),
        (
            vec![("server", "s"), ("share", "/x"), ("pathPattern", "${x}")],
            "`pathPattern`",
        ),
        (
            vec![("server", "s"), ("share", "/x"), ("mountOptions", "v4")],
            "mountOptions",
        ),
    ] {
        let m = infeasible(NfsSubdir::provision(&provision_request(&params)));
        assert!(m.contains(named), "{params:?}: {m}");
    }
}

#[test]
fn missing_grant_fails() {
    let params = [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", "/nonexistent-export-xyz"),
    ];
    match NfsSubdir::provision(&provision_request(&params)) {
        Err(ProvisionError::Failed(m)) => assert!(m.contains("guestRoot"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn on_delete_policies() {
    let p = |pairs: &[(&str, &str)]| on_delete(&Params::new(&string_map(pairs))).unwrap();
    assert_eq!(p(&[]), "delete");
    assert_eq!(p(&[("archiveOnDelete", "true")]), "archive");
    assert_eq!(p(&[("archiveOnDelete", "false")]), "delete");
    assert_eq!(
        p(&[("onDelete", "retain"), ("archiveOnDelete", "true")]),
        "retain"
    );
    assert_eq!(
        p(&[("onDelete", "delete"), ("archiveOnDelete", "true")]),
        "delete"
    );
}

#[test]
fn delete_is_idempotent_and_archives() {
    let root = Root::new();
    let params = [("server", "s"), ("share", "/x"), ("guestRoot", root.s())];
    let req = provision_request(&params);
    let v = NfsSubdir::provision(&req).unwrap();
    let subdir = format!("default-data-{PV}");
    fs::write(root.0.join(&subdir).join("f"), b"x").unwrap();
    NfsSubdir::delete(&delete_request(&req, &v, &params)).unwrap();
    assert!(!root.has(&subdir));
    NfsSubdir::delete(&delete_request(&req, &v, &params)).unwrap();

    let archive = [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", root.s()),
        ("archiveOnDelete", "true"),
    ];
    let v = NfsSubdir::provision(&req).unwrap();
    NfsSubdir::delete(&delete_request(&req, &v, &archive)).unwrap();
    assert!(root.has(&format!("archived-{subdir}")));
    // Archived already: the second archive gets the PV name appended.
    NfsSubdir::provision(&req).unwrap();
    NfsSubdir::delete(&delete_request(&req, &v, &archive)).unwrap();
    assert!(root.has(&format!("archived-{subdir}-{PV}")));
    NfsSubdir::provision(&req).unwrap();
    let m = failed(NfsSubdir::delete(&delete_request(&req, &v, &archive)));
    assert!(m.contains("both exist"), "{m}");

    let retain = [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", root.s()),
        ("onDelete", "retain"),
    ];
    NfsSubdir::delete(&delete_request(&req, &v, &retain)).unwrap();
    assert!(root.has(&subdir));
}

#[test]
fn delete_without_class_uses_recorded_annotations() {
    let root = Root::new();
    let params = [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", root.s()),
        ("onDelete", "archive"),
    ];
    let req = provision_request(&params);
    let v = NfsSubdir::provision(&req).unwrap();
    NfsSubdir::delete(&delete_request(&req, &v, &[])).unwrap();
    assert!(root.has(&format!("archived-default-data-{PV}")));

    let mut bare = delete_request(&req, &v, &[]);
    bare.volume.annotations.clear();
    let m = failed(NfsSubdir::delete(&bare));
    assert!(m.contains(ANN_SHARE), "{m}");
}

#[test]
fn delete_refuses_paths_outside_the_share() {
    let root = Root::new();
    let params = [("server", "s"), ("share", "/x"), ("guestRoot", root.s())];
    let req = provision_request(&params);
    let v = NfsSubdir::provision(&req).unwrap();
    for path in [
        "/x",
        "/x/",
        "/y/a",
        "/xa/b",
        "/x/../etc",
        "/x/a/../../etc",
        "x/a",
        "/",
    ] {
        let mut del = delete_request(&req, &v, &params);
        del.volume.source = VolumeSource::Nfs(NfsSource {
            server: "s".into(),
            path: path.into(),
            read_only: false,
        });
        let m = failed(NfsSubdir::delete(&del));
        assert!(m.contains("refusing"), "{path}: {m}");
    }
    let mut del = delete_request(&req, &v, &params);
    del.volume.source = VolumeSource::Nfs(NfsSource {
        server: "other".into(),
        path: nfs(&v).path.clone(),
        read_only: false,
    });
    assert!(failed(NfsSubdir::delete(&del)).contains("server"));
    del.volume.source = VolumeSource::host_path("/x/a", None);
    failed(NfsSubdir::delete(&del));
    assert!(root.has(&format!("default-data-{PV}")));
}

#[test]
fn relative_paths() {
    assert_eq!(relative_to_share("/x/a/b", "/x").unwrap(), "a/b");
    assert_eq!(relative_to_share("/x//a/", "/x/").unwrap(), "a");
    assert_eq!(relative_to_share("/a", "/").unwrap(), "a");
    assert!(relative_to_share("/", "/").is_err());
}

#[cfg(unix)]
#[test]
fn symlinks_in_the_path_are_refused() {
    let root = Root::new();
    let outside = Root::new();
    std::os::unix::fs::symlink(&outside.0, root.0.join("default")).unwrap();
    let params = [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", root.s()),
        ("pathPattern", "${.PVC.namespace}/${.PVC.name}"),
    ];
    let req = provision_request(&params);
    match NfsSubdir::provision(&req) {
        Err(ProvisionError::Failed(m)) => assert!(m.contains("symbolic link"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!outside.has("data"));
    fs::create_dir(outside.0.join("data")).unwrap();
    let v = Volume::new(
        1,
        VolumeSource::Nfs(NfsSource {
            server: "s".into(),
            path: "/x/default/data".into(),
            read_only: false,
        }),
    );
    let m = failed(NfsSubdir::delete(&delete_request(&req, &v, &params)));
    assert!(m.contains("symbolic link"), "{m}");
    assert!(outside.has("data"));
}

#[test]
fn describe() {
    assert_eq!(NfsSubdir::describe().name, "nfs-subdir");
}

/// Claim `name` with UID `uid` (so PV `pvc-<uid>`) whose annotation `dir` is `dir`.
fn tenant(params: &[(&str, &str)], name: &str, uid: &str, dir: &str) -> ProvisionRequest {
    let mut req = provision_request(params);
    req.claim.name = name.to_string();
    req.claim.uid = uid.to_string();
    req.volume_name = format!("pvc-{uid}");
    req.claim.annotations = string_map(&[("dir", dir)]);
    req
}

fn provision_failed(r: Result<Volume, ProvisionError>) -> String {
    match r {
        Err(ProvisionError::Failed(m)) => m,
        other => panic!("expected failed, got {other:?}"),
    }
}

fn by_annotation(root: &Root) -> [(&str, &str); 4] {
    [
        ("server", "s"),
        ("share", "/x"),
        ("guestRoot", root.s()),
        ("pathPattern", "${.PVC.annotations.dir}"),
    ]
}

#[test]
fn two_claims_expanding_to_one_directory_never_share_it() {
    let root = Root::new();
    let params = by_annotation(&root);
    let a = tenant(&params, "a", "aaaa", "shared");
    let b = tenant(&params, "b", "bbbb", "shared");
    let va = NfsSubdir::provision(&a).unwrap();
    fs::write(root.0.join("shared/a-data"), b"a").unwrap();
    // Idempotent for the owner, refused for the other (without naming the owner).
    assert_eq!(NfsSubdir::provision(&a).unwrap(), va);
    let m = provision_failed(NfsSubdir::provision(&b));
    assert!(m.contains("already belongs to another volume"), "{m}");
    assert!(
        !m.contains("pvc-aaaa"),
        "another tenant's PV is not disclosed: {m}"
    );
    // A PV of B pointing there (however it came to be) cannot delete A's data.
    let m = failed(NfsSubdir::delete(&delete_request(&b, &va, &params)));
    assert!(m.contains("belongs to another volume"), "{m}");
    assert!(m.contains("remove the finalizer"), "{m}");
    assert!(root.0.join("shared/a-data").exists());
    // A's own delete works, and frees the path for B.
    NfsSubdir::delete(&delete_request(&a, &va, &params)).unwrap();
    assert!(!root.has("shared"));
    NfsSubdir::provision(&b).unwrap();
}

#[test]
fn the_marker_is_a_sibling_naming_the_pv_and_claim() {
    let root = Root::new();
    let params = by_annotation(&root);
    let a = tenant(&params, "a", "aaaa", "team/vol");
    let v = NfsSubdir::provision(&a).unwrap();
    assert_eq!(fs::read_dir(root.0.join("team/vol")).unwrap().count(), 0);
    let text = fs::read_to_string(root.0.join("team/.wasm-provisioner-owners/vol")).unwrap();
    assert!(text.contains("volume: pvc-aaaa\n"), "{text}");
    assert!(text.contains("claim-uid: aaaa\n"), "{text}");
    assert_eq!(
        sdk::lookup(&v.annotations, ANN_OWNER_MARKER),
        Some("team/.wasm-provisioner-owners/vol")
    );
    NfsSubdir::delete(&delete_request(&a, &v, &params)).unwrap();
    assert!(!root.0.join("team/.wasm-provisioner-owners/vol").exists());
}

#[test]
fn existing_unmarked_directories_and_nesting_are_refused() {
    let root = Root::new();
    let params = by_annotation(&root);
    fs::create_dir(root.0.join("admins-data")).unwrap();
    let m = provision_failed(NfsSubdir::provision(&tenant(
        &params,
        "a",
        "aaaa",
        "admins-data",
    )));
    assert!(m.contains("already exists"), "{m}");

    // Inside another volume: B would share A's data and go with A's delete.
    NfsSubdir::provision(&tenant(&params, "a", "aaaa", "outer")).unwrap();
    let m = provision_failed(NfsSubdir::provision(&tenant(
        &params,
        "b",
        "bbbb",
        "outer/inner",
    )));
    assert!(m.contains("inside another volume"), "{m}");
    assert!(!root.has("outer/inner"));
    // Around another volume: the parent exists, unmarked.
    NfsSubdir::provision(&tenant(&params, "c", "cccc", "p/q")).unwrap();
    let m = provision_failed(NfsSubdir::provision(&tenant(&params, "d", "dddd", "p")));
    assert!(m.contains("already exists"), "{m}");
}

#[test]
fn reserved_names_are_infeasible() {
    let root = Root::new();
    let params = by_annotation(&root);
    for dir in [".wasm-provisioner-owners", "x/.wasm-provisioner-trash/y"] {
        let m = infeasible(NfsSubdir::provision(&tenant(&params, "a", "aaaa", dir)));
        assert!(m.contains("reserved"), "{m}");
    }
}

#[test]
fn a_marked_directory_lost_in_a_crash_is_made_again() {
    let root = Root::new();
    let params = by_annotation(&root);
    let a = tenant(&params, "a", "aaaa", "vol");
    let v = NfsSubdir::provision(&a).unwrap();
    fs::remove_dir(root.0.join("vol")).unwrap();
    assert_eq!(NfsSubdir::provision(&a).unwrap(), v);
    assert!(root.has("vol"));
}

#[test]
fn volumes_without_a_marker_are_not_deleted_and_the_message_says_what_to_do() {
    let root = Root::new();
    let params = by_annotation(&root);
    let a = tenant(&params, "a", "aaaa", "old");
    let mut v = NfsSubdir::provision(&a).unwrap();
    fs::remove_file(root.0.join(".wasm-provisioner-owners/old")).unwrap();
    fs::write(root.0.join("old/data"), b"x").unwrap();
    // Made with a marker that has gone missing.
    let m = failed(NfsSubdir::delete(&delete_request(&a, &v, &params)));
    assert!(
        m.contains("owner marker") && m.contains("is missing"),
        "{m}"
    );
    // Made before markers existed (no annotation): the same refusal, explained.
    v.annotations.retain(|(k, _)| k != ANN_OWNER_MARKER);
    let m = failed(NfsSubdir::delete(&delete_request(&a, &v, &params)));
    assert!(
        m.contains("made before nfs-subdir wrote owner markers"),
        "{m}"
    );
    assert!(m.contains("echo 'volume: pvc-aaaa'"), "{m}");
    assert!(root.0.join("old/data").exists());
    // Following the message lets the delete go on.
    fs::write(
        root.0.join(".wasm-provisioner-owners/old"),
        "volume: pvc-aaaa\n",
    )
    .unwrap();
    NfsSubdir::delete(&delete_request(&a, &v, &params)).unwrap();
    assert!(!root.has("old"));
}

#[test]
fn archives_stay_marked() {
    let root = Root::new();
    let mut params = by_annotation(&root).to_vec();
    params.push(("onDelete", "archive"));
    let a = tenant(&params, "a", "aaaa", "vol");
    let v = NfsSubdir::provision(&a).unwrap();
    NfsSubdir::delete(&delete_request(&a, &v, &params)).unwrap();
    assert!(root.has("archived-vol") && !root.has("vol"));
    let text = fs::read_to_string(root.0.join(".wasm-provisioner-owners/archived-vol")).unwrap();
    assert!(text.contains("volume: pvc-aaaa"), "{text}");
    assert!(!root.0.join(".wasm-provisioner-owners/vol").exists());
    // Nobody can take the archive over by naming it.
    let m = provision_failed(NfsSubdir::provision(&tenant(
        &params,
        "b",
        "bbbb",
        "archived-vol",
    )));
    assert!(m.contains("another volume"), "{m}");
}

#[test]
fn large_volumes_are_deleted_in_chunks() {
    let root = Root::new();
    let mut params = by_annotation(&root).to_vec();
    params.push(("deleteChunkEntries", "10"));
    let a = tenant(&params, "a", "aaaa", "vol");
    let v = NfsSubdir::provision(&a).unwrap();
    for i in 0..35 {
        fs::write(root.0.join(format!("vol/f{i}")), b"x").unwrap();
    }
    let del = delete_request(&a, &v, &params);
    let mut chunks = 0;
    loop {
        match NfsSubdir::delete(&del) {
            Ok(()) => break,
            Err(DeleteError::InBackground(m)) => {
                assert!(m.contains("deleted 10 entries"), "{m}");
                // The path and its marker are free from the first chunk on.
                assert!(!root.has("vol"));
                assert!(!root.0.join(".wasm-provisioner-owners/vol").exists());
                chunks += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(chunks, 3);
    assert!(
        !root.0.join(".wasm-provisioner-trash").exists(),
        "the empty trash is removed"
    );
}

#[test]
fn expand_records_the_size_within_max_size() {
    let root = Root::new();
    let params = [
        ("server", "nfs.example"),
        ("share", "/srv/nfs"),
        ("guestRoot", root.s()),
        ("maxSize", "4Gi"),
    ];
    let req = provision_request(&params);
    let v = NfsSubdir::provision(&req).unwrap();
    let grow = expand_request(&req, &v, &params, 2 << 30);
    assert_eq!(NfsSubdir::expand(&grow), Ok(2 << 30));
    // Idempotent: asked again, the same answer.
    assert_eq!(NfsSubdir::expand(&grow), Ok(2 << 30));

    let beyond = expand_request(&req, &v, &params, 5 << 30);
    match NfsSubdir::expand(&beyond) {
        Err(ExpandError::Infeasible(m)) => assert!(m.contains("maxSize"), "{m}"),
        other => panic!("expected infeasible, got {other:?}"),
    }

    fs::remove_dir_all(root.0.join(format!("default-data-{PV}"))).unwrap();
    match NfsSubdir::expand(&grow) {
        Err(ExpandError::Failed(m)) => assert!(m.contains("is gone"), "{m}"),
        other => panic!("expected failed, got {other:?}"),
    }
}

#[test]
fn provision_refuses_beyond_max_size() {
    let root = Root::new();
    let params = [
        ("server", "nfs.example"),
        ("share", "/srv/nfs"),
        ("guestRoot", root.s()),
        ("maxSize", "512Mi"),
    ];
    let m = infeasible(NfsSubdir::provision(&provision_request(&params)));
    assert!(m.contains("maxSize"), "{m}");
    let bad = [
        ("server", "nfs.example"),
        ("share", "/srv/nfs"),
        ("maxSize", "big"),
    ];
    let m = infeasible(NfsSubdir::provision(&provision_request(&bad)));
    assert!(m.contains("maxSize"), "{m}");
}

#[test]
fn the_class_validator_refuses_what_provision_would() {
    let class = |pairs: &[(&str, &str)]| sdk::testing::class(pairs);
    let good = [("server", "nfs.example"), ("share", "/srv/nfs")];
    assert_eq!(NfsSubdir::validate_class(&class(&good)), Ok(()));
    let with = |extra: (&'static str, &'static str)| {
        let mut pairs = good.to_vec();
        pairs.push(extra);
        NfsSubdir::validate_class(&class(&pairs)).unwrap_err()
    };
    assert!(
        with(("sahre", "/x")).contains("sahre"),
        "an unknown key is named"
    );
    assert!(with(("guestRoot", "relative")).contains("guestRoot"));
    assert!(with(("onDelete", "shred")).contains("onDelete"));
    assert!(with(("pathPattern", "${.PVC.nme}")).contains("unknown variable"));
    assert!(with(("pathPattern", "${.PVC.name")).contains("unterminated"));
    assert!(
        NfsSubdir::validate_class(&class(&[("share", "/srv/nfs")]))
            .unwrap_err()
            .contains("server")
    );
    assert!(
        NfsSubdir::validate_class(&class(&[("server", "nfs.example"), ("share", "srv")]))
            .unwrap_err()
            .contains("share")
    );
    // Everything a valid pathPattern may hold passes.
    let pattern = ("pathPattern", "${.PVC.namespace}/${.PVC.labels.app}");
    let mut pairs = good.to_vec();
    pairs.push(pattern);
    assert_eq!(NfsSubdir::validate_class(&class(&pairs)), Ok(()));
}
