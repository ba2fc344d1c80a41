//! Echoes the request back, for the host's tests to check what a plugin is given.
//!
//! `provision` answers a hostPath volume `/echo/<volume-name>` (type DirectoryOrCreate; capacity: the request, or
//! class parameter `capacityBytes`; node affinity to the selected node, if any) with
//! annotations holding JSON (Kubernetes field names):
//! `echo/volume-name`, `echo/claim`, `echo/class`, `echo/parameters`,
//! `echo/selected-node` (`null` if none), and `echo/version` (class parameter `version`,
//! if set: tells module versions apart in reload tests).
//!
//! Class parameters: `outcome` = ignored | failed | in-background | reschedule |
//! infeasible makes `provision` answer that error with message `echo: <outcome>`;
//! `outcomeFile` names a file (in a granted directory) whose content, when it exists,
//! overrides `outcome` (`ok` for success);
//! `veto=true` makes `should-provision` answer false; `deleteOutcome` = failed | ignored
//! makes `delete` answer that error with message `echo: <outcome>`; `deleteVeto=true`
//! makes `should-delete` answer false. `expand` (capability `expand`) answers the size
//! asked for, or, with `expandOutcome` = failed | in-background | infeasible (or the
//! content of the file `expandOutcomeFile` names, `ok` for success), that error with
//! message `echo: <outcome>`. Every call logs `echo: <call>` with the volume.
use wasm_provisioner_sdk::{self as sdk, log, prelude::*};

struct Echo;

mod json {
    /// A JSON string literal.
    pub fn str(s: &str) -> String {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// An object from (key, already-JSON value) pairs.
    pub fn obj<'a>(fields: impl IntoIterator<Item = (&'a str, String)>) -> String {
        let fields: Vec<String> = fields
            .into_iter()
            .map(|(k, v)| format!("{}:{v}", str(k)))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    /// An array of already-JSON values.
    pub fn arr(items: impl IntoIterator<Item = String>) -> String {
        format!("[{}]", items.into_iter().collect::<Vec<_>>().join(","))
    }

    pub fn strs(items: &[String]) -> String {
        arr(items.iter().map(|s| str(s)))
    }

    pub fn map(m: &[(String, String)]) -> String {
        obj(m.iter().map(|(k, v)| (k.as_str(), str(v))))
    }

    pub fn opt<T>(v: &Option<T>, f: impl FnOnce(&T) -> String) -> String {
        v.as_ref().map_or_else(|| "null".to_string(), f)
    }
}

fn access_mode(m: &AccessMode) -> String {
    json::str(match m {
        AccessMode::ReadWriteOnce => "ReadWriteOnce",
        AccessMode::ReadOnlyMany => "ReadOnlyMany",
        AccessMode::ReadWriteMany => "ReadWriteMany",
        AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
    })
}

fn claim(c: &Claim) -> String {
    let mode = match c.volume_mode {
        VolumeMode::Filesystem => "Filesystem",
        VolumeMode::Block => "Block",
    };
    json::obj([
        ("name", json::str(&c.name)),
        ("namespace", json::str(&c.namespace)),
        ("uid", json::str(&c.uid)),
        ("labels", json::map(&c.labels)),
        ("annotations", json::map(&c.annotations)),
        (
            "accessModes",
            json::arr(c.access_modes.iter().map(access_mode)),
        ),
        ("requestedBytes", c.requested_bytes.to_string()),
        ("limitBytes", json::opt(&c.limit_bytes, u64::to_string)),
        ("volumeMode", json::str(mode)),
        (
            "dataSource",
            json::opt(&c.data_source, |d| {
                json::obj([
                    ("apiGroup", json::opt(&d.api_group, |g| json::str(g))),
                    ("kind", json::str(&d.kind)),
                    ("name", json::str(&d.name)),
                    ("namespace", json::opt(&d.namespace, |n| json::str(n))),
                ])
            }),
        ),
        (
            "selector",
            json::opt(&c.selector, |s| {
                let exprs = s.match_expressions.iter().map(|e| {
                    json::obj([
                        ("key", json::str(&e.key)),
                        ("operator", json::str(&e.operator)),
                        ("values", json::strs(&e.values)),
                    ])
                });
                json::obj([
                    ("matchLabels", json::map(&s.match_labels)),
                    ("matchExpressions", json::arr(exprs)),
                ])
            }),
        ),
    ])
}

