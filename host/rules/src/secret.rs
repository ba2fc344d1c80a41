//! Which Secret a module receives: the class names it (parameters `secretName` and
//! `secretNamespace`, each a name or a template), the admin's grants bound it (a list of
//! `namespace/name` patterns per module), and the PV records the reference so `delete`
//! and `expand` get the same one. Pure: reading the Secret is the host's business.
//!
//! Templates may use `${pvc.namespace}`, `${pvc.name}` and `${pv.name}`, as the CSI
//! `provisioner-secret-*` class parameters do. A class chooses; the grant decides what
//! is allowed: a tenant who names a claim cleverly can at most reach a Secret the
//! admin's pattern allows for that claim.

use std::fmt;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::names;
use crate::volume::metadata::is_dns_subdomain;

/// `namespace/name` of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a template may refer to: the claim and the PV name.
#[derive(Debug, Clone, Copy)]
pub struct Vars<'a> {
    pub pvc_namespace: &'a str,
    pub pvc_name: &'a str,
    pub pv_name: &'a str,
}

/// Why no Secret reference could be worked out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "StorageClass {class}: parameter {present} is set but {missing} is not: set both \
         (or neither) to hand the module a Secret"
    )]
    HalfSet {
        class: String,
        present: &'static str,
        missing: &'static str,
    },
    #[error("{place}: {template:?} is not a valid template: {why}")]
    Template {
        place: String,
        template: String,
        why: String,
    },
    #[error("{place}: {template:?} gives {value:?}, which is not a valid {what}")]
    Invalid {
        place: String,
        template: String,
        value: String,
        what: &'static str,
    },
    #[error(
        "PV {volume}: annotation {annotation} is {value:?}: expected namespace/name of a Secret"
    )]
    Recorded {
        volume: String,
        annotation: &'static str,
        value: String,
    },
}

impl Error {
    /// The label of this error in the host's error metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::HalfSet { .. } => "secret_half_set",
            Error::Template { .. } => "secret_template",
            Error::Invalid { .. } => "secret_invalid_name",
            Error::Recorded { .. } => "secret_recorded",
        }
    }
}

const VARIABLES: [&str; 3] = ["pvc.namespace", "pvc.name", "pv.name"];

/// Checks a template's syntax: text with `${...}` of the known variables only.
pub fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "a `${` is not closed by `}`".to_string())?;
        let variable = &after[..end];
        if !VARIABLES.contains(&variable) {
            return Err(format!(
                "unknown variable ${{{variable}}}: use ${{pvc.namespace}}, ${{pvc.name}} or ${{pv.name}}"
            ));
        }
        rest = &after[end + 1..];
    }
    if rest.contains('$') {
        return Err("a `$` outside `${...}`".into());
    }
    Ok(())
}

/// `template` with its variables replaced.
fn expand(template: &str, vars: &Vars<'_>, place: &str) -> Result<String, Error> {
    check_template(template).map_err(|why| Error::Template {
        place: place.to_string(),
        template: template.to_string(),
        why,
    })?;
    Ok(template
        .replace("${pvc.namespace}", vars.pvc_namespace)
        .replace("${pvc.name}", vars.pvc_name)
        .replace("${pv.name}", vars.pv_name))
}

/// A Secret's namespace (a DNS label) and name (a DNS subdomain), from templates.
fn secret_ref(
    namespace: &str,
    name: &str,
    vars: &Vars<'_>,
    place: &str,
) -> Result<SecretRef, Error> {
    let namespace_value = expand(namespace, vars, place)?;
    let name_value = expand(name, vars, place)?;
    let invalid = |template: &str, value: &str, what| Error::Invalid {
        place: place.to_string(),
        template: template.to_string(),
        value: value.to_string(),
        what,
    };
    if namespace_value.contains('.') || !is_name(&namespace_value, 63) {
        return Err(invalid(namespace, &namespace_value, "namespace"));
    }
    if !is_name(&name_value, 253) {
        return Err(invalid(name, &name_value, "Secret name"));
    }
    Ok(SecretRef {
        namespace: namespace_value,
        name: name_value,
    })
}

fn is_name(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && is_dns_subdomain(text)
}

/// The Secret `class` names for a claim, if it names one.
pub fn class_secret(class: &StorageClass, vars: &Vars<'_>) -> Result<Option<SecretRef>, Error> {
    let parameters = class.parameters.as_ref();
    let get = |key| {
        parameters
            .and_then(|p| p.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let class_name = class.metadata.name.clone().unwrap_or_default();
    match (
        get(names::PARAM_SECRET_NAMESPACE),
        get(names::PARAM_SECRET_NAME),
    ) {
        (None, None) => Ok(None),
        (Some(namespace), Some(name)) => {
            let place = format!("StorageClass {class_name}");
            secret_ref(namespace, name, vars, &place).map(Some)
        }
        (Some(_), None) => Err(Error::HalfSet {
            class: class_name,
            present: names::PARAM_SECRET_NAMESPACE,
            missing: names::PARAM_SECRET_NAME,
        }),
        (None, Some(_)) => Err(Error::HalfSet {
            class: class_name,
            present: names::PARAM_SECRET_NAME,
            missing: names::PARAM_SECRET_NAMESPACE,
        }),
    }
}

/// Whether a grant's patterns (`namespace/name`, each part a name or a template) allow
/// `secret` for this claim. A pattern that does not expand to a valid reference allows
/// nothing.
pub fn granted(patterns: &[String], secret: &SecretRef, vars: &Vars<'_>) -> bool {
    patterns.iter().any(|pattern| {
        pattern.split_once('/').is_some_and(|(namespace, name)| {
            secret_ref(namespace, name, vars, "grant").is_ok_and(|allowed| allowed == *secret)
        })
    })
}

/// Checks one grant pattern: `namespace/name`, each part a name or a template.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    let (namespace, name) = pattern.split_once('/').ok_or_else(|| {
        "expected namespace/name, such as storage/api-token or ${pvc.namespace}/api-token"
            .to_string()
    })?;
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err("expected namespace/name with one `/`".into());
    }
    check_template(namespace)?;
    check_template(name)
}

