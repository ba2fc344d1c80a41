//! The labels and annotations a plugin may put on a PV: valid Kubernetes keys and values,
//! outside the reserved domains (see the module documentation of `volume`).

use std::collections::BTreeMap;

use super::Error;
use crate::names;
use crate::types;

/// Key prefixes (domains) no plugin may use for a PV annotation or label; subdomains
/// are included.
pub const RESERVED_DOMAINS: [&str; 3] = ["kubernetes.io", "k8s.io", names::OWN_DOMAIN];

/// Reserved domains whose labels a plugin may still set: the scheduler reads a PV's
/// topology from them.
pub const ALLOWED_LABEL_DOMAINS: [&str; 2] = [
    "topology.kubernetes.io",
    "failure-domain.beta.kubernetes.io",
];

/// A plugin's labels or annotations as a map, every key checked.
pub(super) fn checked_map(
    volume: &str,
    what: &'static str,
    pairs: types::StringMap,
) -> Result<BTreeMap<String, String>, Error> {
    let mut map = BTreeMap::new();
    for (key, value) in pairs {
        let invalid = |why| Error::InvalidKey {
            volume: volume.to_owned(),
            what,
            key: key.clone(),
            why,
        };
        let (prefix, name) = match key.split_once('/') {
            Some((prefix, name)) => (Some(prefix), name),
            None => (None, key.as_str()),
        };
        if let Some(prefix) = prefix {
            if prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix) {
                return Err(invalid("its prefix must be a lower-case DNS subdomain"));
            }
            let allowed = what == "label" && ALLOWED_LABEL_DOMAINS.contains(&prefix);
            if in_domain(prefix, &RESERVED_DOMAINS) && !allowed {
                return Err(Error::ReservedKey {
                    volume: volume.to_owned(),
                    what,
                    key: key.clone(),
                });
            }
        }
        if name.is_empty() || name.len() > 63 || !is_qualified_name_part(name) {
            return Err(invalid(
                "its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
        if what == "label"
            && (value.len() > 63 || !(value.is_empty() || is_qualified_name_part(&value)))
        {
            return Err(Error::InvalidLabelValue {
                volume: volume.to_owned(),
                key: key.clone(),
                value,
            });
        }
        map.insert(key, value);
    }
    Ok(map)
}

/// Whether `prefix` is one of `domains` or a subdomain of one.
fn in_domain(prefix: &str, domains: &[&str]) -> bool {
    domains.iter().any(|d| {
        prefix == *d
            || prefix
                .strip_suffix(d)
                .is_some_and(|head| head.ends_with('.'))
    })
}

pub(crate) fn is_dns_subdomain(text: &str) -> bool {
    text.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    })
}

fn is_qualified_name_part(text: &str) -> bool {
    let bytes = text.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
