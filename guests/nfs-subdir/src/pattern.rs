//! `pathPattern`: the syntax of nfs-subdir-external-provisioner, with checked values.
//!
//! Variables: `${.PVC.name}`, `${.PVC.namespace}`, `${.PVC.labels.<key>}`,
//! `${.PVC.annotations.<key>}`. A missing label or annotation expands to the empty string
//! (as upstream). Everything else is literal text.
//!
//! Unlike upstream, which joins whatever the claim says onto the share, the result is
//! checked: a value containing a `.` or `..` component or a control character is refused,
//! and so is any expansion with such a component or a component over 255 bytes. A value
//! may contain `/` (an annotation such as `a/b` makes nested directories); empty
//! components (`a//b`, a leading or trailing `/`) are dropped, so the result is always
//! relative to the share. An unknown variable or an unterminated `${` is an error.

use wasm_provisioner_sdk::{Claim, lookup, path};

/// Expands `pattern` for `claim` into a normalised relative path, or `None` when the
/// expansion is empty (upstream then uses the default directory name).
pub fn expand(pattern: &str, claim: &Claim) -> Result<Option<String>, String> {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            format!("StorageClass parameter `pathPattern` {pattern:?}: unterminated ${{")
        })?;
        let var = &after[..end];
        let (what, value) = variable(var, claim).ok_or_else(|| {
            format!(
                "StorageClass parameter `pathPattern` {pattern:?}: unknown variable ${{{var}}}: \
                 use ${{.PVC.name}}, ${{.PVC.namespace}}, ${{.PVC.labels.<key>}} or \
                 ${{.PVC.annotations.<key>}}"
            )
        })?;
        check_value(&what, value)?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if out.split('/').all(str::is_empty) {
        return Ok(None);
    }
    path::check_relative(out.trim_start_matches('/'))
        .map(Some)
        .map_err(|e| {
            format!(
                "StorageClass parameter `pathPattern` {pattern:?} expands to an unusable path: {e}"
            )
        })
}

/// The value of one `${...}` variable (the text between the braces) and a description of
/// where it came from, for messages.
fn variable<'a>(var: &str, claim: &'a Claim) -> Option<(String, &'a str)> {
    let field = var.strip_prefix(".PVC.")?;
    if let Some(key) = field.strip_prefix("labels.") {
        Some((
            format!("label {key:?}"),
            lookup(&claim.labels, key).unwrap_or(""),
        ))
    } else if let Some(key) = field.strip_prefix("annotations.") {
        Some((
            format!("annotation {key:?}"),
            lookup(&claim.annotations, key).unwrap_or(""),
        ))
    } else if field == "name" {
        Some(("name".to_string(), &claim.name))
    } else if field == "namespace" {
        Some(("namespace".to_string(), &claim.namespace))
    } else {
        None
    }
}

/// Refuses a claim-supplied value that would climb out of the share or is not text.
fn check_value(what: &str, value: &str) -> Result<(), String> {
    let why = if value.split('/').any(|c| c == "." || c == "..") {
        "`.` and `..` are refused"
    } else if value.chars().any(char::is_control) {
        "control characters are refused"
    } else {
        return Ok(());
    };
    Err(format!(
        "the claim's {what} is {value:?}, which cannot be used in a path: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_provisioner_sdk::testing::{claim, string_map};

    fn c() -> Claim {
        let mut c = claim("team-a", "data");
        c.labels = string_map(&[("app", "db"), ("dots", "..")]);
        c.annotations = string_map(&[
            ("nfs.io/storage-path", "shared/db"),
            ("abs", "/etc"),
            ("up", "x/../../etc"),
            ("dot", "."),
            ("nl", "a\nb"),
            ("long", &"x".repeat(200)),
        ]);
        c
    }

    fn ok(p: &str) -> Option<String> {
        expand(p, &c()).unwrap()
    }

    #[test]
    fn upstream_variables() {
        assert_eq!(ok("${.PVC.namespace}/${.PVC.name}").unwrap(), "team-a/data");
        assert_eq!(
            ok("${.PVC.namespace}-${.PVC.labels.app}-x").unwrap(),
            "team-a-db-x"
        );
        assert_eq!(
            ok("${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}").unwrap(),
            "team-a/shared/db"
        );
        assert_eq!(ok("literal").unwrap(), "literal");
        assert_eq!(ok("a$b/{c}").unwrap(), "a$b/{c}");
    }

    #[test]
    fn missing_values_are_empty_and_empty_components_dropped() {
        assert_eq!(
            ok("${.PVC.namespace}/${.PVC.annotations.missing}/${.PVC.name}/").unwrap(),
            "team-a/data"
        );
        assert_eq!(ok("${.PVC.labels.missing}"), None);
        assert_eq!(ok("/${.PVC.annotations.missing}/"), None);
        assert_eq!(ok(""), None);
    }

    #[test]
    fn absolute_values_stay_under_the_share() {
        assert_eq!(ok("${.PVC.annotations.abs}").unwrap(), "etc");
        assert_eq!(ok("/abs/${.PVC.name}").unwrap(), "abs/data");
    }

    #[test]
    fn climbing_values_are_refused_and_named() {
        for (p, named) in [
            ("${.PVC.annotations.up}", "annotation \"up\""),
            ("${.PVC.labels.dots}", "label \"dots\""),
            ("x/${.PVC.annotations.dot}", "annotation \"dot\""),
            ("${.PVC.annotations.nl}", "annotation \"nl\""),
        ] {
            let e = expand(p, &c()).unwrap_err();
            assert!(e.contains(named), "{p}: {e}");
        }
    }

    #[test]
    fn unusable_expansions_are_refused() {
        for p in [
            "../${.PVC.name}",
            "a/./b",
            "${.PVC.annotations.missing}..",
            "${.PVC.annotations.long}${.PVC.annotations.long}",
        ] {
            let e = expand(p, &c()).unwrap_err();
            assert!(e.contains("`pathPattern`"), "{p}: {e}");
        }
    }

    #[test]
    fn syntax_errors() {
        let e = expand("${.PVC.uid}", &c()).unwrap_err();
        assert!(e.contains("unknown variable ${.PVC.uid}"), "{e}");
        let e = expand("${namespace}", &c()).unwrap_err();
        assert!(e.contains("unknown variable"), "{e}");
        let e = expand("a/${.PVC.name", &c()).unwrap_err();
        assert!(e.contains("unterminated"), "{e}");
    }
}
