//! Granted directories, opened once.
//!
//! A directory grant is a path in the admin's grants file, but what a guest gets is the
//! directory that path named **when the runtime started**: each granted directory is
//! opened once, walking from `/` one component at a time with
//! `O_PATH | O_DIRECTORY | O_NOFOLLOW` (so no symlink is followed anywhere on the way,
//! and a grant that is or goes through a symlink is refused at start, naming the module
//! and the path). Every call's WASI preopens are clones of those open handles; no call
//! looks a granted path up again. So whoever can write near a grant (another module
//! with a read-write grant of a parent directory, the guest itself inside its own
//! grant, any other process) can rename the directory or put a symlink in its place,
//! and the guest still sees exactly the directory it was granted, never what the path
//! names now.
//!
//! wasmtime-wasi 48 has no public API to preopen an already-open directory: its
//! `WasiCtxBuilder::preopened_dir` takes a path. The runtime therefore gives it
//! `/proc/self/fd/N`, N being the handle it opened: that "magic link" resolves to the
//! open file description of our own descriptor (the same directory inode), not to a
//! path, so nothing outside this process can redirect it, and wasmtime's own
//! `O_PATH | O_DIRECTORY` open of it yields a second handle to the same directory. That
//! is done once per module at start; the resulting `WasiFilesystemCtx` (public and
//! `Clone`, its directories behind `Arc`s) is then cloned into each call's `WasiCtx`,
//! so a call does no filesystem work to set up its preopens.
//!
//! A granted directory missing at start is not fatal (a node directory may be created
//! later): making the module's sandbox fails with an error naming it (so its version is
//! refused at load, and the runtime tries again at the next scan), and each attempt
//! opens it again, with the same checks, until it exists; from then on it is kept.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;
use wasmtime_wasi::filesystem::WasiFilesystemCtx;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::volumes::VolumeDirectory;
use super::{DirectoryGrant, DirectoryMode, Grants};

/// Why a granted directory cannot be handed to a module.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "module {module}: the granted directory {host} (guest path {guest}) cannot be used: {reason}"
)]
pub struct GrantDirectoryError {
    pub module: String,
    pub host: PathBuf,
    pub guest: String,
    /// Boxed: errors travel in `Result`s, and this one is big.
    pub reason: Box<GrantDirectoryProblem>,
}

/// What is wrong with a granted directory.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrantDirectoryProblem {
    #[error(
        "{at} is a symlink (to {target}); a grant is opened without following symlinks, so \
         that nobody can redirect it later: grant the real directory{}",
        real.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default()
    )]
    Symlink {
        at: PathBuf,
        target: String,
        real: Option<PathBuf>,
    },
    #[error("{at} is not a directory")]
    NotADirectory { at: PathBuf },
    #[error(
        "{at} does not exist; create it (the module's calls fail until it does, and use it \
         from the first call that finds it)"
    )]
    Missing { at: PathBuf },
    #[error("the path is not absolute and normal (no `.` or `..`)")]
    NotNormal,
    #[error("cannot open {at}: {errno}")]
    Open { at: PathBuf, errno: Errno },
    #[error(
        "cannot hand the open directory to WASI through /proc/self/fd (is /proc mounted?): {cause}"
    )]
    Reopen { cause: String },
}

/// The granted directories of every module, opened at start.
pub(crate) struct GrantedDirectories {
    modules: BTreeMap<String, Arc<ModuleDirectories>>,
    none: Arc<ModuleDirectories>,
}

impl GrantedDirectories {
    /// Opens every granted directory of `grants`. A directory that is, or goes through,
    /// a symlink, or is not a directory, is an error; a missing one is logged and
    /// retried by the module's calls.
    pub(crate) fn open(grants: &Grants) -> Result<Self, GrantDirectoryError> {
        let mut modules = BTreeMap::new();
        for (module, module_grants) in &grants.modules {
            let directories = ModuleDirectories {
                module: module.clone(),
                grants: module_grants.directories.clone(),
                opened: Mutex::new(None),
            };
            match directories.open_all() {
                Ok(open) => {
                    *directories.lock() = Some(open);
                }
                Err(error) if matches!(*error.reason, GrantDirectoryProblem::Missing { .. }) => {
                    tracing::warn!("{error}")
                }
                Err(error) => return Err(error),
            }
            modules.insert(module.clone(), Arc::new(directories));
        }
        Ok(GrantedDirectories {
            modules,
            none: Arc::new(ModuleDirectories {
                module: String::new(),
                grants: Vec::new(),
                opened: Mutex::new(Some(Opened {
                    filesystem: WasiFilesystemCtx::default(),
                    roots: GrantRoots::default(),
                })),
            }),
        })
    }

