//! The module store: a content-addressed directory of what was pulled, so a restart or
//! a second replica sharing it does not download again, and an air-gapped cluster can
//! be given a pre-filled one.
//!
//! It is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/<hex>`), the
//! layout `oras copy --to-oci-layout` and `crane pull --format=oci` write: a pre-filled
//! store is made with either. A blob is trusted for what its name says only: it is
//! read into memory (bounded) and its sha256 checked against its name before use; a
//! blob that does not match is removed and counts as missing. `index.json` maps
//! references (a module's tag, a signature tag) to manifest digests; it is only a hint
//! (a tag resolved while the registry answered), never a reason to trust bytes.
//! Writes go to a temporary file renamed into place, so two replicas writing the same
//! blob at once each leave a whole file.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The annotation naming a manifest in `index.json` (the OCI image layout's).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The module store directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the module store {dir}: {source}")]
pub struct StoreError {
    pub dir: PathBuf,
    pub source: std::io::Error,
}

impl Store {
    /// Opens (creating it if missing) the store at `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let error = |source| StoreError {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir.join("blobs/sha256")).map_err(error)?;
        let layout = dir.join("oci-layout");
        if !layout.exists() {
            write_atomically(&layout, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(error)?;
        }
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn blob_path(&self, hex: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(hex)
    }

    /// The blob `sha256:<hex>`, if the store has it whole and it is at most `max_bytes`.
    /// A blob whose bytes do not hash to its name is removed (with a warning).
    pub fn get(&self, hex: &str, max_bytes: u64) -> Option<Vec<u8>> {
        if !is_sha256_hex(hex) {
            return None;
        }
        let path = self.blob_path(hex);
        let file = std::fs::File::open(&path).ok()?;
        let mut bytes = Vec::new();
        if file
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .is_err()
            || bytes.len() as u64 > max_bytes
        {
            return None;
        }
        if hex::encode(Sha256::digest(&bytes)) != hex {
            tracing::warn!(
                blob = %path.display(),
                "a blob in the module store does not match its name (changed on disk, or \
                 half-written); removed, it is pulled again"
            );
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some(bytes)
    }

    /// Keeps `bytes` as the blob named by their sha256; returns the hex digest.
    pub fn put(&self, bytes: &[u8]) -> std::io::Result<String> {
        let hex = hex::encode(Sha256::digest(bytes));
        let path = self.blob_path(&hex);
        if !path.exists() {
            write_atomically(&path, bytes)?;
        }
        Ok(hex)
    }

    /// The manifest digest (`<hex>`) `index.json` records for `reference` (a full
    /// `registry/repository:tag`, or the bare tag as `oras copy` writes it).
    pub fn pinned(&self, reference: &str, tag: &str) -> Option<String> {
        let index = self.index();
        index["manifests"].as_array()?.iter().find_map(|entry| {
            let name = entry["annotations"][REF_NAME].as_str()?;
            (name == reference || name == tag)
                .then(|| entry["digest"].as_str()?.strip_prefix("sha256:"))
                .flatten()
                .filter(|hex| is_sha256_hex(hex))
                .map(str::to_string)
        })
    }

    /// Records in `index.json` that `reference` names the manifest `hex` (of
    /// `media_type`, `size` bytes).
    pub fn pin(&self, reference: &str, hex: &str, media_type: &str, size: usize) {
        let mut index = self.index();
        let entry = serde_json::json!({
            "mediaType": media_type,
            "digest": format!("sha256:{hex}"),
            "size": size,
            "annotations": { REF_NAME: reference },
        });
        let manifests = index["manifests"].as_array_mut();
        let Some(manifests) = manifests else {
            return;
        };
        manifests.retain(|m| m["annotations"][REF_NAME].as_str() != Some(reference));
        manifests.push(entry);
        let written = serde_json::to_vec_pretty(&index)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_atomically(&self.dir.join("index.json"), &bytes));
        if let Err(error) = written {
            tracing::warn!(store = %self.dir.display(), "cannot update the module store's index.json: {error}");
        }
    }

    fn index(&self) -> serde_json::Value {
        std::fs::read(self.dir.join("index.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .filter(|index| index["manifests"].is_array())
            .unwrap_or_else(|| serde_json::json!({ "schemaVersion": 2, "manifests": [] }))
    }
}

pub fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temporary = tempfile::NamedTempFile::new_in(dir)?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    temporary.persist(path).map_err(|error| error.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_verified_on_read_and_pins_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let hex = store.put(b"module bytes").unwrap();
        assert_eq!(store.get(&hex, 100).as_deref(), Some(&b"module bytes"[..]));
        // Over the bound: not read.
        assert_eq!(store.get(&hex, 5), None);
        // Changed on disk: removed, a miss.
        std::fs::write(dir.path().join("blobs/sha256").join(&hex), b"other bytes").unwrap();
        assert_eq!(store.get(&hex, 100), None);
        assert!(!dir.path().join("blobs/sha256").join(&hex).exists());
        assert_eq!(store.get("../../etc/passwd", 100), None);

        store.pin(
            "r.example.com/m:v1",
            &hex,
            "application/vnd.oci.image.manifest.v1+json",
            3,
        );
        store.pin(
            "r.example.com/m:v1",
            &"0".repeat(64),
            "application/vnd.oci.image.manifest.v1+json",
            3,
        );
        let reopened = Store::open(dir.path()).unwrap();
        assert_eq!(
            reopened.pinned("r.example.com/m:v1", "v1"),
            Some("0".repeat(64))
        );
        assert_eq!(reopened.pinned("r.example.com/m:v2", "v2"), None);
    }
}
