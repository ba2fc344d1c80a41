//! The precompiled-component cache: native code of each module version on disk, so a
//! restart or a reload of a known version does not compile again.
//!
//! Loading an entry is running native code, so nothing in the directory is trusted
//! because of where it is:
//! - **The directory is private.** It is created mode 0700 if missing, then opened once
//!   and checked on every start, on the opened descriptor: it must be a directory owned
//!   by the host's user with no group or other permission bits. Otherwise the runtime
//!   does not start ([`CacheError::NotPrivate`] says the `chown`/`chmod` to run): a
//!   cache someone else can write is a way to run code as the host, and silently
//!   compiling instead would hide that. All entry I/O is relative to the opened
//!   descriptor, so renaming the directory or a parent afterwards changes nothing.
//! - **Entries are named** by the sha256 of the module bytes plus a digest of
//!   `Engine::precompile_compatibility_hash` (wasmtime version, target, settings): an
//!   entry made by another engine is never looked at.
//! - **Entries are verified before deserialising.** Beside each entry `X.cwasm` is
//!   `X.cwasm.mac`, the HMAC-SHA256 of the entry's name and bytes under a 32-byte key
//!   kept in the directory (`cache.key`, created 0600 from the OS's random source on
//!   first use). An entry is read into memory, its MAC checked, and only the verified
//!   bytes are deserialised (not the file, which could change after the check). A
//!   missing, wrong or unreadable MAC (another module's valid entry copied over this
//!   one, a half-written pair, an entry of an older host) is a cache miss plus a
//!   warning: the pair is removed and the module compiled again. Because the entry's
//!   name is part of the MAC, a valid pair copied to another name fails too; because
//!   the key is needed, whoever can replace entries but not read the key cannot forge
//!   one. A key file that is not a private regular file of the host's user, or not 32
//!   bytes, is replaced by a new key (with a warning): every entry then misses once.
//! - Entries and MACs are written to a temporary file (0600, `O_EXCL`) and renamed into
//!   place, never changed in place.

use std::hash::{Hash, Hasher};
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The key file in the cache directory.
const KEY_FILE: &str = "cache.key";
const KEY_BYTES: usize = 32;
/// The extension of an entry's MAC file, after the entry's own name.
const MAC_EXTENSION: &str = "mac";
/// Largest entry read back: entries are ~3-4x their module, so this is far above any
/// real one, and bounds what a planted file can make the host read.
const MAX_ENTRY_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Tells the MAC of an entry apart from any other use of the key.
const MAC_CONTEXT: &[u8] = b"wasm-provisioner precompiled component v1\0";

/// Why the cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create or open it: {0}")]
    Open(std::io::Error),
    #[error(
        "it is {problem}, so someone other than this host (uid {host_uid}) could put native \
         code in it; run `chown {host_uid} {dir} && chmod 700 {dir}`, or point --cache-dir at \
         a directory the host creates (a new subdirectory is created mode 0700)",
        dir = dir.display()
    )]
    NotPrivate {
        dir: PathBuf,
        problem: String,
        host_uid: u32,
    },
    #[error("cannot create its key file {KEY_FILE}: {0}")]
    Key(std::io::Error),
}

impl CacheError {
    /// Whether the directory or its key could not be created because its filesystem is
    /// full (or over quota): a tenant filling a hostPath volume on the node's disk can
    /// cause that, and it is no reason to trust the directory less, only to do without
    /// it. Every other problem (not private, unreadable) stays fatal.
    pub fn is_out_of_space(&self) -> bool {
        let io = match self {
            CacheError::Open(io) | CacheError::Key(io) => io,
            CacheError::NotPrivate { .. } => return false,
        };
        matches!(
            io.raw_os_error(),
            Some(code) if code == libc::ENOSPC || code == libc::EDQUOT
        )
    }
}

/// A directory of precompiled components.
#[derive(Clone)]
pub struct PrecompiledCache {
    dir: PathBuf,
    /// The directory, opened and checked once; every entry is opened relative to it.
    handle: Arc<OwnedFd>,
    engine_digest: String,
    key: Arc<[u8; KEY_BYTES]>,
}

impl std::fmt::Debug for PrecompiledCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("PrecompiledCache")
            .field("dir", &self.dir)
            .field("engine_digest", &self.engine_digest)
            .finish_non_exhaustive()
    }
}

