//! What the host's integration tests share: the built guest components, WAT modules
//! made into components (and the skeleton of a hand-written one), and a provision
//! request.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use wasm_provisioner_rules::types::{
    AccessMode, BindingMode, Claim, Class, ProvisionRequest, ReclaimPolicy, VolumeMode,
};

/// The directory of built guest components: `guests/build.sh` (a no-op when warm)
/// builds them and prints it on its last line.
pub fn dist_dir() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("running guests/build.sh");
        assert!(
            output.status.success(),
            "guests/build.sh failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        PathBuf::from(
            stdout
                .trim()
                .lines()
                .last()
                .expect("build.sh prints the dist directory"),
        )
    })
}

/// Wraps a WAT core module into a `provisioner` component, against the repository's
/// WIT (the same world the host's bindings come from).
pub fn wat_component(wat: &str) -> Vec<u8> {
    let mut module = wat::parse_str(wat).unwrap_or_else(|e| panic!("invalid WAT: {e}\n{wat}"));
    let mut resolve = wit_parser::Resolve::default();
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/0.1.0");
    let (package, _) = resolve
        .push_dir(&wit)
        .unwrap_or_else(|e| panic!("cannot read {}: {e:#}", wit.display()));
    let world = resolve
        .select_world(&[package], Some("provisioner"))
        .expect("the provisioner world");
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .expect("component metadata");
    wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .unwrap_or_else(|e| panic!("the WAT module does not implement the world: {e:#}"))
}

/// A core module implementing the `provisioner` world by hand at the canonical-ABI
/// level, for guests a Rust guest cannot express: memory (`memory_pages`), a bump
/// `cabi_realloc` (the host lowers requests through it), a valid `describe` answer
/// naming the module `name`, and harmless `should-provision`, `should-delete` and
/// `delete`. `extra` adds the rest, `provision` at least. Make it a component with
/// [`wat_component`].
pub fn core_module(name: &str, memory_pages: u32, extra: &str) -> String {
    assert!(name.len() < 16, "the name must fit its data slot");
    format!(
        r#"(module
  (memory (export "memory") {memory_pages})
  (global $bump (mut i32) (i32.const 4096))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and
      (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
      (i32.sub (i32.const 0) (local.get 2))))
    (global.set $bump (i32.add (local.get $p) (local.get 3)))
    (if (i32.gt_u (global.get $bump) (i32.const 65536)) (then unreachable))
    (local.get $p))
  ;; plugin-info at 64: name (16, len), version (32, 1), supports-block 0, no kinds.
  (data (i32.const 16) "{name}")
  (data (i32.const 32) "1")
  (data (i32.const 64) "\10\00\00\00\{len:02x}\00\00\00\20\00\00\00\01\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00")
  (func (export "describe") (result i32) (i32.const 64))
  (func (export "should-provision") (param i32) (result i32) (i32.const 1))
  (func (export "should-delete") (param i32) (result i32) (i32.const 1))
  ;; result<_, delete-error> at 128: all zero, ok.
  (func (export "delete") (param i32) (result i32) (i32.const 128))
{extra}
)"#,
        len = name.len(),
    )
}

/// A provision request for a 1 MiB filesystem claim `default/data` of class `class`,
/// without parameters: what the runtime tests hand a module directly.
pub fn provision_request(class: &str) -> ProvisionRequest {
    ProvisionRequest {
        volume_name: "pvc-0b6e3d4e-1111-4c3a-9d7e-000000000009".into(),
        claim: Claim {
            name: "data".into(),
            namespace: "default".into(),
            uid: "0b6e3d4e-1111-4c3a-9d7e-000000000009".into(),
            labels: vec![],
            annotations: vec![],
            access_modes: vec![AccessMode::ReadWriteOnce],
            requested_bytes: 1 << 20,
            limit_bytes: None,
            volume_mode: VolumeMode::Filesystem,
            data_source: None,
            selector: None,
        },
        class: Class {
            name: class.into(),
            parameters: vec![],
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

/// The interfaces a component exports, by their full names
/// (`wasm-provisioner:plugin/provisioner@0.2.0`), sorted; functions exported at the root
/// as `fn NAME`.
pub fn component_exports(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let wit_component::DecodedWasm::Component(resolve, world) =
        wit_component::decode(&bytes).expect("a component")
    else {
        panic!("{} is not a component", path.display());
    };
    let mut names: Vec<String> = resolve.worlds[world]
        .exports
        .iter()
        .map(|(key, item)| match (key, item) {
            (wit_parser::WorldKey::Interface(id), _) => {
                resolve.id_of(*id).unwrap_or_else(|| format!("{id:?}"))
            }
            (wit_parser::WorldKey::Name(name), wit_parser::WorldItem::Function(_)) => {
                format!("fn {name}")
            }
            (wit_parser::WorldKey::Name(name), _) => name.clone(),
        })
        .collect();
    names.sort();
    names
}
