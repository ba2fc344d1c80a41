//! Directories by handle, and deleting a volume's directory in bounded, resumable chunks.
//!
//! Deleting what a tenant wrote is deleting hostile input. `std::fs::remove_dir_all`
//! fails a whole volume on any of: a tree deeper than the guest's stack (it recurses),
//! a path longer than the host's `PATH_MAX` (it builds full paths), a name that is not
//! UTF-8 (WASI 0.2 names are strings: wasmtime answers `illegal-byte-sequence` for such
//! an entry), or more files than one call's timeout allows. This module avoids each:
//!
//! - [`Dir`] is an open directory (a WASI descriptor in the guest); every operation is
//!   relative to it with a single path component, and nothing follows a symbolic link.
//! - [`delete_volume_dir`] first renames the volume's directory into a trash directory
//!   (one rename: the volume's path is free at once), then [`drain`]s it: files are
//!   unlinked where they are, and a subdirectory's subdirectories are *hoisted* into the
//!   trash entry (renamed one level up) instead of descended into, so depth never costs
//!   stack, open handles or path length: every operation uses at most two handles and
//!   names of one component.
//! - The work stops at a [`Budget`] (operations and elapsed time) and reports
//!   [`Deletion::InProgress`]; the next call picks up where the trash entry is. A plugin
//!   answers `in-background` meanwhile and the host asks again.
//! - An entry whose name is not UTF-8 cannot be named through WASI, so it cannot be
//!   unlinked, nor can the directory holding it be removed. Everything else is deleted;
//!   the directories still holding such entries are left in the trash directory as
//!   `<volume>.remnants-<n>` and reported ([`Deletion::Remnants`]) for the admin to
//!   remove on the host (`rm -rf`). The volume itself is gone from its path.
//!
//! Natively (`cargo test`), [`Dir`] works on paths with `std::fs` (same semantics, for
//! unit tests).

use std::fmt;
use std::time::{Duration, Instant};

/// The trash directory, in the root of a plugin's grant: volumes being deleted
/// (`<pv-name>`) and what could not be deleted (`<pv-name>.remnants-<n>`).
pub const TRASH: &str = ".wasm-provisioner-trash";

/// What went wrong with a filesystem operation, as far as deleting cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    Exists,
    NotEmpty,
    NotDirectory,
    /// A name WASI cannot express (not UTF-8).
    IllegalName,
    /// A rename across filesystems.
    CrossDevice,
    Other,
}

/// A filesystem error: its kind and a message naming the operation and the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FsError {}

impl FsError {
    fn new(kind: ErrorKind, message: String) -> Self {
        FsError { kind, message }
    }
}

/// One directory entry: its name and whether it is a directory (symbolic links are not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
}

/// An open directory. Every path given to its methods is one component (no `/`).
pub struct Dir {
    imp: imp::Dir,
    /// The guest path, for messages.
    path: String,
}

impl fmt::Debug for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dir({})", self.path)
    }
}

impl Dir {
    /// Opens the directory at the absolute guest path `path`: from the granted directory
    /// (preopen) that contains it, one component at a time, refusing a symbolic link or
    /// a non-directory at any step.
    pub fn open(path: &str) -> Result<Dir, FsError> {
        imp::open(path).map(|imp| Dir {
            imp,
            path: path.to_string(),
        })
    }