impl PrecompiledCache {
    /// Opens (creating if needed) the cache directory for `engine`, checks that only the
    /// host can write it, and loads (or creates) its key.
    pub fn open(dir: &Path, engine: &Engine) -> Result<Self, CacheError> {
        create_private_dir(dir).map_err(CacheError::Open)?;
        let handle = rustix::fs::openat(
            CWD,
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CacheError::Open(e.into()))?;
        let host_uid = rustix::process::geteuid().as_raw();
        let stat = rustix::fs::fstat(&handle).map_err(|e| CacheError::Open(e.into()))?;
        if let Some(problem) = not_private(stat.st_uid, stat.st_mode, host_uid) {
            return Err(CacheError::NotPrivate {
                dir: dir.to_path_buf(),
                problem,
                host_uid,
            });
        }
        let key = load_or_create_key(&handle, dir, host_uid).map_err(CacheError::Key)?;
        Ok(PrecompiledCache {
            dir: dir.to_path_buf(),
            handle: Arc::new(handle),
            engine_digest: engine_digest(engine),
            key: Arc::new(key),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of the module whose bytes hash to `sha256`.
    pub fn entry(&self, sha256: &str) -> PathBuf {
        self.dir.join(self.entry_name(sha256))
    }

    fn entry_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", &self.engine_digest[..16])
    }

    /// The component of the module whose bytes hash to `sha256`, if the cache holds a
    /// verified entry this engine accepts. An entry that must not be used (wrong MAC,
    /// not private, another engine's) is removed with a warning: a miss.
    pub fn lookup(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let name = self.entry_name(sha256);
        let reason = match self.read_verified(&name) {
            Ok(None) => return None,
            Ok(Some(native)) => match deserialize_verified(engine, &native) {
                Ok(component) => return Some(component),
                // Verified but unusable: written by this host with another wasmtime.
                Err(error) => format!("{error:#}"),
            },
            Err(reason) => reason,
        };
        tracing::warn!(
            entry = %self.dir.join(&name).display(),
            "precompiled cache entry refused, compiling again: {reason}"
        );
        for file in [name.clone(), mac_name(&name)] {
            let _ = rustix::fs::unlinkat(&*self.handle, file.as_str(), AtFlags::empty());
        }
        None
    }

    /// Stores `native`, this host's own `precompile_component` output for the module
    /// whose bytes hash to `sha256` (compiled in process or in its compile child), and
    /// returns it as a component. A failure to store is a warning: the next start
    /// compiles again.
    pub fn store_compiled(
        &self,
        engine: &Engine,
        sha256: &str,
        native: &[u8],
    ) -> wasmtime::Result<Component> {
        let name = self.entry_name(sha256);
        if let Err(error) = self.store(&name, native) {
            tracing::warn!(
                dir = %self.dir.display(),
                "cannot store a precompiled component (the next start compiles it again): {error}"
            );
        }
        deserialize_verified(engine, native)
    }

    /// The entry's bytes if it exists and its MAC verifies; `Ok(None)` if there is no
    /// entry; `Err(why)` if there is one that must not be used.
    fn read_verified(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let native = match read_private_file(&self.handle, name, MAX_ENTRY_BYTES) {
            Ok(native) => native,
            Err(ReadError::Missing) => return Ok(None),
            Err(error) => return Err(error.to_string()),
        };
        let mac = read_private_file(&self.handle, &mac_name(name), 2 * 32 + 1)
            .map_err(|error| format!("its MAC file {}: {error}", mac_name(name)))?;
        let mac = std::str::from_utf8(&mac)
            .ok()
            .and_then(|text| hex::decode(text.trim()).ok())
            .ok_or_else(|| format!("its MAC file {} is not hex", mac_name(name)))?;
        if !constant_time_eq(&mac, &entry_mac(&self.key, name, &native)) {
            return Err(
                "its MAC does not match: it was not written under this name by a host holding \
                 the cache's key (another module's entry copied over it, or tampering)"
                    .into(),
            );
        }
        Ok(Some(native))
    }

    fn store(&self, name: &str, native: &[u8]) -> std::io::Result<()> {
        write_private_file(&self.handle, name, native)?;
        let mac = hex::encode(entry_mac(&self.key, name, native));
        write_private_file(&self.handle, &mac_name(name), mac.as_bytes())
    }
}

/// Turns verified native code into a component.
///
/// The one `unsafe` of the crate. `Component::deserialize` is unsafe because it trusts
/// the bytes to be native code produced by `Engine::precompile_component` of a
/// compatible engine: tampered bytes are arbitrary code execution. Callers pass either
/// the output of `precompile_component` itself (in this process, or in this host's own
/// binary run as its compile child, read straight from the child's pipe), or bytes read
/// from the cache whose
/// HMAC under the cache's private key, over the entry's name and bytes, was just
/// checked ([`PrecompiledCache::read_verified`]) in memory, so the file cannot change
/// between check and use (wasmtime also checks the engine compatibility header and
/// rejects a mismatch).
#[allow(unsafe_code)]
pub(crate) fn deserialize_verified(engine: &Engine, native: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: see above: `native` is this host's own `precompile_component` output,
    // directly (in process or from its compile child) or authenticated by the cache's
    // keyed MAC.
    unsafe { Component::deserialize(engine, native) }
}

fn mac_name(entry: &str) -> String {
    format!("{entry}.{MAC_EXTENSION}")
}

fn entry_mac(key: &[u8; KEY_BYTES], name: &str, native: &[u8]) -> [u8; 32] {
    hmac_sha256(key, &[MAC_CONTEXT, name.as_bytes(), b"\0", native])
}

/// HMAC-SHA256 (RFC 2104) over the concatenation of `parts`.
fn hmac_sha256(key: &[u8; KEY_BYTES], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    block[..KEY_BYTES].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What is wrong with a directory meant to be private to `host_uid`, if anything.
fn not_private(owner: u32, mode: u32, host_uid: u32) -> Option<String> {
    let mut problems = Vec::new();
    if FileType::from_raw_mode(mode) != FileType::Directory {
        problems.push("not a directory".to_string());
    }
    if owner != host_uid {
        problems.push(format!("owned by uid {owner}"));
    }
    if mode & 0o077 != 0 {
        problems.push(format!("mode {:04o}, not 0700", mode & 0o7777));
    }
    (!problems.is_empty()).then(|| problems.join(" and "))
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("it does not exist")]
    Missing,
    #[error("it is not a private regular file of the host: {0}")]
    NotPrivate(String),
    #[error("{0}")]
    Io(std::io::Error),
}

/// Reads `name` in `dir` if it is a regular file (not a symlink), owned by this host,
/// not accessible to group or others, at most `max` bytes.
fn read_private_file(dir: &OwnedFd, name: &str, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(file) => file,
        Err(Errno::NOENT) => return Err(ReadError::Missing),
        Err(Errno::LOOP) => return Err(ReadError::NotPrivate("a symlink".into())),
        Err(errno) => return Err(ReadError::Io(errno.into())),
    };
    let stat = rustix::fs::fstat(&file).map_err(|e| ReadError::Io(e.into()))?;
    let host_uid = rustix::process::geteuid().as_raw();
    let mut problems = Vec::new();
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        problems.push("not a regular file".to_string());
    }
    if stat.st_uid != host_uid {
        problems.push(format!("owned by uid {}", stat.st_uid));
    }
    if stat.st_mode & 0o077 != 0 {
        problems.push(format!("mode {:04o}", stat.st_mode & 0o7777));
    }
    if stat.st_size as u64 > max {
        problems.push(format!("{} bytes, more than {max}", stat.st_size));
    }
    if !problems.is_empty() {
        return Err(ReadError::NotPrivate(problems.join(", ")));
    }
    let mut bytes = Vec::with_capacity(stat.st_size as usize);
    std::fs::File::from(file)
        .take(max)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    Ok(bytes)
}

