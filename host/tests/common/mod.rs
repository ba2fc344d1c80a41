//! What the host's integration tests share: the built guest components.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
