//! StorageClass parameters: lookup with defaults, required keys, enums, booleans, typos.
//!
//! An empty value counts as absent. Every error names the parameter and says what to set;
//! it converts into [`ProvisionError::Infeasible`] and [`ExpandError::Infeasible`] (the
//! class is wrong: retrying as is cannot help), [`DeleteError::Failed`], or the message
//! of a `validate-class` or `get-capacity` refusal.

use crate::{DeleteError, ExpandError, ProvisionError};
use std::fmt;

/// A parameter that is missing or malformed; the message names it and says what to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

impl From<ParamError> for ProvisionError {
    fn from(e: ParamError) -> Self {
        ProvisionError::Infeasible(e.0)
    }
}

impl From<ParamError> for DeleteError {
    fn from(e: ParamError) -> Self {
        DeleteError::Failed(e.0)
    }
}

impl From<ParamError> for ExpandError {
    fn from(e: ParamError) -> Self {
        ExpandError::Infeasible(e.0)
    }
}

impl From<ParamError> for String {
    fn from(e: ParamError) -> Self {
        e.0
    }
}

/// Bytes of a Kubernetes quantity (`1073741824`, `10Gi`, `500M`, `1.5Gi`, `1e9`; see
/// [`crate::quantity`]). `None` when it is not a quantity, negative or beyond `u64`;
/// [`crate::quantity::parse_quantity`] says why.
pub fn parse_bytes(quantity: &str) -> Option<u64> {
    crate::quantity::parse_quantity(quantity).ok()
}

/// A view of a string map of parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    map: &'a [(String, String)],
}

impl<'a> Params<'a> {
    pub fn new(map: &'a [(String, String)]) -> Self {
        Params { map }
    }