/// Writes `name` in `dir` whole: a new 0600 temporary file, synced, renamed into place.
fn write_private_file(dir: &OwnedFd, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let temporary = format!(
        ".tmp-{}-{}-{name}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    );
    let file = rustix::fs::openat(
        dir,
        temporary.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = std::fs::File::from(file);
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    let renamed = written.and_then(|()| {
        rustix::fs::renameat(dir, temporary.as_str(), dir, name).map_err(Into::into)
    });
    if renamed.is_err() {
        let _ = rustix::fs::unlinkat(dir, temporary.as_str(), AtFlags::empty());
    }
    renamed
}

/// The cache's key: read if it is a private 32-byte file of the host, else made anew.
fn load_or_create_key(
    dir: &OwnedFd,
    path: &Path,
    host_uid: u32,
) -> std::io::Result<[u8; KEY_BYTES]> {
    let problem = match read_private_file(dir, KEY_FILE, KEY_BYTES as u64 + 1) {
        Ok(bytes) if bytes.len() == KEY_BYTES => {
            let mut key = [0u8; KEY_BYTES];
            key.copy_from_slice(&bytes);
            return Ok(key);
        }
        Ok(bytes) => Some(format!("{} bytes, not {KEY_BYTES}", bytes.len())),
        Err(ReadError::Missing) => None,
        Err(error) => Some(error.to_string()),
    };
    if let Some(problem) = problem {
        tracing::warn!(
            key = %path.join(KEY_FILE).display(),
            host_uid,
            "the precompiled cache's key file is unusable ({problem}); making a new key, so \
             every cached entry is compiled again once"
        );
        let _ = rustix::fs::unlinkat(dir, KEY_FILE, AtFlags::empty());
    }
    let mut key = [0u8; KEY_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    write_private_file(dir, KEY_FILE, &key)?;
    Ok(key)
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// A stable digest of the engine's compatibility hash (a `Hash` value, fed to sha256).
fn engine_digest(engine: &Engine) -> String {
    struct Sha256Hasher(Sha256);
    impl Hasher for Sha256Hasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(hasher.0.finalize())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn only_a_full_filesystem_lets_the_host_run_without_its_cache() {
        let errno = |code| std::io::Error::from_raw_os_error(code);
        assert!(CacheError::Open(errno(libc::ENOSPC)).is_out_of_space());
        assert!(CacheError::Key(errno(libc::EDQUOT)).is_out_of_space());
        assert!(!CacheError::Open(errno(libc::EACCES)).is_out_of_space());
        assert!(!CacheError::Key(errno(libc::EROFS)).is_out_of_space());
        let not_private = CacheError::NotPrivate {
            dir: "/x".into(),
            problem: "mode 0777".into(),
            host_uid: 0,
        };
        assert!(!not_private.is_out_of_space());
    }

    #[test]
    fn entries_are_keyed_by_module_and_engine() {
        let engine = super::super::engine::new_engine(Default::default())
            .unwrap()
            .0;
        let dir = tempfile::tempdir().unwrap();
        let cache = PrecompiledCache::open(&dir.path().join("cache"), &engine).unwrap();
        let a = cache.entry(&"a".repeat(64));
        let b = cache.entry(&"b".repeat(64));
        assert_ne!(a, b);
        assert!(
            a.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&"a".repeat(64))
        );
        assert_eq!(engine_digest(&engine), engine_digest(&engine));
        let mode = std::fs::metadata(cache.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let key = cache.dir().join(KEY_FILE);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // The key survives a restart.
        let again = PrecompiledCache::open(cache.dir(), &engine).unwrap();
        assert_eq!(again.key, cache.key);
        assert!(!format!("{cache:?}").contains(&hex::encode(*cache.key)));
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 1 uses a 20-byte key; pad it to 32 with zeros, which HMAC
        // does anyway (keys shorter than the block are zero-padded).
        let mut key = [0u8; KEY_BYTES];
        key[..20].copy_from_slice(&[0x0b; 20]);
        assert_eq!(
            hex::encode(hmac_sha256(&key, &[b"Hi ", b"There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
    }

    #[test]
    fn only_a_private_directory_of_the_host_is_accepted() {
        const DIR: u32 = 0o040000;
        assert_eq!(not_private(1000, DIR | 0o700, 1000), None);
        assert_eq!(not_private(1000, DIR | 0o500, 1000), None);
        for (owner, mode, expected) in [
            (1000, DIR | 0o777, "mode 0777, not 0700"),
            (1000, DIR | 0o750, "mode 0750, not 0700"),
            (1000, DIR | 0o1777, "mode 1777, not 0700"),
            (0, DIR | 0o700, "owned by uid 0"),
            (1000, 0o100000 | 0o600, "not a directory"),
        ] {
            let problem = not_private(owner, mode, 1000).unwrap();
            assert!(problem.contains(expected), "{problem}");
        }
    }

    #[test]
    fn a_bad_key_file_is_replaced() {
        let engine = super::super::engine::new_engine(Default::default())
            .unwrap()
            .0;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache");
        let first = PrecompiledCache::open(&path, &engine).unwrap();
        let key = path.join(KEY_FILE);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let second = PrecompiledCache::open(&path, &engine).unwrap();
        assert_ne!(first.key, second.key, "a readable key is a leaked key");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
