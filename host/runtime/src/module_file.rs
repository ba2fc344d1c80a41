//! Reading a module file: only a regular file inside the modules directory, bounded.
//!
//! `NAME.wasm` is resolved beneath the directory it sits in, one component at a time
//! with `O_NOFOLLOW`: a symlink is followed only when its target is relative and stays
//! inside that directory, which is exactly kubelet's ConfigMap layout
//! (`NAME.wasm -> ..data/NAME.wasm`, `..data -> ..2026_12_03_08_00_00.1234`). An
//! absolute symlink (`-> /proc/self/pagemap`), or one climbing above the directory with
//! `..`, is refused without opening its target. The file is opened `O_NONBLOCK` (a FIFO
//! cannot stall the scan), must be a regular file (checked with `fstat` on the opened
//! descriptor, not on the path), must not be larger than the cap before anything is
//! read, and at most cap + 1 bytes are read, so a file that grows, or lies about its
//! size (as `/proc` files do), is refused too.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The default of `--max-module-bytes`: Python and JavaScript guests are 12-35 MB.
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 64 * 1024 * 1024;

/// Symlinks followed while resolving one module file (the kernel's own limit is 40).
const MAX_SYMLINKS: usize = 40;

/// Why a module file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ModuleFileError {
    #[error(
        "it leads outside the modules directory {dir} ({link} -> {target}); only symlinks \
         that stay inside the modules directory are followed"
    )]
    Outside {
        dir: PathBuf,
        link: PathBuf,
        target: String,
    },
    #[error("more than {MAX_SYMLINKS} symlinks on the way to the file")]
    TooManySymlinks,
    #[error("it is not a regular file (a {kind})")]
    NotARegularFile { kind: &'static str },
    #[error("{path} is {size} bytes, more than the {max} bytes a module may have")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{at}: {source}")]
    Io { at: PathBuf, source: std::io::Error },
}

