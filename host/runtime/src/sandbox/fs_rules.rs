//! What the sandbox refuses in a granted directory beyond WASI's own rules: creating a
//! symlink, and moving or linking anything **into the top level of a grant from below
//! it**.
//!
//! WASI keeps a guest inside its grants, but kubelet, the host and node tools also read
//! those directories, with the node's authority, and follow symlinks. A grant's top
//! level is where a module's volumes live (`<grant>/<pv name>`, published as
//! `<pathPrefix>/<pv name>`), and only the module writes there; a tenant writes only
//! inside their own volume, below it. So the top level must never hold a symlink:
//!
//! - `symlink-at` always answers `not-permitted` (a provisioner needs no symlinks).
//! - `rename-at` and `link-at` whose destination lies directly in a grant's root must
//!   take their source from directly in a grant's root too. Otherwise a module could
//!   move a tenant's `escape -> /` (made inside the tenant's volume, where the tenant
//!   may make anything) up to `<grant>/pvc-<uid>` and publish the node's `/`.
//!   Everything else (into a volume, into a trash directory, between top-level names)
//!   is allowed as before.
//!
//! The rule needs no race-prone check of what the source is: both parents are opened
//! beneath their descriptors (as WASI resolves paths), compared by identity (device and
//! inode) with the grants' roots, and the rename or link is then made relative to
//! those opened parents, so nothing renamed meanwhile on the way can redirect it. The
//! final components are never followed (rename and link act on the entry itself).
//! By induction the top level holds only what the module made there itself:
//! directories and files, never a link.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::AtFlags;
use rustix::io::Errno;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, PathFlags};

use super::GuestState;
use crate::grants::directories::{GrantRoots, file_id};

/// The WASI filesystem interface version wasmtime-wasi 48 provides (guests importing
/// any 0.2.x version are matched to it).
const WASI_FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Replaces `descriptor.symlink-at`, `descriptor.rename-at` and `descriptor.link-at`
/// with the guarded versions of this module.
pub(crate) fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(WASI_FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |_store, (_dir, _target, _link): (Resource<Descriptor>, String, String)| {
            Box::new(async { Ok((Err::<(), ErrorCode>(ErrorCode::NotPermitted),)) })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.rename-at",
        |store,
         (dir, old_path, new_dir, new_path): (
            Resource<Descriptor>,
            String,
            Resource<Descriptor>,
            String,
        )| {
            let result = move_entry(
                store.data(),
                Move::Rename,
                &dir,
                &old_path,
                &new_dir,
                &new_path,
            );
            Box::new(async move { Ok((result,)) })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |store,
         (dir, flags, old_path, new_dir, new_path): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            let state = store.data();
            // As WASI: a hard link of what a symlink points to is not offered.
            let result = if flags.contains(PathFlags::SYMLINK_FOLLOW) {
                Err(ErrorCode::Invalid)
            } else {
                move_entry(state, Move::Link, &dir, &old_path, &new_dir, &new_path)
            };
            Box::new(async move { Ok((result,)) })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Rename,
    Link,
}

/// `rename-at` or `link-at` from `old_path` beneath `dir` to `new_path` beneath
/// `new_dir`, under the top-level rule.
fn move_entry(
    state: &GuestState,
    kind: Move,
    dir: &Resource<Descriptor>,
    old_path: &str,
    new_dir: &Resource<Descriptor>,
    new_path: &str,
) -> Result<(), ErrorCode> {
    let directory = |resource: &Resource<Descriptor>| match state.table().get(resource) {
        Ok(Descriptor::Dir(dir)) => Ok(dir.clone()),
        Ok(Descriptor::File(_)) => Err(ErrorCode::NotDirectory),
        Err(_) => Err(ErrorCode::BadDescriptor),
    };
    let (from, to) = (directory(dir)?, directory(new_dir)?);
    // WASI's own permission rules, unchanged.
    if from.perms == FsPerms::ReadOnly || to.perms == FsPerms::ReadOnly || from.perms != to.perms {
        return Err(ErrorCode::NotPermitted);
    }
    let outcome = move_beneath(
        kind,
        state.grant_roots(),
        from.dir.as_fd(),
        old_path,
        to.dir.as_fd(),
        new_path,
    );
    if let Err(Refusal::IntoTopLevel) = outcome {
        state.log_refusal(&format!(
            "{} of {old_path:?} to {new_path:?} refused: nothing may be moved or linked into the top level of a granted directory from below it (a tenant's symlink there would be published as a volume)",
            match kind {
                Move::Rename => "rename",
                Move::Link => "hard link",
            }
        ));
    }
    outcome.map_err(Refusal::code)
}

/// Why a move was not made.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// The destination is a grant's top level and the source is not.
    IntoTopLevel,
    /// The system call (or opening a parent) failed.
    Errno(Errno),
    /// A path WASI would not resolve (absolute, empty, ending in `.` or `..`).
    Invalid,
}

impl Refusal {
    fn code(self) -> ErrorCode {
        match self {
            Refusal::IntoTopLevel => ErrorCode::NotPermitted,
            Refusal::Invalid => ErrorCode::Invalid,
            Refusal::Errno(errno) => error_code(errno),
        }
    }
}

/// The move itself: both parents opened beneath their directories, the top-level rule
/// checked on the opened parents, then `renameat`/`linkat` relative to them.
fn move_beneath(
    kind: Move,
    roots: &GrantRoots,
    from: BorrowedFd<'_>,
    old_path: &str,
    to: BorrowedFd<'_>,
    new_path: &str,
) -> Result<(), Refusal> {
    let (old_parent, old_name) = split(old_path)?;
    let (new_parent, new_name) = split(new_path)?;
    let old_parent = open_parent(from, old_parent)?;
    let new_parent = open_parent(to, new_parent)?;
    let id = |fd: BorrowedFd<'_>| file_id(fd).map_err(Refusal::Errno);
    if roots.is_root(id(new_parent.as_fd())?) && !roots.is_root(id(old_parent.as_fd())?) {
        return Err(Refusal::IntoTopLevel);
    }
    match kind {
        Move::Rename => rustix::fs::renameat(&old_parent, old_name, &new_parent, new_name),
        Move::Link => rustix::fs::linkat(
            &old_parent,
            old_name,
            &new_parent,
            new_name,
            AtFlags::empty(),
        ),
    }
    .map_err(Refusal::Errno)
}

/// A directory opened beneath another, or the other itself.
enum Parent<'a> {
    Same(BorrowedFd<'a>),
    Opened(std::fs::File),
}

impl AsFd for Parent<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Parent::Same(fd) => *fd,
            Parent::Opened(file) => file.as_fd(),
        }
    }
}