    /// The guest path this directory was opened as.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn child_path(&self, name: &str) -> String {
        crate::path::join(&self.path, name)
    }

    /// Opens the subdirectory `name`; a symbolic link is refused (`NotDirectory`).
    pub fn open_dir(&self, name: &str) -> Result<Dir, FsError> {
        let path = self.child_path(name);
        self.imp
            .open_dir(name)
            .map(|imp| Dir {
                imp,
                path: path.clone(),
            })
            .map_err(|(kind, e)| FsError::new(kind, format!("opening directory {path}: {e}")))
    }

    /// Opens the directory at the relative path `rel` below this one, one component at a
    /// time, refusing a symbolic link at any step.
    pub fn open_dir_path(&self, rel: &str) -> Result<Dir, FsError> {
        let mut components = rel.split('/').filter(|c| !c.is_empty());
        let first = components.next().ok_or_else(|| {
            FsError::new(ErrorKind::Other, format!("empty path below {}", self.path))
        })?;
        let mut dir = self.open_dir(first)?;
        for component in components {
            dir = dir.open_dir(component)?;
        }
        Ok(dir)
    }

    /// Creates the subdirectory `name`; an existing directory is fine.
    pub fn create_dir(&self, name: &str) -> Result<(), FsError> {
        match self.imp.create_dir(name) {
            Ok(()) => Ok(()),
            Err((ErrorKind::Exists, _)) => Ok(()),
            Err((kind, e)) => Err(FsError::new(
                kind,
                format!("creating directory {}: {e}", self.child_path(name)),
            )),
        }
    }

    /// The entries of this directory, `.` and `..` excluded. An entry that cannot be
    /// read is an `Err` item (`IllegalName` for a name that is not UTF-8); the
    /// iteration goes on after it.
    pub fn entries(&self) -> Result<impl Iterator<Item = Result<Entry, FsError>> + '_, FsError> {
        let path = self.path.clone();
        let entries = self
            .imp
            .entries()
            .map_err(|(kind, e)| FsError::new(kind, format!("listing directory {path}: {e}")))?;
        Ok(entries.map(move |item| {
            item.map_err(|(kind, e)| FsError::new(kind, format!("an entry of {path}: {e}")))
        }))
    }

    /// Unlinks the non-directory `name` (a symbolic link itself, never its target).
    pub fn remove_file(&self, name: &str) -> Result<(), FsError> {
        self.imp.remove_file(name).map_err(|(kind, e)| {
            FsError::new(kind, format!("deleting {}: {e}", self.child_path(name)))
        })
    }

    /// Removes the empty directory `name`.
    pub fn remove_dir(&self, name: &str) -> Result<(), FsError> {
        self.imp.remove_dir(name).map_err(|(kind, e)| {
            FsError::new(
                kind,
                format!("deleting directory {}: {e}", self.child_path(name)),
            )
        })
    }

    /// Renames `name` to `to_name` in `to`.
    pub fn rename(&self, name: &str, to: &Dir, to_name: &str) -> Result<(), FsError> {
        self.imp
            .rename(name, &to.imp, to_name)
            .map_err(|(kind, e)| {
                FsError::new(
                    kind,
                    format!(
                        "renaming {} to {}: {e}",
                        self.child_path(name),
                        to.child_path(to_name)
                    ),
                )
            })
    }

    /// Whether `name` exists here (as anything; a symbolic link is not followed).
    pub fn exists(&self, name: &str) -> Result<bool, FsError> {
        self.imp.exists(name).map_err(|(kind, e)| {
            FsError::new(kind, format!("checking {}: {e}", self.child_path(name)))
        })
    }
}

/// How much one call may do before it answers "in background".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Filesystem changes (unlinks, removals, renames).
    pub operations: u64,
    /// Elapsed time from the start of the delete; keep it well under the module's
    /// `timeoutSeconds` (listing a huge directory on the host comes on top).
    pub time: Duration,
}

impl Budget {
    /// The default chunk: at most 100 000 operations or 1 second.
    pub const DEFAULT: Budget = Budget {
        operations: 100_000,
        time: Duration::from_secs(1),
    };

    /// The default time with another operation count.
    pub fn operations(operations: u64) -> Budget {
        Budget {
            operations,
            ..Budget::DEFAULT
        }
    }
}

impl Budget {
    /// The StorageClass parameter that sets [`Budget::operations`].
    pub const PARAMETER: &'static str = "deleteChunkEntries";