    /// The directories of `module` (none, for a module the grants do not name).
    pub(crate) fn for_module(&self, module: &str) -> Arc<ModuleDirectories> {
        self.modules.get(module).unwrap_or(&self.none).clone()
    }
}

/// One module's granted directories, open.
pub(crate) struct ModuleDirectories {
    module: String,
    grants: Vec<DirectoryGrant>,
    /// The preopens, once every granted directory was opened.
    opened: Mutex<Option<Opened>>,
}

/// A module's granted directories once all are open.
#[derive(Clone)]
pub(crate) struct Opened {
    /// What a call's `WasiCtx` gets: the preopens.
    pub(crate) filesystem: WasiFilesystemCtx,
    /// Each grant's root: what the sandbox's rename and link rules and the publish
    /// check compare with.
    pub(crate) roots: GrantRoots,
}

/// The granted directories of one module, by guest path: the open handle and the
/// identity (device, inode) of each.
#[derive(Clone, Default)]
pub(crate) struct GrantRoots {
    roots: Arc<BTreeMap<String, (Arc<OwnedFd>, FileId)>>,
}

/// A directory's identity: device and inode.
pub(crate) type FileId = (u64, u64);

impl GrantRoots {
    /// Whether `id` is the root of one of the grants.
    pub(crate) fn is_root(&self, id: FileId) -> bool {
        self.roots.values().any(|(_, root)| *root == id)
    }

    /// The open root of the grant the guest sees at `guest`.
    pub(crate) fn handle(&self, guest: &str) -> Option<&OwnedFd> {
        self.roots.get(guest).map(|(fd, _)| fd.as_ref())
    }

    /// The guest paths of the grants.
    pub(crate) fn guest_paths(&self) -> Vec<&str> {
        self.roots.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
impl GrantRoots {
    /// The grants rooted at `dirs` (guest paths `/0`, `/1`, ...).
    pub(crate) fn for_tests(dirs: &[&Path]) -> Self {
        let roots = dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| {
                let fd = open_without_symlinks(dir).expect("a test directory");
                let id = file_id(&fd).expect("fstat");
                (format!("/{i}"), (Arc::new(fd), id))
            })
            .collect();
        GrantRoots {
            roots: Arc::new(roots),
        }
    }
}

/// The identity of an open file.
pub(crate) fn file_id(fd: impl AsFd) -> Result<FileId, Errno> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

impl std::fmt::Debug for ModuleDirectories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleDirectories")
            .field("module", &self.module)
            .field("grants", &self.grants)
            .field("open", &self.lock().is_some())
            .finish()
    }
}

impl ModuleDirectories {
    /// The preopens of one call: the handles opened at start (or, if a directory was
    /// missing then, at the first call that found them all).
    pub(crate) fn opened(&self) -> Result<Opened, GrantDirectoryError> {
        let mut opened = self.lock();
        if let Some(open) = &*opened {
            return Ok(open.clone());
        }
        let open = self.open_all()?;
        tracing::info!(
            module = %self.module,
            "every granted directory now exists and is open; the module's calls can run"
        );
        *opened = Some(open.clone());
        Ok(open)
    }