/// Reads the module file `path` (a file name inside its modules directory), at most
/// `max_bytes` long.
pub(crate) fn read_module_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, ModuleFileError> {
    let io = |at: &Path| {
        let at = at.to_path_buf();
        move |errno: Errno| ModuleFileError::Io {
            at,
            source: errno.into(),
        }
    };
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => (
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            },
            name,
        ),
        _ => {
            return Err(ModuleFileError::Io {
                at: path.into(),
                source: std::io::Error::other("not a file name in a directory"),
            });
        }
    };
    // The directory itself is the admin's `--modules` path: followed as given.
    let root = rustix::fs::openat(
        CWD,
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io(dir))?;
    let file = open_beneath(&root, dir, name.into())?;

    let stat = rustix::fs::fstat(&file).map_err(io(path))?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        return Err(ModuleFileError::NotARegularFile {
            kind: kind_name(kind),
        });
    }
    let size = stat.st_size as u64;
    let too_large = |size| ModuleFileError::TooLarge {
        path: path.to_path_buf(),
        size,
        max: max_bytes,
    };
    if size > max_bytes {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::fs::File::from(file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| ModuleFileError::Io {
            at: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Opens `name` beneath `root` (the directory `dir`), following only symlinks whose
/// relative targets stay beneath it.
fn open_beneath(root: &OwnedFd, dir: &Path, name: OsString) -> Result<OwnedFd, ModuleFileError> {
    // The directories entered below `root`; `..` pops one, and may not pop `root`.
    let mut entered: Vec<(OwnedFd, PathBuf)> = Vec::new();
    let mut pending: VecDeque<OsString> = VecDeque::from([name]);
    let mut symlinks = 0;
    while let Some(component) = pending.pop_front() {
        let (current, current_path) = match entered.last() {
            Some((fd, path)) => (fd, path.clone()),
            None => (root, dir.to_path_buf()),
        };
        let at = current_path.join(&component);
        let io = |source: std::io::Error| ModuleFileError::Io {
            at: at.clone(),
            source,
        };
        match component.as_bytes() {
            b"" | b"." => continue,
            b".." => {
                // Popping `root` itself is climbing out: refused where the link was read.
                entered.pop();
                continue;
            }
            _ => {}
        }
        let stat = rustix::fs::statat(current, &component, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io(e.into()))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => {
                symlinks += 1;
                if symlinks > MAX_SYMLINKS {
                    return Err(ModuleFileError::TooManySymlinks);
                }
                let target = rustix::fs::readlinkat(current, &component, Vec::new())
                    .map_err(|e| io(e.into()))?;
                let target = Path::new(std::ffi::OsStr::from_bytes(target.as_bytes())).to_owned();
                let outside = || ModuleFileError::Outside {
                    dir: dir.to_path_buf(),
                    link: at.clone(),
                    target: target.display().to_string(),
                };
                // Where the target climbs to, relative to `root`.
                let mut depth = entered.len() as isize;
                let mut components = Vec::new();
                for part in target.components() {
                    match part {
                        Component::Normal(part) => {
                            depth += 1;
                            components.push(part.to_os_string());
                        }
                        Component::ParentDir => {
                            depth -= 1;
                            if depth < 0 {
                                return Err(outside());
                            }
                            components.push("..".into());
                        }
                        Component::CurDir => {}
                        Component::RootDir | Component::Prefix(_) => return Err(outside()),
                    }
                }
                for part in components.into_iter().rev() {
                    pending.push_front(part);
                }
            }
            FileType::Directory if !pending.is_empty() => {
                let next = rustix::fs::openat(
                    current,
                    &component,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(e.into()))?;
                entered.push((next, at.clone()));
            }
            _ if !pending.is_empty() => return Err(io(Errno::NOTDIR.into())),
            _ => {
                // The last component. Should it have become a symlink since `statat`,
                // `O_NOFOLLOW` makes the open fail rather than follow it.
                return rustix::fs::openat(
                    current,
                    &component,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(e.into()));
            }
        }
    }
    // Only a path ending in `.`/`..` gets here: a directory, not a module file.
    Err(ModuleFileError::NotARegularFile { kind: "directory" })
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "file of unknown type",
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn follows_links_that_stay_inside_and_refuses_the_others() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("modules");
        let stamp = dir.join("..2026_12_03_08_00_00.1");
        std::fs::create_dir_all(stamp.join("sub")).unwrap();
        std::fs::write(stamp.join("a.wasm"), b"module a").unwrap();
        symlink("..2026_12_03_08_00_00.1", dir.join("..data")).unwrap();
        symlink("..data/a.wasm", dir.join("a.wasm")).unwrap();
        // Down and back up, still inside.
        symlink("..data/sub/../a.wasm", dir.join("b.wasm")).unwrap();
        symlink("../../../modules/a.wasm", stamp.join("sub/c.wasm")).unwrap();
        symlink("..data/sub/c.wasm", dir.join("c.wasm")).unwrap();
        symlink("sub/../../..data/a.wasm", stamp.join("d.wasm")).unwrap();
        symlink("..data/d.wasm", dir.join("d.wasm")).unwrap();
        for name in ["a", "b", "d"] {
            let bytes = read_module_file(&dir.join(format!("{name}.wasm")), 100).unwrap();
            assert_eq!(bytes, b"module a", "{name}");
        }
        // c climbs to `root/modules/a.wasm` through the parent: outside, even though
        // it comes back in.
        std::fs::write(root.path().join("outside.wasm"), b"outside").unwrap();
        symlink(root.path().join("outside.wasm"), dir.join("abs.wasm")).unwrap();
        symlink("../outside.wasm", dir.join("up.wasm")).unwrap();
        symlink("/proc/self/pagemap", dir.join("pagemap.wasm")).unwrap();
        for name in ["c", "abs", "up", "pagemap"] {
            let error = read_module_file(&dir.join(format!("{name}.wasm")), 100).unwrap_err();
            assert!(
                matches!(error, ModuleFileError::Outside { .. }),
                "{name}: {error}"
            );
        }
        symlink("loop.wasm", dir.join("loop.wasm")).unwrap();
        assert!(matches!(
            read_module_file(&dir.join("loop.wasm"), 100),
            Err(ModuleFileError::TooManySymlinks)
        ));
        std::fs::create_dir(dir.join("dir.wasm")).unwrap();
        assert!(matches!(
            read_module_file(&dir.join("dir.wasm"), 100),
            Err(ModuleFileError::NotARegularFile { kind: "directory" })
        ));
    }

    #[test]
    fn the_cap_is_checked_before_and_while_reading() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("big.wasm");
        std::fs::write(&path, vec![0u8; 101]).unwrap();
        assert!(matches!(
            read_module_file(&path, 100),
            Err(ModuleFileError::TooLarge {
                size: 101,
                max: 100,
                ..
            })
        ));
        assert_eq!(read_module_file(&path, 101).unwrap().len(), 101);
        // A regular file whose size says 0 but that has content: /proc files (like
        // /proc/self/pagemap, which never ends). Opened directly (its directory is the
        // modules directory here), the size passes and the read stops at cap + 1.
        assert_eq!(std::fs::metadata("/proc/self/status").unwrap().len(), 0);
        let error = read_module_file(Path::new("/proc/self/status"), 100).unwrap_err();
        assert!(
            matches!(
                error,
                ModuleFileError::TooLarge {
                    size: 101,
                    max: 100,
                    ..
                }
            ),
            "{error}"
        );
        // Devices are not modules.
        assert!(matches!(
            read_module_file(Path::new("/dev/zero"), 100),
            Err(ModuleFileError::NotARegularFile {
                kind: "character device"
            })
        ));
    }
}
