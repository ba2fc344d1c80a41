//! Kubeconfig files for hosts that must run with a ServiceAccount's RBAC instead of the
//! admin's: the admin kubeconfig (same server, same CA) with every user's credentials
//! replaced by a bearer token.

use std::path::Path;

use anyhow::{Context as _, bail};

/// Writes to `out` a copy of the kubeconfig `admin` whose users authenticate with
/// `token` only (client certificates, exec plugins and the like are dropped).
pub fn write_with_token(admin: &Path, token: &str, out: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(admin).with_context(|| format!("reading {}", admin.display()))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", admin.display()))?;
    let Some(users) = config
        .get_mut("users")
        .and_then(serde_yaml::Value::as_sequence_mut)
    else {
        bail!("{} has no users", admin.display());
    };
    if users.is_empty() {
        bail!("{} has no users", admin.display());
    }
    for user in users {
        let mut credentials = serde_yaml::Mapping::new();
        credentials.insert("token".into(), token.into());
        let Some(user) = user.as_mapping_mut() else {
            bail!("{}: a user entry is not a mapping", admin.display());
        };
        user.insert("user".into(), serde_yaml::Value::Mapping(credentials));
    }
    let text = serde_yaml::to_string(&config)?;
    write_private(out, &text).with_context(|| format!("writing {}", out.display()))
}

/// Writes a file only its owner can read: it holds a credential.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}