    /// The budget a class asks for: parameter `deleteChunkEntries` (1 to 10 000 000
    /// entries), else [`Budget::DEFAULT`]; the time is always the default second.
    pub fn from_params(params: &crate::Params) -> Result<Budget, crate::ParamError> {
        let Some(text) = params.get(Self::PARAMETER) else {
            return Ok(Budget::DEFAULT);
        };
        match text.parse::<u64>() {
            Ok(n) if (1..=10_000_000).contains(&n) => Ok(Budget::operations(n)),
            _ => Err(crate::ParamError(format!(
                "StorageClass parameter `{}` is {text:?}: set it to a whole number of \
                 entries from 1 to 10000000 (default {})",
                Self::PARAMETER,
                Budget::DEFAULT.operations
            ))),
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::DEFAULT
    }
}

/// Counts work against a [`Budget`].
struct Meter {
    budget: Budget,
    started: Instant,
    done: u64,
}

impl Meter {
    fn new(budget: Budget) -> Self {
        Meter {
            budget,
            started: Instant::now(),
            done: 0,
        }
    }

    fn spent(&self) -> bool {
        self.done >= self.budget.operations || self.started.elapsed() >= self.budget.time
    }

    fn count(&mut self) {
        self.done += 1;
    }
}

/// How far [`drain`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Nothing removable is left; `stuck` entries (names that are not UTF-8, and
    /// directories holding them) remain.
    Done { stuck: u64 },
    /// The budget ran out; call again.
    More,
}

/// Removes what is inside `dir` (not `dir` itself) until it is empty, nothing removable
/// is left, or the budget is spent. Iterative: subdirectories of a subdirectory are
/// hoisted into `dir` under fresh names, so no depth costs more than two handles.
fn drain(dir: &Dir, meter: &mut Meter) -> Result<Drained, FsError> {
    let mut fresh = Fresh::new();
    loop {
        let mut progress = false;
        let mut stuck = 0;
        for entry in dir.entries()? {
            if meter.spent() {
                return Ok(Drained::More);
            }
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) if e.kind == ErrorKind::IllegalName => {
                    stuck += 1;
                    continue;
                }
                // Gone between the listing and its metadata.
                Err(e) if e.kind == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !entry.is_dir {
                ignore_not_found(dir.remove_file(&entry.name))?;
                meter.count();
                progress = true;
                continue;
            }
            match dir.remove_dir(&entry.name) {
                Ok(()) => {
                    meter.count();
                    progress = true;
                    continue;
                }
                Err(e) if e.kind == ErrorKind::NotFound => continue,
                Err(e) if matches!(e.kind, ErrorKind::NotEmpty | ErrorKind::Exists) => {}
                Err(e) => return Err(e),
            }
            let sub = match dir.open_dir(&entry.name) {
                Ok(sub) => sub,
                Err(e) if e.kind == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut unnameable = false;
            for child in sub.entries()? {
                if meter.spent() {
                    return Ok(Drained::More);
                }
                match child {
                    Err(e) if e.kind == ErrorKind::IllegalName => unnameable = true,
                    Err(e) if e.kind == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                    Ok(child) if !child.is_dir => {
                        ignore_not_found(sub.remove_file(&child.name))?;
                        meter.count();
                        progress = true;
                    }
                    Ok(child) => {
                        hoist(&sub, &child.name, dir, &mut fresh)?;
                        meter.count();
                        progress = true;
                    }
                }
            }
            if unnameable {
                stuck += 1;
                continue;
            }
            match dir.remove_dir(&entry.name) {
                Ok(()) => {
                    meter.count();
                    progress = true;
                }
                // Refilled meanwhile (nothing writes here, but be safe): next pass.
                Err(e) if matches!(e.kind, ErrorKind::NotEmpty | ErrorKind::Exists) => {}
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if !progress {
            return Ok(Drained::Done { stuck });
        }
    }
}

/// Fresh names for hoisted directories: unlikely to exist, and retried if they do.
struct Fresh {
    seed: u128,
    next: u64,
}

impl Fresh {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Fresh { seed, next: 0 }
    }

    fn name(&mut self) -> String {
        self.next += 1;
        format!(".hoisted-{:x}-{}", self.seed, self.next)
    }
}

/// Moves the directory `name` of `from` into `to` under a fresh name.
fn hoist(from: &Dir, name: &str, to: &Dir, fresh: &mut Fresh) -> Result<(), FsError> {
    let mut last = None;
    for _ in 0..8 {
        let target = fresh.name();
        // Never rename onto an existing entry: POSIX rename replaces an empty directory.
        if to.exists(&target)? {
            continue;
        }
        match from.rename(name, to, &target) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind == ErrorKind::NotFound => return Ok(()),
            Err(e) if matches!(e.kind, ErrorKind::Exists | ErrorKind::NotEmpty) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        FsError::new(
            ErrorKind::Exists,
            format!(
                "no free name to move {} into {}",
                from.child_path(name),
                to.path
            ),
        )
    }))
}

