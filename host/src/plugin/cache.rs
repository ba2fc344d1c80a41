//! The precompiled-component cache: native code of each module version on disk, so a
//! restart or a reload of a known version does not compile again.
//!
//! Entries are keyed by the sha256 of the module bytes plus a digest of
//! `Engine::precompile_compatibility_hash` (wasmtime version, target, settings): an
//! entry made by another engine is never looked at. Loading an entry maps native code
//! into the process, so the directory must be writable by the host alone (it is created
//! with mode 0700); entries are written to a temporary file and renamed into place, never
//! changed in place (they are mmapped).

use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileOutcome {
    /// Compiled now (and stored, when there is a cache).
    Compiled,
    /// Loaded from the cache without compiling.
    CacheHit,
}

/// A directory of precompiled components.
#[derive(Debug, Clone)]
pub struct PrecompiledCache {
    dir: PathBuf,
    engine_digest: String,
}

impl PrecompiledCache {
    /// Opens (creating if needed) the cache directory for `engine`.
    pub fn open(dir: &Path, engine: &Engine) -> std::io::Result<Self> {
        create_private_dir(dir)?;
        Ok(PrecompiledCache {
            dir: dir.to_path_buf(),
            engine_digest: engine_digest(engine),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of the module whose bytes hash to `sha256`.
    pub fn entry(&self, sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{sha256}-{}.cwasm", &self.engine_digest[..16]))
    }

    /// The component for `bytes` (whose digest is `sha256`): from the cache, or
    /// compiled and stored.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        sha256: &str,
    ) -> wasmtime::Result<(Component, CompileOutcome)> {
        let entry = self.entry(sha256);
        if entry.is_file() {
            match deserialize_trusted(engine, &entry) {
                Ok(component) => return Ok((component, CompileOutcome::CacheHit)),
                Err(error) => {
                    tracing::warn!(
                        entry = %entry.display(),
                        "unusable precompiled cache entry, compiling again: {error:#}"
                    );
                    let _ = std::fs::remove_file(&entry);
                }
            }
        }
        let native = engine.precompile_component(bytes)?;
        self.store(&entry, &native)?;
        let component = deserialize_trusted(engine, &entry)?;
        Ok((component, CompileOutcome::Compiled))
    }

    fn store(&self, entry: &Path, native: &[u8]) -> std::io::Result<()> {
        let temporary = self.dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            entry
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("entry")
        ));
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(native)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, entry)
    }
}

/// Maps a precompiled component from the cache into the process.
///
/// The one `unsafe` of the crate. `Component::deserialize_file` is unsafe because it
/// trusts the file to be native code produced by `Engine::precompile_component` of a
/// compatible engine: a tampered file is arbitrary code execution. That holds here
/// because the only writer of the cache directory is this host (mode 0700, created by
/// [`PrecompiledCache::open`]), entries are named by the sha256 of the module they came
/// from plus the engine's compatibility digest, and they are renamed into place whole
/// (wasmtime also checks the engine compatibility header and rejects a mismatch).
#[allow(unsafe_code)]
fn deserialize_trusted(engine: &Engine, entry: &Path) -> wasmtime::Result<Component> {
    // SAFETY: see above: the file was written by `PrecompiledCache::store` from
    // `Engine::precompile_component` output, in a directory only this host writes.
    unsafe { Component::deserialize_file(engine, entry) }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
    }
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
    use super::*;

    #[test]
    fn entries_are_keyed_by_module_and_engine() {
        let engine = super::super::engine::new_engine().unwrap();
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
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(cache.dir()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }
}