    /// True when there are no parameters at all (for a delete: the class is gone).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The value of `key`; `None` when absent or empty.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        crate::lookup(self.map, key).filter(|v| !v.is_empty())
    }

    /// The value of `key`, or `default` when absent or empty.
    pub fn get_or(&self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// The value of `key`; an error saying "parameter `key` is required: <hint>" if absent.
    pub fn require(&self, key: &str, hint: &str) -> Result<&'a str, ParamError> {
        self.get(key).ok_or_else(|| {
            ParamError(format!(
                "StorageClass parameter `{key}` is required: {hint}"
            ))
        })
    }

    /// The value of `key`, which must be one of `allowed` (exact match); `default` when absent.
    pub fn one_of(
        &self,
        key: &str,
        allowed: &[&'a str],
        default: &'a str,
    ) -> Result<&'a str, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => allowed.iter().copied().find(|a| *a == v).ok_or_else(|| {
                ParamError(format!(
                    "StorageClass parameter `{key}` is {v:?}: set it to one of {}",
                    allowed.join(", ")
                ))
            }),
        }
    }

    /// A boolean parameter. Accepts what Go's `strconv.ParseBool` does (`true`, `false`,
    /// `1`, `0`, `t`, `f`, `TRUE`, `False`, ...); `default` when absent.
    pub fn bool(&self, key: &str, default: bool) -> Result<bool, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ParamError(format!(
                "StorageClass parameter `{key}` is {v:?}: set it to true or false"
            ))),
        }
    }

    /// An absolute path parameter (see [`crate::path::check_absolute`]), normalised;
    /// `default` when absent. Without a default the parameter is required and `hint`
    /// says what to set it to.
    pub fn absolute_path(
        &self,
        key: &str,
        default: Option<&str>,
        hint: &str,
    ) -> Result<String, ParamError> {
        let value = match default {
            Some(d) => self.get_or(key, d),
            None => self.require(key, hint)?,
        };
        crate::path::check_absolute(value).map_err(|e| {
            ParamError(format!(
                "StorageClass parameter `{key}`: {e}: set it to an absolute path"
            ))
        })
    }

    /// A size parameter in bytes, written as a Kubernetes quantity (`10Gi`, `500M`,
    /// `1.5Gi`, see [`crate::quantity`]); `None` when absent.
    pub fn bytes(&self, key: &str) -> Result<Option<u64>, ParamError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => crate::quantity::parse_quantity(v)
                .map(Some)
                .map_err(|e| ParamError(format!("StorageClass parameter `{key}` is {v:?}: {e}"))),
        }
    }

    /// A size parameter in bytes, written as a Kubernetes quantity (`10Gi`, `500M`,
    /// `1048576`, `1.5Gi`): the value of `key`, or `default` (itself a quantity, such as
    /// `"1Gi"`) when absent or empty. Without a default the parameter is required and
    /// `hint` says what to set it to. The same helper as `Params.quantity` of the Python
    /// and JavaScript SDKs; the bytes are exactly those the API server reads (a fraction
    /// of a byte rounds up).
    pub fn quantity(
        &self,
        key: &str,
        default: Option<&str>,
        hint: &str,
    ) -> Result<u64, ParamError> {
        let value = match default {
            Some(d) => self.get_or(key, d),
            None => self.require(key, hint)?,
        };
        crate::quantity::parse_quantity(value)
            .map_err(|e| ParamError(format!("StorageClass parameter `{key}` is {value:?}: {e}")))
    }

    /// Refuses keys outside `known` (catches typos such as `nodepath`).
    pub fn reject_unknown(&self, known: &[&str]) -> Result<(), ParamError> {
        let unknown: Vec<&str> = self
            .map
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !known.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ParamError(format!(
                "unknown StorageClass parameter(s) {}: the known ones are {}",
                unknown.join(", "),
                known.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn get_treats_empty_as_absent() {
        let m = map(&[("a", "1"), ("e", "")]);
        let p = Params::new(&m);
        assert_eq!(p.get("a"), Some("1"));
        assert_eq!(p.get("e"), None);
        assert_eq!(p.get_or("e", "d"), "d");
        assert_eq!(p.get_or("zz", "d"), "d");
        assert!(!p.is_empty());
    }

    #[test]
    fn require_names_the_parameter() {
        let m = map(&[]);
        let e = Params::new(&m)
            .require("nodePath", "set it to X")
            .unwrap_err();
        assert!(
            e.0.contains("`nodePath`") && e.0.contains("set it to X"),
            "{e}"
        );
        assert!(matches!(
            ProvisionError::from(e.clone()),
            ProvisionError::Infeasible(_)
        ));
        assert!(matches!(DeleteError::from(e), DeleteError::Failed(_)));
    }

    #[test]
    fn one_of_and_bool() {
        let m = map(&[("mode", "archive"), ("bad", "maybe"), ("b", "False")]);
        let p = Params::new(&m);
        assert_eq!(
            p.one_of("mode", &["delete", "archive"], "delete"),
            Ok("archive")
        );
        assert_eq!(
            p.one_of("none", &["delete", "archive"], "delete"),
            Ok("delete")
        );
        let e = p
            .one_of("bad", &["delete", "archive"], "delete")
            .unwrap_err();
        assert!(
            e.0.contains("`bad`") && e.0.contains("delete, archive"),
            "{e}"
        );
        assert_eq!(p.bool("b", true), Ok(false));
        assert_eq!(p.bool("none", true), Ok(true));
        assert!(p.bool("bad", true).unwrap_err().0.contains("true or false"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("10Gi"), Some(10 << 30));
        assert_eq!(parse_bytes("500M"), Some(500_000_000));
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_bytes("1e9"), Some(1_000_000_000));
        for bad in [
            "",
            "Gi",
            "-1",
            "10 Gi",
            "10GB",
            "1K",
            "16Ei",
            "99999999999Ei",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        let m = map(&[("maxSize", "2Gi"), ("bad", "lots")]);
        let p = Params::new(&m);
        assert_eq!(p.bytes("maxSize"), Ok(Some(2 << 30)));
        assert_eq!(p.bytes("none"), Ok(None));
        let e = p.bytes("bad").unwrap_err();
        assert!(
            e.0.contains("`bad` is \"lots\"") && e.0.contains("10Gi"),
            "{e}"
        );
    }

    #[test]
    fn quantities_with_defaults_and_hints() {
        let m = map(&[
            ("maxSize", "10Gi"),
            ("small", "500M"),
            ("odd", "1.1Gi"),
            ("bad", "10GB"),
            ("neg", "-1Gi"),
            ("empty", ""),
        ]);
        let p = Params::new(&m);
        assert_eq!(p.quantity("maxSize", None, "h"), Ok(10 << 30));
        assert_eq!(p.quantity("small", Some("1Gi"), "h"), Ok(500_000_000));
        // 1.1 * 2^30 = 1181116006.4 bytes: rounded up, as the API server does.
        assert_eq!(p.quantity("odd", None, "h"), Ok(1_181_116_007));
        assert_eq!(p.quantity("none", Some("1Gi"), "h"), Ok(1 << 30));
        assert_eq!(p.quantity("empty", Some("2k"), "h"), Ok(2000));
        let e = p
            .quantity("none", None, "the largest claim, such as 10Gi")
            .unwrap_err();
        assert!(e.0.contains("`none` is required: the largest claim"), "{e}");
        let e = p.quantity("bad", None, "h").unwrap_err();
        assert!(
            e.0.contains("`bad` is \"10GB\"") && e.0.contains("not a Kubernetes quantity"),
            "{e}"
        );
        let e = p.quantity("neg", None, "h").unwrap_err();
        assert!(e.0.contains("negative"), "{e}");
        let e = p.quantity("none", Some("lots"), "h").unwrap_err();
        assert!(e.0.contains("\"lots\""), "{e}");
        assert!(matches!(
            ProvisionError::from(e),
            ProvisionError::Infeasible(_)
        ));
    }

    #[test]
    fn unknown_keys() {
        let m = map(&[("nodePath", "/x"), ("nodepath", "/y")]);
        let p = Params::new(&m);
        let e = p.reject_unknown(&["nodePath"]).unwrap_err();
        assert!(e.0.contains("nodepath"), "{e}");
        assert!(p.reject_unknown(&["nodePath", "nodepath"]).is_ok());
    }

    #[test]
    fn absolute_paths() {
        let m = map(&[("root", "/a//b/"), ("rel", "a"), ("dots", "/a/../b")]);
        let p = Params::new(&m);
        assert_eq!(p.absolute_path("root", None, "h").unwrap(), "/a/b");
        assert_eq!(p.absolute_path("none", Some("/d"), "h").unwrap(), "/d");
        assert!(
            p.absolute_path("none", None, "hint!")
                .unwrap_err()
                .0
                .contains("hint!")
        );
        for key in ["rel", "dots"] {
            let e = p.absolute_path(key, None, "h").unwrap_err();
            assert!(e.0.contains(&format!("`{key}`")), "{e}");
        }
    }
}
