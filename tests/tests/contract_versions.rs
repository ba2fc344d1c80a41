//! Contract 0.1 and 0.2 guests in one host: a 0.1 build keeps loading and working
//! unchanged beside a 0.2 guest, and the 0.2 optional capabilities (validate-class,
//! get-capacity, expand) answer through the runtime.

use std::path::Path;
use std::sync::Arc;

use wasm_provisioner_rules::types::{
    Capability, CapacityRequest, DeleteRequest, ExpandError, ExpandRequest, ProvisionRequest,
    PublishedVolume, Volume,
};
use wasm_provisioner_runtime::{ContractVersion, LoadedModule, Runtime};
use wasm_provisioner_tests::guests::{self, load, runtime};

/// A runtime granting modules `old` and `new` the directories `granted/old` and
/// `granted/new`, each at `/volumes`.
fn hostpath_runtime(granted: &Path) -> Runtime {
    let grant = |module: &str| {
        let dir = granted.join(module);
        std::fs::create_dir_all(&dir).unwrap();
        format!(
            "{{ directories: [{{ host: {}, guest: /volumes, mode: read-write }}] }}",
            dir.display()
        )
    };
    runtime(&format!(
        "allow: {{ directories: [{dir}] }}\nmodules: {{ old: {old}, new: {new} }}",
        dir = granted.display(),
        old = grant("old"),
        new = grant("new"),
    ))
}

async fn load_fixture(runtime: &Runtime, name: &str, fixture: &str) -> Arc<LoadedModule> {
    runtime
        .load_file(name, &guests::fixture(fixture))
        .await
        .unwrap_or_else(|error| panic!("loading fixture {fixture} as {name}: {error}"));
    runtime.module(name).expect("module in service")
}

const PARAMETERS: &[(&str, &str)] = &[("nodePath", "/var/lib/volumes"), ("maxSize", "1Gi")];

fn request(uid_tail: &str, parameters: &[(&str, &str)]) -> ProvisionRequest {
    let mut request = guests::provision_request(parameters);
    let uid = format!("0b6e3d4e-1111-4c3a-9d7e-{uid_tail:0>12}");
    request.volume_name = format!("pvc-{uid}");
    request.claim.uid = uid;
    request
}

fn published(request: &ProvisionRequest, volume: &Volume) -> PublishedVolume {
    PublishedVolume {
        name: request.volume_name.clone(),
        source: volume.source.clone(),
        capacity_bytes: volume.capacity_bytes,
        labels: volume.labels.clone(),
        annotations: volume.annotations.clone(),
        node_affinity: volume.node_affinity.clone(),
        claim_namespace: Some(request.claim.namespace.clone()),
        claim_name: Some(request.claim.name.clone()),
    }
}

fn delete_request(request: &ProvisionRequest, volume: &Volume) -> DeleteRequest {
    DeleteRequest {
        volume: published(request, volume),
        class_name: request.class.name.clone(),
        class_parameters: request.class.parameters.clone(),
        secret: None,
        context: Default::default(),
    }
}

#[tokio::test]
async fn a_0_1_guest_and_a_0_2_guest_serve_side_by_side() {
    let granted = tempfile::tempdir().unwrap();
    let runtime = hostpath_runtime(granted.path());
    let old = load_fixture(&runtime, "old", "hostpath-0.1.0").await;
    let new = load(&runtime, "new", "hostpath").await;

    assert_eq!(old.contract(), ContractVersion::V0_1);
    assert_eq!(new.contract(), ContractVersion::V0_2);
    assert!(old.info().capabilities.is_empty(), "{:?}", old.info());
    assert_eq!(new.info().capabilities, Capability::ALL, "{:?}", new.info());
    assert!(!old.has(Capability::Expand));
    assert!(new.has(Capability::Expand));

    // 0.1 has no maxSize parameter: each gets the parameters its version knows.
    for (module, tail, parameters) in [(&old, "1", &PARAMETERS[..1]), (&new, "2", PARAMETERS)] {
        let request = request(tail, parameters);
        assert!(module.should_provision(&request).await.unwrap());
        let volume = module
            .provision(&request)
            .await
            .expect("the call succeeds")
            .unwrap_or_else(|error| panic!("{} refused: {error:?}", module.name()));
        let dir = granted
            .path()
            .join(module.name())
            .join(&request.volume_name);
        assert!(dir.is_dir(), "{} made no {}", module.name(), dir.display());
        module
            .delete(&delete_request(&request, &volume))
            .await
            .expect("the call succeeds")
            .unwrap_or_else(|error| panic!("{} refused the delete: {error:?}", module.name()));
        assert!(!dir.exists(), "{} left {}", module.name(), dir.display());
    }
}