/// The Secret recorded on a PV at provisioning time, if any.
pub fn recorded_secret(pv: &PersistentVolume) -> Result<Option<SecretRef>, Error> {
    let Some(value) = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANN_SECRET))
    else {
        return Ok(None);
    };
    let volume = pv.metadata.name.clone().unwrap_or_default();
    let recorded = Error::Recorded {
        volume: volume.clone(),
        annotation: names::ANN_SECRET,
        value: value.clone(),
    };
    let (namespace, name) = value.split_once('/').ok_or_else(|| recorded.clone())?;
    if namespace.contains('$') || name.contains('$') {
        return Err(recorded);
    }
    let vars = Vars {
        pvc_namespace: "",
        pvc_name: "",
        pv_name: "",
    };
    secret_ref(namespace, name, &vars, &format!("PV {volume}"))
        .map(Some)
        .map_err(|_| recorded)
}

/// What a template may refer to for a PV: its claim (from `claimRef`) and its name.
pub fn volume_vars(pv: &PersistentVolume) -> (String, String, String) {
    let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    (
        claim.and_then(|c| c.namespace.clone()).unwrap_or_default(),
        claim.and_then(|c| c.name.clone()).unwrap_or_default(),
        pv.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const VARS: Vars<'static> = Vars {
        pvc_namespace: "team-a",
        pvc_name: "data",
        pv_name: "pvc-1",
    };

    fn class(parameters: &[(&str, &str)]) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("api".into()),
                ..Default::default()
            },
            parameters: Some(
                parameters
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            provisioner: "wasm-provisioner.dev".into(),
            ..Default::default()
        }
    }

    fn reference(namespace: &str, name: &str) -> SecretRef {
        SecretRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_class_names_its_secret_by_template() {
        assert_eq!(class_secret(&class(&[]), &VARS), Ok(None));
        let named = class(&[
            ("secretNamespace", "${pvc.namespace}"),
            ("secretName", "${pvc.name}-token"),
        ]);
        assert_eq!(
            class_secret(&named, &VARS),
            Ok(Some(reference("team-a", "data-token")))
        );
        let half = class(&[("secretName", "token")]);
        assert!(matches!(
            class_secret(&half, &VARS),
            Err(Error::HalfSet { .. })
        ));
        let unknown = class(&[("secretNamespace", "x"), ("secretName", "${pvc.uid}")]);
        let error = class_secret(&unknown, &VARS).unwrap_err().to_string();
        assert!(error.contains("unknown variable ${pvc.uid}"), "{error}");
    }

    #[test]
    fn a_claim_name_cannot_escape_into_another_namespace() {
        // A tenant's claim named to smuggle a path or a namespace gives no valid name.
        let sly = Vars {
            pvc_namespace: "team-a",
            pvc_name: "x/../kube-system",
            pv_name: "pvc-1",
        };
        let named = class(&[
            ("secretNamespace", "${pvc.namespace}"),
            ("secretName", "${pvc.name}"),
        ]);
        assert!(matches!(
            class_secret(&named, &sly),
            Err(Error::Invalid { .. })
        ));
        let dotted = class(&[("secretNamespace", "a.b"), ("secretName", "token")]);
        assert!(matches!(
            class_secret(&dotted, &VARS),
            Err(Error::Invalid {
                what: "namespace",
                ..
            })
        ));
    }

    #[test]
    fn grants_bound_the_secret_per_claim() {
        let patterns = vec![
            "${pvc.namespace}/api-token".to_string(),
            "storage/shared".to_string(),
        ];
        assert!(granted(&patterns, &reference("team-a", "api-token"), &VARS));
        assert!(granted(&patterns, &reference("storage", "shared"), &VARS));
        assert!(!granted(
            &patterns,
            &reference("team-b", "api-token"),
            &VARS
        ));
        assert!(!granted(&patterns, &reference("storage", "other"), &VARS));
        assert!(!granted(&[], &reference("storage", "shared"), &VARS));
    }

    #[test]
    fn patterns_are_checked() {
        assert_eq!(check_pattern("${pvc.namespace}/api-token"), Ok(()));
        assert!(check_pattern("api-token").is_err());
        assert!(check_pattern("a/b/c").is_err());
        assert!(check_pattern("${pvc.uid}/x").is_err());
        assert!(check_pattern("ns/$x").is_err());
    }

    #[test]
    fn the_pv_records_the_reference() {
        let mut pv = PersistentVolume::default();
        assert_eq!(recorded_secret(&pv), Ok(None));
        pv.metadata.name = Some("pvc-1".into());
        pv.metadata.annotations = Some(
            [(
                names::ANN_SECRET.to_string(),
                "team-a/api-token".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            recorded_secret(&pv),
            Ok(Some(reference("team-a", "api-token")))
        );
        pv.metadata.annotations = Some(
            [(
                names::ANN_SECRET.to_string(),
                "${pvc.namespace}/x".to_string(),
            )]
            .into(),
        );
        assert!(recorded_secret(&pv).is_err());
    }
}