/// Opens `path` beneath `start` as WASI resolves it (symlinks inside followed, never
/// leaving `start`); an empty path is `start` itself.
fn open_parent<'a>(start: BorrowedFd<'a>, path: &str) -> Result<Parent<'a>, Refusal> {
    if path.is_empty() {
        return Ok(Parent::Same(start));
    }
    let start = std::fs::File::from(start.try_clone_to_owned().map_err(errno_of)?);
    cap_primitives::fs::open_dir(&start, Path::new(path))
        .map(Parent::Opened)
        .map_err(errno_of)
}

/// The errno of a failed open; cap-std's own refusals (a path climbing out of its
/// start with `..` or an absolute symlink) carry none and are `not-permitted`, as WASI
/// answers them.
fn errno_of(error: std::io::Error) -> Refusal {
    Refusal::Errno(match error.raw_os_error() {
        Some(code) => Errno::from_raw_os_error(code),
        None => match error.kind() {
            std::io::ErrorKind::PermissionDenied => Errno::PERM,
            std::io::ErrorKind::NotFound => Errno::NOENT,
            _ => Errno::IO,
        },
    })
}

/// `a/b/c` is (`a/b`, `c`); `c` is (``, `c`). Trailing slashes are dropped (renaming
/// `dir/` is renaming `dir`). A last component of `.` or `..`, an empty or an absolute
/// path is refused as WASI refuses it.
fn split(path: &str) -> Result<(&str, &str), Refusal> {
    if path.starts_with('/') {
        return Err(Refusal::Errno(Errno::PERM));
    }
    let path = path.trim_end_matches('/');
    let (parent, name) = match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", path),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(Refusal::Invalid);
    }
    Ok((parent, name))
}

