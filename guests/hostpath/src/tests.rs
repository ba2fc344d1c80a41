use super::*;
use sdk::testing::{delete_request, node, provision_request};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory standing in for the granted one; removed on drop.
struct Root(PathBuf);

impl Root {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hostpath-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).unwrap();
        Root(dir)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
    fn has(&self, name: &str) -> bool {
        self.0.join(name).is_dir()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn pv() -> String {
    provision_request(&[]).volume_name
}

fn infeasible(r: Result<Volume, ProvisionError>) -> String {
    match r {
        Err(ProvisionError::Infeasible(m)) => m,
        other => panic!("expected infeasible, got {other:?}"),
    }
}

#[test]
fn provisions_a_directory_idempotently() {
    let root = Root::new();
    let req = provision_request(&[("guestRoot", root.s()), ("nodePath", "/srv/vols/")]);
    let v = HostPath::provision(&req).unwrap();
    assert!(root.has(&pv()));
    assert_eq!(v.capacity_bytes, 1 << 30);
    assert_eq!(
        v.source,
        VolumeSource::host_path(format!("/srv/vols/{}", pv()), Some("Directory"))
    );
    assert!(
        v.node_affinity.is_empty(),
        "hostPath without a node: no affinity"
    );
    assert_eq!(sdk::lookup(&v.annotations, ANN_GUEST_ROOT), Some(root.s()));
    assert_eq!(sdk::lookup(&v.annotations, ANN_ON_DELETE), Some("delete"));
    // A retry returns the same volume.
    assert_eq!(HostPath::provision(&req).unwrap(), v);
}

#[test]
fn node_affinity_from_parameter_or_selected_node() {
    let root = Root::new();
    let mut req = provision_request(&[("guestRoot", root.s()), ("nodePath", "/n")]);
    req.selected_node = Some(node("worker-1"));
    let v = HostPath::provision(&req).unwrap();
    assert_eq!(v.node_affinity, sdk::hostname_affinity("worker-1"));

    let mut req = provision_request(&[
        ("guestRoot", root.s()),
        ("nodePath", "/n"),
        ("node", "worker-2"),
        ("pvType", "local"),
    ]);
    let v = HostPath::provision(&req).unwrap();
    assert_eq!(v.node_affinity, sdk::hostname_affinity("worker-2"));
    assert!(matches!(v.source, VolumeSource::Local(ref l) if l.path == format!("/n/{}", pv())));

    req.selected_node = Some(node("worker-3"));
    match HostPath::provision(&req) {
        Err(ProvisionError::Reschedule(m)) => assert!(m.contains("worker-2"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_volume_for_another_node_than_the_one_it_runs_on_is_refused() {
    let root = Root::new();
    let mut req = provision_request(&[("guestRoot", root.s()), ("nodePath", "/n")]);
    req.selected_node = Some(node("worker-1"));
    req.context.node = Some("worker-2".into());
    let m = infeasible(HostPath::provision(&req));
    assert!(
        m.contains("for node worker-1") && m.contains("runs on node worker-2"),
        "{m}"
    );
    assert!(!root.has(&pv()), "a directory was made on the wrong node");
    // The same node, or a host that does not know its node: made as before.
    req.context.node = Some("worker-1".into());
    assert!(HostPath::provision(&req).is_ok());
    req.context.node = None;
    assert!(HostPath::provision(&req).is_ok());
}

#[test]
fn local_needs_a_node() {
    let req = provision_request(&[("nodePath", "/n"), ("pvType", "local")]);
    let m = infeasible(HostPath::provision(&req));
    assert!(
        m.contains("`node`") && m.contains("WaitForFirstConsumer"),
        "{m}"
    );
}

#[test]
fn bad_parameters_are_infeasible_and_named() {
    let m = infeasible(HostPath::provision(&provision_request(&[])));
    assert!(m.contains("`nodePath` is required"), "{m}");
    for (params, named) in [
        (vec![("nodePath", "relative")], "`nodePath`"),
        (vec![("nodePath", "/a/../b")], "`nodePath`"),
        (vec![("nodePath", "/n"), ("guestRoot", "x")], "`guestRoot`"),
        (vec![("nodePath", "/n"), ("pvType", "nfs")], "`pvType`"),
        (
            vec![("nodePath", "/n"), ("onDelete", "shred")],
            "`onDelete`",
        ),
        (vec![("nodePath", "/n"), ("node", "Bad Node")], "`node`"),
        (vec![("nodePath", "/n"), ("nodepath", "/n")], "nodepath"),
    ] {
        let m = infeasible(HostPath::provision(&provision_request(&params)));
        assert!(m.contains(named), "{params:?}: {m}");
    }
}

#[test]
fn refuses_unsupported_claims_and_names() {
    let params = [("nodePath", "/n")];
    let mut req = provision_request(&params);
    req.volume_name = "pvc-../../etc".into();
    assert!(infeasible(HostPath::provision(&req)).contains("pvc-<claim uid>"));
    let mut req = provision_request(&params);
    req.claim.volume_mode = VolumeMode::Block;
    assert!(infeasible(HostPath::provision(&req)).contains("Block"));
    let mut req = provision_request(&params);
    req.claim.selector = Some(LabelSelector {
        match_labels: vec![],
        match_expressions: vec![],
    });
    assert!(infeasible(HostPath::provision(&req)).contains("selector"));
}

#[test]
fn missing_grant_fails() {
    let req = provision_request(&[("guestRoot", "/nonexistent-grant-xyz"), ("nodePath", "/n")]);
    match HostPath::provision(&req) {
        Err(ProvisionError::Failed(m)) => assert!(m.contains("guestRoot"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn delete_removes_and_is_idempotent() {
    let root = Root::new();
    let params = [("guestRoot", root.s()), ("nodePath", "/n")];
    let req = provision_request(&params);
    let v = HostPath::provision(&req).unwrap();
    fs::write(root.0.join(pv()).join("data"), b"x").unwrap();
    let del = delete_request(&req, &v, &params);
    HostPath::delete(&del).unwrap();
    assert!(!root.has(&pv()));
    HostPath::delete(&del).unwrap();
}

#[test]
fn delete_archives_or_retains() {
    let root = Root::new();
    let params = [
        ("guestRoot", root.s()),
        ("nodePath", "/n"),
        ("onDelete", "archive"),
    ];
    let req = provision_request(&params);
    let v = HostPath::provision(&req).unwrap();
    HostPath::delete(&delete_request(&req, &v, &params)).unwrap();
    assert!(!root.has(&pv()) && root.has(&format!("archived-{}", pv())));
    HostPath::delete(&delete_request(&req, &v, &params)).unwrap();

    let root = Root::new();
    let params = [
        ("guestRoot", root.s()),
        ("nodePath", "/n"),
        ("onDelete", "retain"),
    ];
    let req = provision_request(&params);
    let v = HostPath::provision(&req).unwrap();
    HostPath::delete(&delete_request(&req, &v, &params)).unwrap();
    assert!(root.has(&pv()));
}

#[test]
fn delete_without_class_uses_recorded_annotations() {
    let root = Root::new();
    let params = [
        ("guestRoot", root.s()),
        ("nodePath", "/n"),
        ("onDelete", "archive"),
    ];
    let req = provision_request(&params);
    let v = HostPath::provision(&req).unwrap();
    HostPath::delete(&delete_request(&req, &v, &[])).unwrap();
    assert!(root.has(&format!("archived-{}", pv())));
}

#[test]
fn delete_refuses_foreign_volumes() {
    let root = Root::new();
    let params = [("guestRoot", root.s()), ("nodePath", "/n")];
    let req = provision_request(&params);
    let v = HostPath::provision(&req).unwrap();
    let mut del = delete_request(&req, &v, &params);
    del.volume.source = VolumeSource::host_path("/n/other", None);
    assert!(matches!(
        HostPath::delete(&del),
        Err(DeleteError::Failed(_))
    ));
    del.volume.source = VolumeSource::Nfs(NfsSource {
        server: "s".into(),
        path: "/x".into(),
        read_only: false,
    });
    assert!(matches!(
        HostPath::delete(&del),
        Err(DeleteError::Failed(_))
    ));
    assert!(root.has(&pv()));
}

#[test]
fn describe() {
    let info = HostPath::describe();
    assert_eq!(info.name, "hostpath");
    assert!(!info.supports_block);
}

#[test]
fn a_delete_on_another_node_than_the_volume_s_fails_and_keeps_the_directory() {
    let root = Root::new();
    let params = [
        ("guestRoot", root.s()),
        ("nodePath", "/n"),
        ("pvType", "local"),
    ];
    let mut req = provision_request(&params);
    req.selected_node = Some(node("n1"));
    req.context.node = Some("n1".into());
    let volume = HostPath::provision(&req).unwrap();
    let mut delete = delete_request(&req, &volume, &params);
    delete.context.node = Some("n2".into());
    let error = HostPath::delete(&delete).unwrap_err();
    assert!(
        matches!(&error, DeleteError::Failed(m) if m.contains("on node n1") && m.contains("runs on node n2")),
        "{error:?}"
    );
    assert!(root.has(&req.volume_name), "the directory must stay");
    delete.context.node = Some("n1".into());
    HostPath::delete(&delete).unwrap();
    assert!(!root.has(&req.volume_name));
}
