//! Plugin runtime benchmarks: one provision call (fresh store, instantiate, call) and
//! one should-provision call (the same without backend work) of the hostpath and
//! nfs-subdir plugins and of the Python and JavaScript example guests (quota-dir,
//! quota-dir-js), and loading each language's module cold (compile) versus from the
//! precompiled cache.
//!
//! Needs the built guests: `bash guests/build.sh` (or set WASM_PROVISIONER_GUESTS_DIR
//! to the directory holding hostpath.wasm, nfs-subdir.wasm, quota-dir.wasm and
//! quota-dir-js.wasm).
//! Run: `cargo bench -p wasm-provisioner --bench plugin`.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use wasm_provisioner_rules::types::{
    AccessMode, BindingMode, Claim, Class, ProvisionRequest, ReclaimPolicy, VolumeMode,
};
use wasm_provisioner_runtime::{Grants, Runtime, RuntimeConfig};

fn guests_dir() -> PathBuf {
    std::env::var_os("WASM_PROVISIONER_GUESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../guests/dist")))
}

fn request(parameters: &[(&str, &str)]) -> ProvisionRequest {
    ProvisionRequest {
        volume_name: "pvc-0b6e3d4e-3333-4c3a-9d7e-000000000003".into(),
        claim: Claim {
            name: "data".into(),
            namespace: "default".into(),
            uid: "0b6e3d4e-3333-4c3a-9d7e-000000000003".into(),
            labels: vec![],
            annotations: vec![],
            access_modes: vec![AccessMode::ReadWriteOnce],
            requested_bytes: 1 << 30,
            limit_bytes: None,
            volume_mode: VolumeMode::Filesystem,
            data_source: None,
            selector: None,
        },
        class: Class {
            name: "bench".into(),
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            reclaim_policy: ReclaimPolicy::Delete,
            mount_options: vec![],
            allowed_topologies: vec![],
            binding_mode: BindingMode::Immediate,
            allow_volume_expansion: false,
        },
        selected_node: None,
        secret: None,
        context: Default::default(),
    }
}

fn provision(c: &mut Criterion) {
    // Each module its own directory, side by side (overlapping read-write grants are
    // refused).
    let scratch = tempfile::tempdir().unwrap();
    let modules = ["hostpath", "nfs-subdir", "quota-dir", "quota-dir-js"];
    let mut grants = format!(
        "allow: {{ directories: [{root}] }}\nmodules:\n",
        root = scratch.path().display()
    );
    for (module, guest) in modules
        .iter()
        .zip(["/volumes", "/export", "/volumes", "/volumes"])
    {
        let dir = scratch.path().join(module);
        std::fs::create_dir(&dir).unwrap();
        grants.push_str(&format!(
            "  {module}: {{ directories: [{{ host: {}, guest: {guest}, mode: read-write }}] }}\n",
            dir.display()
        ));
    }
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        grants: Grants::from_yaml(&grants, "bench").unwrap(),
        cache_dir: None,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let mut group = c.benchmark_group("provision");
    for (name, parameters) in [
        ("hostpath", vec![("nodePath", "/var/lib/volumes")]),
        (
            "nfs-subdir",
            vec![("server", "nfs.example.com"), ("share", "/srv/nfs")],
        ),
        (
            "quota-dir",
            vec![("nodePath", "/var/lib/quota"), ("maxSize", "10Gi")],
        ),
        (
            "quota-dir-js",
            vec![("nodePath", "/var/lib/quota"), ("maxSize", "10Gi")],
        ),
    ] {
        let path = guests_dir().join(format!("{name}.wasm"));
        tokio.block_on(runtime.load_file(name, &path)).unwrap();
        let module = runtime.module(name).unwrap();
        let request = request(&parameters);
        // The call is idempotent by volume name: every iteration after the first finds
        // the volume made, as a controller retry would.
        let first = tokio.block_on(module.provision(&request)).unwrap();
        assert!(first.is_ok(), "{name}: {first:?}");
        group.bench_function(name, |b| {
            b.iter(|| tokio.block_on(module.provision(&request)).unwrap())
        });
        // The cost of a call itself: a fresh instance and an answer, no backend work.
        group.bench_function(format!("{name}/should-provision"), |b| {
            b.iter(|| assert!(tokio.block_on(module.should_provision(&request)).unwrap()))
        });
    }
    group.finish();
}

fn load(c: &mut Criterion) {
    // One module per language: compiling a Python or JavaScript component takes
    // seconds, so each group takes ten samples.
    for name in ["hostpath", "quota-dir", "quota-dir-js"] {
        load_module(c, name);
    }
}

fn load_module(c: &mut Criterion, name: &str) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let path = guests_dir().join(format!("{name}.wasm"));
    let bytes = std::fs::read(&path).unwrap();
    let mut group = c.benchmark_group(format!("load-{name}"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("cold-compile", |b| {
        b.iter(|| {
            let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
            tokio
                .block_on(runtime.load_bytes(name, bytes.clone()))
                .unwrap();
        })
    });
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        grants: Grants::none(),
        // The cache makes its own directory, private (0700), inside the scratch one.
        cache_dir: Some(cache.path().join("cache")),
        ..RuntimeConfig::default()
    };
    let warm = Runtime::new(config.clone()).unwrap();
    tokio
        .block_on(warm.load_bytes(name, bytes.clone()))
        .unwrap();
    group.bench_function("cached", |b| {
        b.iter(|| {
            let runtime = Runtime::new(config.clone()).unwrap();
            tokio
                .block_on(runtime.load_bytes(name, bytes.clone()))
                .unwrap();
            assert_eq!(runtime.metrics().cache_hits_total(), 1);
        })
    });
    group.finish();
}

criterion_group!(benches, provision, load);
criterion_main!(benches);