/// The WASI error for an errno of a rename or link.
fn error_code(errno: Errno) -> ErrorCode {
    match errno {
        Errno::ACCESS => ErrorCode::Access,
        Errno::PERM => ErrorCode::NotPermitted,
        Errno::NOENT => ErrorCode::NoEntry,
        Errno::EXIST => ErrorCode::Exist,
        Errno::NOTEMPTY => ErrorCode::NotEmpty,
        Errno::XDEV => ErrorCode::CrossDevice,
        Errno::ISDIR => ErrorCode::IsDirectory,
        Errno::NOTDIR => ErrorCode::NotDirectory,
        Errno::BUSY => ErrorCode::Busy,
        Errno::INVAL => ErrorCode::Invalid,
        Errno::LOOP => ErrorCode::Loop,
        Errno::NAMETOOLONG => ErrorCode::NameTooLong,
        Errno::NOSPC => ErrorCode::InsufficientSpace,
        Errno::DQUOT => ErrorCode::Quota,
        Errno::ROFS => ErrorCode::ReadOnly,
        Errno::MLINK => ErrorCode::TooManyLinks,
        Errno::BADF => ErrorCode::BadDescriptor,
        Errno::NOMEM => ErrorCode::InsufficientMemory,
        _ => ErrorCode::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn roots_of(dirs: &[&Path]) -> GrantRoots {
        GrantRoots::for_tests(dirs)
    }

    fn open(dir: &Path) -> std::fs::File {
        std::fs::File::open(dir).unwrap()
    }

    #[test]
    fn nothing_moves_into_the_top_level_from_below() {
        let grant = tempfile::tempdir().unwrap();
        let root = grant.path();
        std::fs::create_dir_all(root.join("pvc-tenant/sub")).unwrap();
        symlink("/", root.join("pvc-tenant/escape")).unwrap();
        symlink("..", root.join("pvc-tenant/up")).unwrap();
        let roots = roots_of(&[root]);
        let fd = open(root);
        let sub = open(&root.join("pvc-tenant"));
        for kind in [Move::Rename, Move::Link] {
            for (start, old, new, refusal) in [
                (&fd, "pvc-tenant/escape", "pvc-x", Refusal::IntoTopLevel),
                // Through a tenant's `up -> ..` inside its volume, the parent is the root.
                (
                    &fd,
                    "pvc-tenant/escape",
                    "pvc-tenant/up/pvc-x",
                    Refusal::IntoTopLevel,
                ),
                (
                    &fd,
                    "pvc-tenant/sub",
                    "pvc-tenant/sub/../../pvc-x",
                    Refusal::IntoTopLevel,
                ),
                // From a subdirectory's descriptor, `..` cannot climb out of it (as in WASI).
                (&sub, "escape", "../pvc-x", Refusal::Errno(Errno::PERM)),
            ] {
                assert_eq!(
                    move_beneath(kind, &roots, start.as_fd(), old, start.as_fd(), new),
                    Err(refusal),
                    "{kind:?} {old} -> {new}"
                );
            }
        }
        assert!(std::fs::symlink_metadata(root.join("pvc-x")).is_err());
    }

    #[test]
    fn moves_the_provisioners_make_still_work() {
        let grant = tempfile::tempdir().unwrap();
        let root = grant.path();
        std::fs::create_dir_all(root.join("pvc-a/deep")).unwrap();
        std::fs::create_dir_all(root.join(".trash")).unwrap();
        let roots = roots_of(&[root]);
        let fd = open(root);
        // Top level to top level (archive), top level into the trash, within a volume,
        // and out of a volume into the trash.
        move_beneath(
            Move::Rename,
            &roots,
            fd.as_fd(),
            "pvc-a",
            fd.as_fd(),
            "archived-pvc-a",
        )
        .unwrap();
        move_beneath(
            Move::Rename,
            &roots,
            fd.as_fd(),
            "archived-pvc-a",
            fd.as_fd(),
            ".trash/pvc-a",
        )
        .unwrap();
        move_beneath(
            Move::Rename,
            &roots,
            fd.as_fd(),
            ".trash/pvc-a/deep",
            fd.as_fd(),
            ".trash/pvc-a/.hoisted-1",
        )
        .unwrap();
        assert!(root.join(".trash/pvc-a/.hoisted-1").is_dir());
        // Within a volume, a tenant's symlink may move (the tenant could do it too).
        symlink("/", root.join(".trash/pvc-a/link")).unwrap();
        move_beneath(
            Move::Rename,
            &roots,
            fd.as_fd(),
            ".trash/pvc-a/link",
            fd.as_fd(),
            ".trash/pvc-a/.hoisted-1/link",
        )
        .unwrap();
        std::fs::write(root.join("file"), b"x").unwrap();
        move_beneath(Move::Link, &roots, fd.as_fd(), "file", fd.as_fd(), "file2").unwrap();
        assert!(root.join("file2").is_file());
    }

    #[test]
    fn a_second_grant_s_top_level_is_protected_too() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir_all(a.path().join("pvc-t")).unwrap();
        symlink("/", a.path().join("pvc-t/escape")).unwrap();
        let roots = roots_of(&[a.path(), b.path()]);
        let (fa, fb) = (open(a.path()), open(b.path()));
        assert_eq!(
            move_beneath(
                Move::Rename,
                &roots,
                fa.as_fd(),
                "pvc-t/escape",
                fb.as_fd(),
                "pvc-x"
            ),
            Err(Refusal::IntoTopLevel)
        );
    }

    #[test]
    fn paths_wasi_would_not_resolve_are_refused() {
        assert_eq!(split("/abs"), Err(Refusal::Errno(Errno::PERM)));
        assert_eq!(split(""), Err(Refusal::Invalid));
        assert_eq!(split("a/.."), Err(Refusal::Invalid));
        assert_eq!(split("a/b/"), Ok(("a", "b")));
        assert_eq!(split("c"), Ok(("", "c")));
    }
}