    /// Whether `volume.name` in the grant the guest sees at `volume.directory` may be
    /// published as a node path: a directory (or nothing yet, for kubelet to create),
    /// never a symlink or another kind of file. Looked up relative to the handle opened
    /// at start, without following anything.
    pub(crate) fn check_volume_directory(&self, volume: &VolumeDirectory) -> Result<(), String> {
        let opened = self.opened().map_err(|error| error.to_string())?;
        let handle = opened.roots.handle(&volume.directory).ok_or_else(|| {
            format!(
                "the module has no directory grant at {} to check it in",
                volume.directory
            )
        })?;
        let at = format!("{}/{}", volume.directory, volume.name);
        match rustix::fs::statat(handle, volume.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => Ok(()),
                FileType::Symlink => Err(format!(
                    "its directory ({at} as the module sees it) is a symlink, which kubelet would follow on the node"
                )),
                other => Err(format!(
                    "its directory ({at} as the module sees it) is not a directory but a {other:?}"
                )),
            },
            Err(Errno::NOENT) => Ok(()),
            Err(errno) => Err(format!("cannot check its directory ({at}): {errno}")),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Opened>> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open_all(&self) -> Result<Opened, GrantDirectoryError> {
        let mut roots = BTreeMap::new();
        let mut builder = WasiCtxBuilder::new();
        // A call runs on a blocking thread of its own (`LoadedModule::invoke`), so its
        // filesystem operations run inline there instead of each handing off to
        // another blocking thread (the flag is kept by each preopened directory).
        builder.allow_blocking_current_thread(true);
        for grant in &self.grants {
            let error = |reason| GrantDirectoryError {
                module: self.module.clone(),
                host: grant.host.clone(),
                guest: grant.guest.clone(),
                reason: Box::new(reason),
            };
            let directory = open_without_symlinks(&grant.host).map_err(error)?;
            let perms = match grant.mode {
                DirectoryMode::ReadOnly => FsPerms::ReadOnly,
                DirectoryMode::ReadWrite => FsPerms::ReadWrite,
            };
            // See the module docs: the magic link names our open directory, not a path.
            let handle = format!("/proc/self/fd/{}", directory.as_raw_fd());
            builder
                .preopened_dir(&handle, &grant.guest, perms)
                .map_err(|e| {
                    error(GrantDirectoryProblem::Reopen {
                        cause: format!("{e:#}"),
                    })
                })?;
            let id = file_id(&directory).map_err(|errno| {
                error(GrantDirectoryProblem::Open {
                    at: grant.host.clone(),
                    errno,
                })
            })?;
            roots.insert(grant.guest.clone(), (Arc::new(directory), id));
        }
        Ok(Opened {
            filesystem: builder.build().filesystem().clone(),
            roots: GrantRoots {
                roots: Arc::new(roots),
            },
        })
    }
}

/// Opens the absolute directory `path` without following a symlink on any component.
fn open_without_symlinks(path: &Path) -> Result<OwnedFd, GrantDirectoryProblem> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if !path.is_absolute() {
        return Err(GrantDirectoryProblem::NotNormal);
    }
    let root = Path::new("/");
    let mut directory = rustix::fs::openat(CWD, root, flags, Mode::empty()).map_err(|errno| {
        GrantDirectoryProblem::Open {
            at: root.into(),
            errno,
        }
    })?;
    let mut at = root.to_path_buf();
    for component in path.components() {
        let name = match component {
            Component::RootDir => continue,
            Component::Normal(name) => name,
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(GrantDirectoryProblem::NotNormal);
            }
        };
        at.push(name);
        let next = rustix::fs::openat(&directory, name, flags, Mode::empty())
            .map_err(|errno| diagnose(&directory, name, &at, path, errno))?;
        // `O_DIRECTORY | O_NOFOLLOW` already refuses a symlink; check the opened inode
        // anyway, so a refusal never depends on a flag combination's fine print.
        let kind = rustix::fs::fstat(&next)
            .map(|stat| FileType::from_raw_mode(stat.st_mode))
            .map_err(|errno| GrantDirectoryProblem::Open {
                at: at.clone(),
                errno,
            })?;
        if kind != FileType::Directory {
            return Err(diagnose(&directory, name, &at, path, Errno::NOTDIR));
        }
        directory = next;
    }
    Ok(directory)
}