#[tokio::test]
async fn the_0_2_hostpath_validates_classes() {
    let granted = tempfile::tempdir().unwrap();
    let runtime = hostpath_runtime(granted.path());
    let new = load(&runtime, "new", "hostpath").await;

    let good = request("3", PARAMETERS).class;
    assert_eq!(new.validate_class(&good).await.unwrap(), Ok(()));
    for (parameters, expected) in [
        (
            vec![("nodepath", "/var/lib/volumes")],
            "unknown StorageClass parameter(s) nodepath",
        ),
        (vec![], "StorageClass parameter `nodePath` is required"),
        (
            vec![("nodePath", "/v"), ("maxSize", "lots")],
            "`maxSize` is \"lots\"",
        ),
        (
            vec![("nodePath", "/v"), ("pvType", "local")],
            "pvType local needs a node",
        ),
    ] {
        let class = request("3", &parameters).class;
        let verdict = new.validate_class(&class).await.expect("the call succeeds");
        match verdict {
            Err(message) => assert!(message.contains(expected), "{message}"),
            Ok(()) => panic!("{parameters:?} passed validation"),
        }
    }
}

/// The size of the filesystem holding `path`, as `statvfs` says.
fn filesystem_size(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `path` is a NUL-terminated string and `stats` a writable statvfs.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stats) }, 0);
    stats.f_blocks * stats.f_frsize
}

#[tokio::test]
async fn the_0_2_hostpath_reports_the_granted_filesystems_capacity() {
    let granted = tempfile::tempdir().unwrap();
    let runtime = hostpath_runtime(granted.path());
    let new = load(&runtime, "new", "hostpath").await;

    let capacity_request = |parameters: &[(&str, &str)]| CapacityRequest {
        class: request("4", parameters).class,
        node: None,
        context: Default::default(),
    };
    let capacity = new
        .get_capacity(&capacity_request(&[("nodePath", "/v")]))
        .await
        .expect("the call succeeds")
        .expect("hostpath answers");
    assert_eq!(
        capacity.total_bytes,
        filesystem_size(&granted.path().join("new"))
    );
    assert!(capacity.available_bytes <= capacity.total_bytes);
    assert!(capacity.available_bytes > 0);
    assert_eq!(capacity.maximum_volume_bytes, None);

    let bounded = new
        .get_capacity(&capacity_request(PARAMETERS))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bounded.maximum_volume_bytes, Some(1 << 30));

    // A guestRoot below the grant: the grant's filesystem.
    let below = new
        .get_capacity(&capacity_request(&[
            ("nodePath", "/v"),
            ("guestRoot", "/volumes/fast"),
        ]))
        .await
        .unwrap()
        .expect("a path inside the grant is measured");
    assert_eq!(below.total_bytes, capacity.total_bytes);

    // A guestRoot outside the grant: the host refuses to stat it, and says why.
    let outside = new
        .get_capacity(&capacity_request(&[
            ("nodePath", "/v"),
            ("guestRoot", "/etc"),
        ]))
        .await
        .unwrap();
    match outside {
        Err(message) => assert!(
            message.contains("not inside a directory granted to this module"),
            "{message}"
        ),
        Ok(capacity) => panic!("stat of an ungranted path answered {capacity:?}"),
    }
}

#[tokio::test]
async fn the_0_2_hostpath_expands_within_max_size_and_free_space() {
    let granted = tempfile::tempdir().unwrap();
    let runtime = hostpath_runtime(granted.path());
    let new = load(&runtime, "new", "hostpath").await;
    let request = request("5", PARAMETERS);
    let volume = new.provision(&request).await.unwrap().expect("provisioned");
    let expand = |requested_bytes: u64| ExpandRequest {
        volume: published(&request, &volume),
        class_name: request.class.name.clone(),
        class_parameters: request.class.parameters.clone(),
        requested_bytes,
        secret: None,
        context: Default::default(),
    };

    assert_eq!(new.expand(&expand(512 << 20)).await.unwrap(), Ok(512 << 20));
    match new.expand(&expand(2 << 30)).await.unwrap() {
        Err(ExpandError::Infeasible(message)) => {
            assert!(
                message.contains("more than the class's maxSize"),
                "{message}"
            )
        }
        other => panic!("an expansion past maxSize answered {other:?}"),
    }
    let mut unbounded = expand(u64::MAX / 2);
    unbounded.class_parameters = vec![("nodePath".into(), "/v".into())];
    match new.expand(&unbounded).await.unwrap() {
        Err(ExpandError::Infeasible(message)) => {
            assert!(
                message.contains("bytes free on the filesystem"),
                "{message}"
            )
        }
        other => panic!("an expansion past the free space answered {other:?}"),
    }
}
