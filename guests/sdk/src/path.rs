//! Path checks for names that come from requests. Claim names, namespaces, labels and
//! annotations are user-controlled: never build a path from them unchecked.

use std::fmt;

/// The longest path component Linux accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// The longest path this module accepts (well below PATH_MAX).
pub const PATH_MAX: usize = 1024;

/// Why a name or path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError(pub String);

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PathError {}

/// A name from the request that cannot be used will not become usable on retry.
impl From<PathError> for crate::ProvisionError {
    fn from(e: PathError) -> Self {
        crate::ProvisionError::Infeasible(e.0)
    }
}

impl From<PathError> for crate::DeleteError {
    fn from(e: PathError) -> Self {
        crate::DeleteError::Failed(e.0)
    }
}

impl From<PathError> for crate::ExpandError {
    fn from(e: PathError) -> Self {
        crate::ExpandError::Failed(e.0)
    }
}

/// Checks that `name` is safe as one path component: not empty, not `.` or `..`, no `/`,
/// no NUL, no other control character, at most [`NAME_MAX`] bytes.
pub fn check_component(name: &str) -> Result<&str, PathError> {
    let bad = |why: &str| Err(PathError(format!("unsafe path component {name:?}: {why}")));
    if name.is_empty() {
        bad("empty")
    } else if name == "." || name == ".." {
        bad("a relative directory reference")
    } else if name.contains('/') {
        bad("contains '/'")
    } else if name.contains('\0') {
        bad("contains NUL")
    } else if name.chars().any(char::is_control) {
        bad("contains a control character")
    } else if name.len() > NAME_MAX {
        bad("longer than 255 bytes")
    } else {
        Ok(name)
    }
}

/// True for a PV name of the form `pvc-<claim uid>`: `pvc-` followed by 1 to 249
/// lowercase letters, digits or `-` (a Kubernetes UID is a lowercase UUID).
pub fn is_pv_name(name: &str) -> bool {
    match name.strip_prefix("pvc-") {
        Some(uid) => {
            !uid.is_empty()
                && uid.len() <= 249
                && uid
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        }
        None => false,
    }
}

/// [`is_pv_name`] as a `Result` with a message.
pub fn check_pv_name(name: &str) -> Result<&str, PathError> {
    if is_pv_name(name) {
        Ok(name)
    } else {
        Err(PathError(format!(
            "volume name {name:?} is not of the form pvc-<claim uid>"
        )))
    }
}

/// Checks a relative path made of safe components (see [`check_component`]) separated by
/// `/`, and returns it normalised: repeated and trailing `/` removed. Refuses an empty
/// path, an absolute path, `.` and `..` components, and paths over [`PATH_MAX`] bytes.
pub fn check_relative(path: &str) -> Result<String, PathError> {
    if path.starts_with('/') {
        return Err(PathError(format!(
            "path {path:?} is absolute, not relative"
        )));
    }
    normalise(path, false)
}

/// Checks an absolute path: starts with `/`, components safe (see [`check_component`]),
/// at most [`PATH_MAX`] bytes. Returns it normalised (repeated and trailing `/` removed;
/// `/` stays `/`).
pub fn check_absolute(path: &str) -> Result<String, PathError> {
    if !path.starts_with('/') {
        return Err(PathError(format!("path {path:?} is not absolute")));
    }
    normalise(path, true)
}

fn normalise(path: &str, absolute: bool) -> Result<String, PathError> {
    if path.len() > PATH_MAX {
        return Err(PathError(format!(
            "path of {} bytes is longer than {PATH_MAX}",
            path.len()
        )));
    }
    let mut parts = Vec::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        check_component(part).map_err(|e| PathError(format!("path {path:?}: {e}")))?;
        parts.push(part);
    }
    match (absolute, parts.is_empty()) {
        (true, true) => Ok("/".to_string()),
        (true, false) => Ok(format!("/{}", parts.join("/"))),
        (false, true) => Err(PathError(format!("path {path:?} is empty"))),
        (false, false) => Ok(parts.join("/")),
    }
}

/// Joins a normalised base directory and a relative path with exactly one `/`.
pub fn join(base: &str, rel: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        rel.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        assert!(check_component("pvc-1").is_ok());
        assert!(check_component("a b.c").is_ok());
        for bad in ["", ".", "..", "a/b", "/", "a\0b", "a\nb"] {
            assert!(check_component(bad).is_err(), "{bad:?}");
        }
        assert!(check_component(&"x".repeat(255)).is_ok());
        assert!(check_component(&"x".repeat(256)).is_err());
    }

    #[test]
    fn pv_names() {
        assert!(is_pv_name("pvc-0b5c6f8e-7d1a-4c3b-9a2e-1f0d9c8b7a65"));
        assert!(is_pv_name("pvc-1"));
        for bad in [
            "pvc-", "pv-1", "pvc-../x", "pvc-A", "pvc-a/b", "pvc-a.b", "x",
        ] {
            assert!(!is_pv_name(bad), "{bad:?}");
        }
        assert!(
            check_pv_name("nope")
                .unwrap_err()
                .0
                .contains("pvc-<claim uid>")
        );
    }

    #[test]
    fn relative_paths() {
        assert_eq!(check_relative("a//b/").unwrap(), "a/b");
        for bad in ["", "/", "/a", "a/../b", "..", "./a", "a/\0"] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
        assert!(check_relative(&"a/".repeat(600)).is_err());
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(check_absolute("/volumes/").unwrap(), "/volumes");
        assert_eq!(check_absolute("//a//b").unwrap(), "/a/b");
        assert_eq!(check_absolute("/").unwrap(), "/");
        for bad in ["", "a", "/a/../b", "/a/./b"] {
            assert!(check_absolute(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn joins() {
        assert_eq!(join("/a/", "b"), "/a/b");
        assert_eq!(join("/", "b"), "/b");
        assert_eq!(join("/a", "b/c"), "/a/b/c");
    }
}