/// Says why `name` in `parent` (the path `at`) could not be opened as a directory.
fn diagnose(
    parent: impl AsFd,
    name: &std::ffi::OsStr,
    at: &Path,
    granted: &Path,
    errno: Errno,
) -> GrantDirectoryProblem {
    let at = at.to_path_buf();
    match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => GrantDirectoryProblem::Symlink {
                target: rustix::fs::readlinkat(&parent, name, Vec::new())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|e| format!("unreadable: {e}")),
                real: granted.canonicalize().ok(),
                at,
            },
            FileType::Directory => GrantDirectoryProblem::Open { at, errno },
            _ => GrantDirectoryProblem::NotADirectory { at },
        },
        Err(Errno::NOENT) => GrantDirectoryProblem::Missing { at },
        Err(errno) => GrantDirectoryProblem::Open { at, errno },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_a_real_directory_and_refuses_symlinks_on_the_way() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("real/inner");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink("real", root.path().join("link")).unwrap();

        let opened = open_without_symlinks(&real).unwrap();
        let stat = rustix::fs::fstat(&opened).unwrap();
        let expected = std::fs::metadata(&real).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!((stat.st_dev, stat.st_ino), (expected.dev(), expected.ino()));

        for through in ["link", "link/inner"] {
            match open_without_symlinks(&root.path().join(through)) {
                Err(GrantDirectoryProblem::Symlink { at, target, real }) => {
                    assert_eq!(at, root.path().join("link"));
                    assert_eq!(target, "real");
                    assert!(real.unwrap().ends_with(through.replace("link", "real")));
                }
                other => panic!("{through}: {other:?}"),
            }
        }
        assert!(matches!(
            open_without_symlinks(&root.path().join("missing/x")),
            Err(GrantDirectoryProblem::Missing { at }) if at == root.path().join("missing")
        ));
        std::fs::write(root.path().join("file"), b"x").unwrap();
        assert!(matches!(
            open_without_symlinks(&root.path().join("file")),
            Err(GrantDirectoryProblem::NotADirectory { .. })
        ));
        assert!(matches!(
            open_without_symlinks(Path::new("relative")),
            Err(GrantDirectoryProblem::NotNormal)
        ));
    }

    #[test]
    fn a_symlink_or_a_file_is_never_published_as_a_volume_directory() {
        let root = tempfile::tempdir().unwrap();
        let granted = root.path().join("volumes");
        std::fs::create_dir_all(granted.join("pvc-dir")).unwrap();
        std::os::unix::fs::symlink("/", granted.join("pvc-link")).unwrap();
        std::os::unix::fs::symlink("pvc-dir", granted.join("pvc-relative")).unwrap();
        std::fs::write(granted.join("pvc-file"), b"x").unwrap();
        let directories = ModuleDirectories {
            module: "m".into(),
            grants: vec![DirectoryGrant {
                host: granted.clone(),
                guest: "/volumes".into(),
                mode: DirectoryMode::ReadWrite,
            }],
            opened: Mutex::new(None),
        };
        let check = |name: &str| {
            directories.check_volume_directory(&VolumeDirectory {
                directory: "/volumes".into(),
                name: name.into(),
                rule: "modules.m.volumes.hostPath".into(),
            })
        };
        check("pvc-dir").unwrap();
        // Not there yet: kubelet makes a DirectoryOrCreate, and nothing can put a link
        // there later (see fs_rules).
        check("pvc-new").unwrap();
        for name in ["pvc-link", "pvc-relative"] {
            let error = check(name).unwrap_err();
            assert!(error.contains("is a symlink"), "{name}: {error}");
        }
        assert!(check("pvc-file").unwrap_err().contains("not a directory"));
        // The grant's path renamed away and replaced by a link to `/` after start
        // changes nothing: the check goes through the handle opened at start.
        std::fs::rename(&granted, root.path().join("moved")).unwrap();
        std::os::unix::fs::symlink("/", &granted).unwrap();
        check("pvc-dir").unwrap();
        assert!(check("pvc-link").is_err());
        let error = directories
            .check_volume_directory(&VolumeDirectory {
                directory: "/other".into(),
                name: "pvc-dir".into(),
                rule: "modules.m.volumes.hostPath".into(),
            })
            .unwrap_err();
        assert!(error.contains("no directory grant at /other"), "{error}");
    }

    #[test]
    fn a_missing_directory_is_used_once_it_exists() {
        let root = tempfile::tempdir().unwrap();
        let granted = root.path().join("later");
        let directories = ModuleDirectories {
            module: "m".into(),
            grants: vec![DirectoryGrant {
                host: granted.clone(),
                guest: "/data".into(),
                mode: DirectoryMode::ReadWrite,
            }],
            opened: Mutex::new(None),
        };
        let error = directories.opened().err().unwrap();
        assert!(error.to_string().contains("does not exist"), "{error}");
        std::fs::create_dir(&granted).unwrap();
        directories.opened().unwrap();
        assert!(directories.lock().is_some());
    }
}