fn ignore_not_found(result: Result<(), FsError>) -> Result<(), FsError> {
    match result {
        Err(e) if e.kind == ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The state of a volume directory's deletion after one call of [`delete_volume_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// There was nothing to delete (already gone).
    Gone,
    /// Deleted completely.
    Deleted { operations: u64 },
    /// Not finished: call again. `at` is where the rest is.
    InProgress { operations: u64, at: String },
    /// Everything that can be deleted is; `stuck` entries whose names are not UTF-8
    /// (and the directories holding them) remain at `at`, for the admin.
    Remnants { stuck: u64, at: String },
}

/// Deletes the directory `name` in `parent`, which belongs to the volume `volume` (a PV
/// name, unique), within `budget`; resumable: call it again until it answers something
/// else than [`Deletion::InProgress`]. `root` is the grant's root directory, where the
/// [`TRASH`] directory lives (it must be on the same filesystem as `parent`; if it is
/// not, the directory is drained in place).
pub fn delete_volume_dir(
    root: &Dir,
    parent: &Dir,
    name: &str,
    volume: &str,
    budget: Budget,
) -> Result<Deletion, FsError> {
    let mut meter = Meter::new(budget);
    let mut trash = open_trash(root)?;
    let mut in_place = false;
    if parent.exists(name)? {
        // A directory, not a symbolic link to one (open_dir refuses links).
        drop(parent.open_dir(name)?);
        if trash.exists(volume)? {
            // An earlier deletion of this PV name is unfinished: finish it first (its
            // remnants, if any, are moved aside), then this directory follows.
            return match finish(&trash, volume, &mut meter)? {
                progress @ Deletion::InProgress { .. } => Ok(progress),
                _ => Ok(Deletion::InProgress {
                    operations: meter.done,
                    at: parent.child_path(name),
                }),
            };
        }
        let mut attempts = 0;
        loop {
            match parent.rename(name, &trash, volume) {
                Ok(()) => break,
                Err(e) if e.kind == ErrorKind::CrossDevice => {
                    in_place = true;
                    break;
                }
                // The trash was removed (empty) by a deletion finishing meanwhile.
                Err(e) if e.kind == ErrorKind::NotFound && attempts < 3 => {
                    attempts += 1;
                    trash = open_trash(root)?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    if in_place {
        let dir = parent.open_dir(name)?;
        return match drain(&dir, &mut meter)? {
            Drained::More => Ok(Deletion::InProgress {
                operations: meter.done,
                at: dir.path.clone(),
            }),
            Drained::Done { stuck } if stuck > 0 => Ok(Deletion::Remnants {
                stuck,
                at: dir.path.clone(),
            }),
            Drained::Done { .. } => {
                drop(dir);
                parent.remove_dir(name)?;
                Ok(Deletion::Deleted {
                    operations: meter.done + 1,
                })
            }
        };
    }
    if !trash.exists(volume)? {
        return Ok(Deletion::Gone);
    }
    let deletion = finish(&trash, volume, &mut meter)?;
    tidy_trash(root, &deletion);
    Ok(deletion)
}

/// The trash directory of `root`, created if missing (again, if a deletion finishing
/// meanwhile removed it between the two steps).
fn open_trash(root: &Dir) -> Result<Dir, FsError> {
    let mut attempts = 0;
    loop {
        root.create_dir(TRASH)?;
        match root.open_dir(TRASH) {
            Err(e) if e.kind == ErrorKind::NotFound && attempts < 3 => attempts += 1,
            other => return other,
        }
    }
}

/// Removes the trash directory once a deletion finished and it is empty, so a grant
/// without deletions under way holds only volumes. (Another deletion may be about to
/// move a volume in: it re-creates the trash if its rename finds it gone.)
fn tidy_trash(root: &Dir, deletion: &Deletion) {
    if matches!(deletion, Deletion::Deleted { .. }) {
        let _ = root.remove_dir(TRASH);
    }
}

/// Goes on with the deletion of `volume` that an earlier [`delete_volume_dir`] moved
/// into `root`'s trash; [`Deletion::Gone`] if there is none.
pub fn resume_deletion(root: &Dir, volume: &str, budget: Budget) -> Result<Deletion, FsError> {
    let mut meter = Meter::new(budget);
    if !root.exists(TRASH)? {
        return Ok(Deletion::Gone);
    }
    let trash = root.open_dir(TRASH)?;
    if !trash.exists(volume)? {
        return Ok(Deletion::Gone);
    }
    let deletion = finish(&trash, volume, &mut meter)?;
    tidy_trash(root, &deletion);
    Ok(deletion)
}

/// The answer of a plugin's `delete` for one call of [`delete_volume_dir`] on the volume
/// `volume` whose directory is `dir`, logged: success when the directory is gone (or
/// only remnants are left: logged as a warning, for the admin), `in-background` while
/// it is not finished.
pub fn delete_answer(
    volume: &str,
    dir: &str,
    deletion: Deletion,
) -> Result<(), crate::DeleteError> {
    match deletion {
        Deletion::Gone => {
            crate::log::info!("directory already gone", volume = volume, dir = dir);
            Ok(())
        }
        Deletion::Deleted { operations } => {
            crate::log::info!("deleted", volume = volume, dir = dir, entries = operations);
            Ok(())
        }
        Deletion::InProgress { operations, at } => {
            crate::log::info!(
                "deleting in chunks",
                volume = volume,
                dir = dir,
                entries = operations,
                rest = at
            );
            Err(crate::DeleteError::InBackground(format!(
                "deleted {operations} entries of {dir} in this call; the rest, now at {at}, \
                 goes in the next calls"
            )))
        }
        Deletion::Remnants { stuck, at } => {
            crate::log::warn!(
                "deleted all but entries whose names are not UTF-8: WASI cannot name them; remove them on the host (rm -rf)",
                volume = volume,
                dir = dir,
                left = stuck,
                at = at
            );
            Ok(())
        }
    }
}

/// Drains `trash/volume` and removes it, or moves its remnants aside.
fn finish(trash: &Dir, volume: &str, meter: &mut Meter) -> Result<Deletion, FsError> {
    let dir = trash.open_dir(volume)?;
    match drain(&dir, meter)? {
        Drained::More => Ok(Deletion::InProgress {
            operations: meter.done,
            at: dir.path.clone(),
        }),
        Drained::Done { stuck: 0 } => {
            drop(dir);
            ignore_not_found(trash.remove_dir(volume))?;
            meter.count();
            Ok(Deletion::Deleted {
                operations: meter.done,
            })
        }
        Drained::Done { stuck } => {
            drop(dir);
            for n in 1..=1000 {
                let aside = format!("{volume}.remnants-{n}");
                if trash.exists(&aside)? {
                    continue;
                }
                trash.rename(volume, trash, &aside)?;
                return Ok(Deletion::Remnants {
                    stuck,
                    at: trash.child_path(&aside),
                });
            }
            Ok(Deletion::Remnants {
                stuck,
                at: trash.child_path(volume),
            })
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod imp {
    //! WASI 0.2 descriptors.
    use super::ErrorKind;
    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{
        Descriptor, DescriptorFlags, DescriptorType, DirectoryEntryStream, ErrorCode, OpenFlags,
        PathFlags,
    };

    pub type Error = (ErrorKind, String);

    pub struct Dir(Descriptor);

    fn error(code: ErrorCode) -> Error {
        let kind = match code {
            ErrorCode::NoEntry => ErrorKind::NotFound,
            ErrorCode::Exist => ErrorKind::Exists,
            ErrorCode::NotEmpty => ErrorKind::NotEmpty,
            ErrorCode::NotDirectory | ErrorCode::Loop => ErrorKind::NotDirectory,
            ErrorCode::IllegalByteSequence => ErrorKind::IllegalName,
            ErrorCode::CrossDevice => ErrorKind::CrossDevice,
            _ => ErrorKind::Other,
        };
        let message = match code {
            ErrorCode::Loop => "a symbolic link (refused)".to_string(),
            ErrorCode::IllegalByteSequence => "a name that is not UTF-8".to_string(),
            other => format!("{} ({})", other.message(), other.name()),
        };
        (kind, message)
    }

    fn open_child(parent: &Descriptor, name: &str) -> Result<Descriptor, Error> {
        parent
            .open_at(
                PathFlags::empty(),
                name,
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ | DescriptorFlags::MUTATE_DIRECTORY,
            )
            .map_err(error)
    }

    pub fn open(path: &str) -> Result<Dir, super::FsError> {
        let fail = |kind, message: String| super::FsError::new(kind, message);
        let mut best: Option<(Descriptor, String)> = None;
        for (descriptor, guest) in get_directories() {
            let guest_trimmed = guest.trim_end_matches('/');
            let inside = path == guest_trimmed
                || path
                    .strip_prefix(guest_trimmed)
                    .is_some_and(|rest| rest.starts_with('/'));
            if inside
                && best
                    .as_ref()
                    .is_none_or(|(_, b)| b.len() < guest_trimmed.len())
            {
                best = Some((descriptor, guest_trimmed.to_string()));
            }
        }
        let Some((mut dir, guest)) = best else {
            return Err(fail(
                ErrorKind::NotFound,
                format!("{path} is not inside a directory granted to this module"),
            ));
        };
        let mut at = guest.clone();
        for component in path[guest.len()..].split('/').filter(|c| !c.is_empty()) {
            at = crate::path::join(&at, component);
            dir = open_child(&dir, component)
                .map_err(|(kind, e)| fail(kind, format!("opening directory {at}: {e}")))?;
        }
        Ok(Dir(dir))
    }

    pub struct Entries(DirectoryEntryStream);

    impl Iterator for Entries {
        type Item = Result<super::Entry, Error>;

        fn next(&mut self) -> Option<Self::Item> {
            match self.0.read_directory_entry() {
                Ok(None) => None,
                Ok(Some(entry)) => Some(Ok(super::Entry {
                    is_dir: entry.type_ == DescriptorType::Directory,
                    name: entry.name,
                })),
                Err(code) => Some(Err(error(code))),
            }
        }
    }

    impl Dir {
        pub fn open_dir(&self, name: &str) -> Result<Dir, Error> {
            open_child(&self.0, name).map(Dir)
        }

        pub fn create_dir(&self, name: &str) -> Result<(), Error> {
            self.0.create_directory_at(name).map_err(error)
        }

        pub fn entries(&self) -> Result<Entries, Error> {
            self.0.read_directory().map(Entries).map_err(error)
        }

        pub fn remove_file(&self, name: &str) -> Result<(), Error> {
            self.0.unlink_file_at(name).map_err(error)
        }

        pub fn remove_dir(&self, name: &str) -> Result<(), Error> {
            self.0.remove_directory_at(name).map_err(error)
        }

        pub fn rename(&self, name: &str, to: &Dir, to_name: &str) -> Result<(), Error> {
            self.0.rename_at(name, &to.0, to_name).map_err(error)
        }

        pub fn exists(&self, name: &str) -> Result<bool, Error> {
            match self.0.stat_at(PathFlags::empty(), name) {
                Ok(_) => Ok(true),
                Err(ErrorCode::NoEntry) => Ok(false),
                Err(code) => Err(error(code)),
            }
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    //! Native, for unit tests: paths and `std::fs`, with the same refusals.
    use super::ErrorKind;
    use std::io;
    use std::path::PathBuf;

    pub type Error = (ErrorKind, String);

    pub struct Dir(PathBuf);

    fn error(e: io::Error) -> Error {
        let kind = match e.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::AlreadyExists => ErrorKind::Exists,
            io::ErrorKind::DirectoryNotEmpty => ErrorKind::NotEmpty,
            io::ErrorKind::NotADirectory => ErrorKind::NotDirectory,
            io::ErrorKind::CrossesDevices => ErrorKind::CrossDevice,
            _ => ErrorKind::Other,
        };
        (kind, e.to_string())
    }

    fn check_dir(path: PathBuf) -> Result<Dir, Error> {
        let meta = std::fs::symlink_metadata(&path).map_err(error)?;
        if meta.file_type().is_symlink() {
            Err((ErrorKind::NotDirectory, "a symbolic link (refused)".into()))
        } else if !meta.is_dir() {
            Err((ErrorKind::NotDirectory, "not a directory".into()))
        } else {
            Ok(Dir(path))
        }
    }

    pub fn open(path: &str) -> Result<Dir, super::FsError> {
        let mut at = PathBuf::from("/");
        for component in path.split('/').filter(|c| !c.is_empty()) {
            at.push(component);
            check_dir(at.clone()).map_err(|(kind, e)| {
                super::FsError::new(kind, format!("opening directory {}: {e}", at.display()))
            })?;
        }
        Ok(Dir(at))
    }

    impl Dir {
        pub fn open_dir(&self, name: &str) -> Result<Dir, Error> {
            check_dir(self.0.join(name))
        }

        pub fn create_dir(&self, name: &str) -> Result<(), Error> {
            std::fs::create_dir(self.0.join(name)).map_err(error)
        }

        pub fn entries(
            &self,
        ) -> Result<impl Iterator<Item = Result<super::Entry, Error>> + use<>, Error> {
            let read = std::fs::read_dir(&self.0).map_err(error)?;
            Ok(read.map(|entry| {
                let entry = entry.map_err(error)?;
                let is_dir = entry.file_type().map_err(error)?.is_dir();
                let name = entry.file_name().into_string().map_err(|_| {
                    (
                        ErrorKind::IllegalName,
                        "a name that is not UTF-8".to_string(),
                    )
                })?;
                Ok(super::Entry { name, is_dir })
            }))
        }

        pub fn remove_file(&self, name: &str) -> Result<(), Error> {
            std::fs::remove_file(self.0.join(name)).map_err(error)
        }

        pub fn remove_dir(&self, name: &str) -> Result<(), Error> {
            std::fs::remove_dir(self.0.join(name)).map_err(error)
        }

        pub fn rename(&self, name: &str, to: &Dir, to_name: &str) -> Result<(), Error> {
            std::fs::rename(self.0.join(name), to.0.join(to_name)).map_err(error)
        }

        pub fn exists(&self, name: &str) -> Result<bool, Error> {
            match std::fs::symlink_metadata(self.0.join(name)) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(error(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt as _;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory standing in for a grant; removed on drop.
    struct Root(PathBuf);

    impl Root {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "sdk-fs-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(dir.join("vol")).unwrap();
            Root(dir)
        }
        fn dir(&self) -> Dir {
            Dir::open(self.0.to_str().unwrap()).unwrap()
        }
        fn vol(&self) -> PathBuf {
            self.0.join("vol")
        }
        fn trash(&self) -> PathBuf {
            self.0.join(TRASH)
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Runs the deletion to its end; answers the number of calls and the last answer.
    fn run(root: &Root, budget: Budget) -> (usize, Deletion) {
        let dir = root.dir();
        for call in 1..10_000 {
            match delete_volume_dir(&dir, &dir, "vol", "pvc-1", budget).unwrap() {
                Deletion::InProgress { .. } => continue,
                other => return (call, other),
            }
        }
        panic!("never finished");
    }

    fn count(dir: &Path) -> usize {
        std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
    }

    #[test]
    fn deep_trees_are_flattened_not_recursed() {
        let root = Root::new();
        let vol = root.vol();
        std::fs::create_dir(vol.join("d")).unwrap();
        std::fs::write(vol.join("d/bottom"), "x").unwrap();
        for _ in 0..3000 {
            std::fs::create_dir(vol.join("up")).unwrap();
            std::fs::rename(vol.join("d"), vol.join("up/d")).unwrap();
            std::fs::rename(vol.join("up"), vol.join("d")).unwrap();
        }
        let (_, last) = run(&root, Budget::DEFAULT);
        assert!(matches!(last, Deletion::Deleted { .. }), "{last:?}");
        assert!(!vol.exists());
        assert_eq!(count(&root.trash()), 0);
    }

    #[test]
    fn a_small_budget_takes_several_calls_and_the_path_is_free_after_the_first() {
        let root = Root::new();
        for i in 0..50 {
            std::fs::write(root.vol().join(format!("f{i}")), "x").unwrap();
        }
        let dir = root.dir();
        let first = delete_volume_dir(&dir, &dir, "vol", "pvc-1", Budget::operations(10));
        assert!(
            matches!(first, Ok(Deletion::InProgress { operations: 10, .. })),
            "{first:?}"
        );
        assert!(!root.vol().exists(), "moved to the trash at once");
        let (calls, last) = run(&root, Budget::operations(10));
        assert!(calls >= 4, "{calls}");
        assert!(matches!(last, Deletion::Deleted { .. }), "{last:?}");
        // Nothing left: the next call says so.
        assert_eq!(
            delete_volume_dir(&dir, &dir, "vol", "pvc-1", Budget::DEFAULT).unwrap(),
            Deletion::Gone
        );
    }

    #[test]
    fn unnameable_entries_are_left_aside_and_reported() {
        let root = Root::new();
        let vol = root.vol();
        let bad = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::write(vol.join(bad), "x").unwrap();
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::write(vol.join("a/b").join(bad), "x").unwrap();
        std::fs::write(vol.join("a/b/ok"), "x").unwrap();
        std::fs::write(vol.join("ok"), "x").unwrap();
        let (_, last) = run(&root, Budget::DEFAULT);
        let Deletion::Remnants { stuck, at } = last else {
            panic!("{last:?}");
        };
        assert_eq!(stuck, 2, "the file and the directory holding the other one");
        assert!(at.ends_with(&format!("{TRASH}/pvc-1.remnants-1")), "{at}");
        assert!(!vol.exists());
        // A later deletion of the same PV name is not blocked by the remnants.
        std::fs::create_dir(&vol).unwrap();
        std::fs::write(vol.join(bad), "x").unwrap();
        let (_, again) = run(&root, Budget::DEFAULT);
        assert!(
            matches!(&again, Deletion::Remnants { at, .. } if at.ends_with("pvc-1.remnants-2")),
            "{again:?}"
        );
    }

    #[test]
    fn symbolic_links_are_removed_not_followed() {
        let root = Root::new();
        let outside = root.0.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.vol().join("link")).unwrap();
        let (_, last) = run(&root, Budget::DEFAULT);
        assert!(matches!(last, Deletion::Deleted { .. }), "{last:?}");
        assert!(outside.join("keep").exists(), "the link's target survives");
    }

    #[test]
    fn a_symbolic_link_as_the_volume_is_refused() {
        let root = Root::new();
        std::fs::remove_dir(root.vol()).unwrap();
        std::os::unix::fs::symlink(root.trash(), root.vol()).unwrap();
        let dir = root.dir();
        let e = delete_volume_dir(&dir, &dir, "vol", "pvc-1", Budget::DEFAULT).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotDirectory, "{e}");
    }

    #[test]
    fn budget_from_params() {
        let p = crate::testing::string_map(&[("deleteChunkEntries", "500")]);
        assert_eq!(
            Budget::from_params(&crate::Params::new(&p)).unwrap(),
            Budget::operations(500)
        );
        for bad in ["0", "-1", "x", "10000001"] {
            let p = crate::testing::string_map(&[("deleteChunkEntries", bad)]);
            let e = Budget::from_params(&crate::Params::new(&p)).unwrap_err();
            assert!(e.0.contains("deleteChunkEntries"), "{e:?}");
        }
        assert_eq!(
            Budget::from_params(&crate::Params::new(&[])).unwrap(),
            Budget::DEFAULT
        );
    }
}
