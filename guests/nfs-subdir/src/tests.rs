use super::*;
use sdk::testing::{delete_request, provision_request, string_map};
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
