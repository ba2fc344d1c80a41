//! Owner markers: which volume a directory on the share belongs to.
//!
//! `pathPattern` lets claims choose their directory (`${.PVC.annotations.x}`), and a
//! namespace and name can be reused, so two claims can expand to the same directory, or
//! one to a directory inside another's. Sharing it would let one tenant read the
//! other's data, and deleting one would delete the other's. So every volume directory
//! `<parent>/<base>` has a marker file `<parent>/.wasm-provisioner-owners/<base>` naming
//! its PV and claim UID, and:
//!
//! - provision makes a directory only where nothing exists, claiming it with the marker
//!   first (an exclusive hard link, so two racing claims cannot both win); an existing
//!   directory is reused only when its marker names this PV (idempotency); a path inside
//!   another volume's directory is refused;
//! - delete and archive act only on a directory whose marker names the PV.
//!
//! The marker is a sibling, not a file inside the volume: the pod never sees it (many
//! images refuse a non-empty data directory, such as PostgreSQL's `initdb`), and a
//! tenant cannot edit or remove it (it writes only inside its own directory; nesting is
//! refused). Claims cannot produce a path component starting with `.wasm-provisioner`
//! (refused in `plan`), so no volume can be a marker or the owners directory.

use std::fs;
use std::io::ErrorKind;
use wasm_provisioner_sdk::path;

/// The directory, beside volume directories, holding their markers.
pub const OWNERS: &str = ".wasm-provisioner-owners";

/// Path components starting with this are reserved for the plugin's own files.
pub const RESERVED_PREFIX: &str = ".wasm-provisioner";

/// Who a directory belongs to, according to its marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No marker: not a volume of this plugin (or made before markers existed).
    None,
    /// The marker names this PV.
    Volume(String),
    /// A marker that cannot be read as one (not a regular file, no `volume:` line).
    Unreadable(String),
}

/// `rel` split into its parent (relative to the root, `""` for the root) and last
/// component.
pub fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// The marker of the directory `root/rel`, as a guest path.
pub fn marker_path(root: &str, rel: &str) -> String {
    let (parent, base) = split(rel);
    path::join(&path::join(&path::join(root, parent), OWNERS), base)
}

/// The marker of `root/rel` relative to the root (for messages and the PV annotation).
pub fn marker_rel(rel: &str) -> String {
    let (parent, base) = split(rel);
    path::join(&path::join(parent, OWNERS), base)
}

/// What a marker says, for a volume `volume` of the claim `uid` (`namespace/name`).
pub fn marker_text(volume: &str, uid: &str, claim: &str) -> String {
    format!(
        "# wasm-provisioner nfs-subdir: the directory of this name beside {OWNERS} is this volume's.\n\
         # Delete only with the directory. Do not edit.\n\
         volume: {volume}\n\
         claim-uid: {uid}\n\
         claim: {claim}\n"
    )
}

/// The PV named by a marker's text.
pub fn parse_marker(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|line| line.strip_prefix("volume:"))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Reads the marker of `root/rel`.
pub fn owner(root: &str, rel: &str) -> Result<Owner, String> {
    let marker = marker_path(root, rel);
    match fs::symlink_metadata(&marker) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Owner::None),
        Err(e) => return Err(format!("checking the owner marker {marker}: {e}")),
        Ok(m) if !m.is_file() => {
            return Ok(Owner::Unreadable(format!("{marker} is not a regular file")));
        }
        Ok(_) => {}
    }
    let text = fs::read_to_string(&marker)
        .map_err(|e| format!("reading the owner marker {marker}: {e}"))?;
    Ok(match parse_marker(&text) {
        Some(volume) => Owner::Volume(volume.to_string()),
        None => Owner::Unreadable(format!("{marker} names no volume")),
    })
}

/// Whether any proper ancestor of `rel` (below the root) is a volume directory: a
/// volume inside another would share its data and be deleted with it.
pub fn inside_a_volume(root: &str, rel: &str) -> Result<Option<String>, String> {
    let mut ancestor = String::new();
    let (parent, _) = split(rel);
    if parent.is_empty() {
        return Ok(None);
    }
    for component in parent.split('/') {
        ancestor = if ancestor.is_empty() {
            component.to_string()
        } else {
            path::join(&ancestor, component)
        };
        if owner(root, &ancestor)? != Owner::None {
            return Ok(Some(ancestor));
        }
    }
    Ok(None)
}

/// Claims `root/rel` for `volume` by creating its marker, atomically and exclusively:
/// the text goes to a temporary file beside it (a name no volume can have: reserved
/// prefix), which is then hard-linked as the marker (a link fails if the marker exists:
/// two racing claims cannot both win). Answers the owner found if the marker already
/// existed.
pub fn claim(root: &str, rel: &str, volume: &str, text: &str) -> Result<Option<Owner>, String> {
    let (parent, _) = split(rel);
    let owners = path::join(&path::join(root, parent), OWNERS);
    create_plain_dir(&owners)?;
    let staging = path::join(&owners, &format!("{RESERVED_PREFIX}-tmp-{volume}"));
    fs::write(&staging, text).map_err(|e| format!("writing {staging}: {e}"))?;
    let marker = marker_path(root, rel);
    let linked = fs::hard_link(&staging, &marker);
    let _ = fs::remove_file(&staging);
    match linked {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => owner(root, rel).map(Some),
        Err(e) => Err(format!("creating the owner marker {marker}: {e}")),
    }
}

/// Removes the marker of `root/rel` (missing is fine).
pub fn release(root: &str, rel: &str) -> Result<(), String> {
    let marker = marker_path(root, rel);
    match fs::remove_file(&marker) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing the owner marker {marker}: {e}")),
    }
}

/// Gives the marker of `root/rel` to `root/to_rel` as well (a hard link; an existing
/// marker there naming the same volume is fine).
pub fn copy_to(root: &str, rel: &str, to_rel: &str, volume: &str) -> Result<(), String> {
    let (to_parent, _) = split(to_rel);
    create_plain_dir(&path::join(&path::join(root, to_parent), OWNERS))?;
    let (from, to) = (marker_path(root, rel), marker_path(root, to_rel));
    match fs::hard_link(&from, &to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match owner(root, to_rel)? {
            Owner::Volume(v) if v == volume => Ok(()),
            _ => Err(format!("{to} exists and names another volume")),
        },
        Err(e) => Err(format!("marking {}: {e}", path::join(root, to_rel))),
    }
}

/// Creates a directory (an existing one is fine; a symbolic link or a file is not).
fn create_plain_dir(dir: &str) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(format!("{dir} is not a directory")),
            Err(e) => Err(format!("checking {dir}: {e}")),
        },
        Err(e) => Err(format!("creating directory {dir}: {e}")),
    }
}