fn class(c: &Class) -> String {
    let reclaim = match c.reclaim_policy {
        ReclaimPolicy::Delete => "Delete",
        ReclaimPolicy::Retain => "Retain",
        ReclaimPolicy::Recycle => "Recycle",
    };
    let binding = match c.binding_mode {
        BindingMode::Immediate => "Immediate",
        BindingMode::WaitForFirstConsumer => "WaitForFirstConsumer",
    };
    let topologies = c.allowed_topologies.iter().map(|t| {
        let reqs = t.requirements.iter().map(|r| {
            json::obj([
                ("key", json::str(&r.key)),
                ("values", json::strs(&r.values)),
            ])
        });
        json::obj([("matchLabelExpressions", json::arr(reqs))])
    });
    json::obj([
        ("name", json::str(&c.name)),
        ("parameters", json::map(&c.parameters)),
        ("reclaimPolicy", json::str(reclaim)),
        ("mountOptions", json::strs(&c.mount_options)),
        ("allowedTopologies", json::arr(topologies)),
        ("volumeBindingMode", json::str(binding)),
    ])
}

impl Provisioner for Echo {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-echo", env!("CARGO_PKG_VERSION"))
    }

    fn should_provision(req: &ProvisionRequest) -> bool {
        log::info!("echo: should-provision", volume = req.volume_name);
        Params::new(&req.class.parameters).get("veto") != Some("true")
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        log::info!("echo: provision", volume = req.volume_name);
        let params = Params::new(&req.class.parameters);
        let message = |o: &str| format!("echo: {o}");
        // `outcomeFile` (a path in a granted directory) overrides `outcome`, so a test
        // can change the answer while a claim is in flight (class parameters are
        // immutable). A missing file means no override.
        let from_file = params
            .get("outcomeFile")
            .and_then(|path| std::fs::read_to_string(path).ok())
            .map(|text| text.trim().to_string());
        match from_file.as_deref().or(params.get("outcome")) {
            None | Some("ok") => {}
            Some(o @ "ignored") => return Err(ProvisionError::Ignored(message(o))),
            Some(o @ "failed") => return Err(ProvisionError::Failed(message(o))),
            Some(o @ "in-background") => return Err(ProvisionError::InBackground(message(o))),
            Some(o @ "reschedule") => return Err(ProvisionError::Reschedule(message(o))),
            Some(o @ "infeasible") => return Err(ProvisionError::Infeasible(message(o))),
            Some(o) => {
                return Err(ProvisionError::Infeasible(format!(
                    "echo: unknown outcome {o}"
                )));
            }
        }
        let capacity = match params.get("capacityBytes") {
            Some(c) => c.parse().map_err(|e| {
                ProvisionError::Infeasible(format!("echo: parameter `capacityBytes`: {e}"))
            })?,
            None => req.claim.requested_bytes,
        };
        let path = format!("/echo/{}", req.volume_name);
        let node = req.selected_node.as_ref();
        let node_json = json::opt(&req.selected_node, |n| {
            json::obj([
                ("name", json::str(&n.name)),
                ("labels", json::map(&n.labels)),
            ])
        });
        let mut volume = Volume::new(
            capacity,
            VolumeSource::host_path(path, Some("DirectoryOrCreate")),
        )
        .annotate("echo/volume-name", req.volume_name.as_str())
        .annotate("echo/claim", claim(&req.claim))
        .annotate("echo/class", class(&req.class))
        .annotate("echo/parameters", json::map(&req.class.parameters))
        .annotate("echo/selected-node", node_json);
        if let Some(version) = params.get("version") {
            volume = volume.annotate("echo/version", version);
        }
        if let Some(node) = node {
            volume = volume.on_node(&node.name);
        }
        Ok(volume)
    }

    fn should_delete(req: &DeleteRequest) -> bool {
        log::info!("echo: should-delete", volume = req.volume.name);
        Params::new(&req.class_parameters).get("deleteVeto") != Some("true")
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        log::info!(
            "echo: delete",
            volume = req.volume.name,
            class = req.class_name
        );
        match Params::new(&req.class_parameters).get("deleteOutcome") {
            Some(o @ "failed") => Err(DeleteError::Failed(format!("echo: {o}"))),
            Some(o @ "ignored") => Err(DeleteError::Ignored(format!("echo: {o}"))),
            _ => Ok(()),
        }
    }
}

