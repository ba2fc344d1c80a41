//! What every Kubernetes object has: how it is named in errors and logs, and its
//! finalizers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `namespace/name` of a namespaced object, `name` of a cluster-scoped one: how every
/// error and log line names it.
pub fn object_key(meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("<unnamed>");
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// Whether an object carries a finalizer.
pub fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::ClaimView;
    use crate::request::tests::claim;

    #[test]
    fn object_keys() {
        assert_eq!(ClaimView(&claim()).key(), "ns/data");
        let meta = ObjectMeta {
            name: Some("pvc-1".into()),
            ..Default::default()
        };
        assert_eq!(object_key(&meta), "pvc-1");
    }
}