impl Expander for Echo {
    fn expand(req: &ExpandRequest) -> Result<u64, ExpandError> {
        log::info!(
            "echo: expand",
            volume = req.volume.name,
            bytes = req.requested_bytes
        );
        let params = Params::new(&req.class_parameters);
        let from_file = params
            .get("expandOutcomeFile")
            .and_then(|path| std::fs::read_to_string(path).ok())
            .map(|text| text.trim().to_string());
        let message = |o: &str| format!("echo: {o}");
        match from_file.as_deref().or(params.get("expandOutcome")) {
            None | Some("ok") => Ok(req.requested_bytes),
            Some(o @ "failed") => Err(ExpandError::Failed(message(o))),
            Some(o @ "in-background") => Err(ExpandError::InBackground(message(o))),
            Some(o @ "infeasible") => Err(ExpandError::Infeasible(message(o))),
            Some(o) => Err(ExpandError::Infeasible(format!(
                "echo: unknown outcome {o}"
            ))),
        }
    }
}

sdk::export!(Echo, capabilities: [expand]);

#[cfg(test)]
mod tests {
    use super::*;
    use sdk::testing::{node, provision_request, string_map};

    #[test]
    fn json_escapes() {
        assert_eq!(json::str("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\u0001é""#);
        assert_eq!(json::map(&string_map(&[("k", "v")])), r#"{"k":"v"}"#);
        assert_eq!(json::arr(Vec::new()), "[]");
    }

    #[test]
    fn echoes_the_request() {
        let mut req = provision_request(&[("version", "2"), ("x", "y")]);
        req.selected_node = Some(node("n1"));
        let v = Echo::provision(&req).unwrap();
        let ann = |k| sdk::lookup(&v.annotations, k).unwrap().to_string();
        assert_eq!(ann("echo/version"), "2");
        assert_eq!(ann("echo/parameters"), r#"{"version":"2","x":"y"}"#);
        assert!(ann("echo/claim").starts_with(r#"{"name":"data","namespace":"default","uid":"#));
        assert!(ann("echo/claim").contains(
            r#""accessModes":["ReadWriteOnce"],"requestedBytes":1073741824,"limitBytes":null"#
        ));
        assert!(ann("echo/class").contains(r#""reclaimPolicy":"Delete""#));
        assert_eq!(ann("echo/selected-node"), r#"{"name":"n1","labels":{}}"#);
        assert_eq!(v.node_affinity, sdk::hostname_affinity("n1"));
        assert_eq!(
            v.source,
            VolumeSource::host_path(
                format!("/echo/{}", req.volume_name),
                Some("DirectoryOrCreate")
            )
        );
    }

    #[test]
    fn outcomes_and_vetoes() {
        let r = Echo::provision(&provision_request(&[("outcome", "reschedule")]));
        assert_eq!(
            r,
            Err(ProvisionError::Reschedule("echo: reschedule".into()))
        );
        assert!(!Echo::should_provision(&provision_request(&[(
            "veto", "true"
        )])));
        assert!(Echo::should_provision(&provision_request(&[])));
    }
}
