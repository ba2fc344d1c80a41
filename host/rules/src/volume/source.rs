//! A volume's source both ways: the WIT variant an answer carries becomes the PV's
//! source (a `json` source checked against the Kubernetes schema, no field dropped), and
//! a PV's source goes back to a plugin typed when nothing is lost, else as `json`.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, HostPathVolumeSource, ISCSIPersistentVolumeSource,
    LocalVolumeSource, NFSVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use serde_json::Value;

use super::Error;
use crate::request::string_map;
use crate::types;

/// The `PersistentVolumeSpec` keys that name a volume source, as on the wire. A `json`
/// source must use exactly one of these.
pub const SOURCE_KEYS: [&str; 22] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// A PV's volume source as the WIT variant: typed when the typed record carries every
/// field the PV sets (so nothing is lost), else `json` — an object with the one source
/// key, exactly as the API server serves it.
pub fn volume_source_of(pv: &PersistentVolume) -> Result<types::VolumeSource, Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();

    let serialized = serde_json::to_value(&spec).unwrap_or(Value::Null);
    let present: Vec<&str> = SOURCE_KEYS
        .into_iter()
        .filter(|k| serialized.get(k).is_some_and(|v| !v.is_null()))
        .collect();
    match present.as_slice() {
        [] => return Err(Error::NoSource { volume: name }),
        [_] => {}
        several => {
            return Err(Error::SeveralSources {
                volume: name,
                sources: several.join(", "),
            });
        }
    }

    if let Some(s) = spec.host_path {
        return Ok(types::VolumeSource::HostPath(types::HostPathSource {
            path: s.path,
            path_type: s.type_,
        }));
    }
    if let Some(s) = spec.local {
        return Ok(types::VolumeSource::Local(types::LocalSource {
            path: s.path,
            fs_type: s.fs_type,
        }));
    }
    if let Some(s) = spec.nfs {
        return Ok(types::VolumeSource::Nfs(types::NfsSource {
            server: s.server,
            path: s.path,
            read_only: s.read_only.unwrap_or(false),
        }));
    }
    if let Some(s) = spec.csi.filter(|s| {
        s.controller_expand_secret_ref.is_none()
            && s.controller_publish_secret_ref.is_none()
            && s.node_expand_secret_ref.is_none()
            && s.node_publish_secret_ref.is_none()
            && s.node_stage_secret_ref.is_none()
    }) {
        return Ok(types::VolumeSource::Csi(types::CsiSource {
            driver: s.driver,
            volume_handle: s.volume_handle,
            fs_type: s.fs_type,
            read_only: s.read_only.unwrap_or(false),
            volume_attributes: string_map(s.volume_attributes.as_ref()),
        }));
    }
    if let Some(s) = spec.iscsi.filter(|s| {
        s.chap_auth_discovery != Some(true)
            && s.chap_auth_session != Some(true)
            && s.initiator_name.is_none()
            && s.secret_ref.is_none()
    }) {
        return Ok(types::VolumeSource::Iscsi(types::IscsiSource {
            target_portal: s.target_portal,
            iqn: s.iqn,
            lun: s.lun,
            iscsi_interface: s.iscsi_interface,
            fs_type: s.fs_type,
            read_only: s.read_only.unwrap_or(false),
            portals: s.portals.unwrap_or_default(),
        }));
    }
    let key = present[0];
    let object = serde_json::json!({ key: serialized[key] });
    Ok(types::VolumeSource::Json(object.to_string()))
}

/// A PersistentVolumeSpec holding only the volume source.
pub(super) fn source_spec(
    volume: &str,
    source: types::VolumeSource,
) -> Result<PersistentVolumeSpec, Error> {
    let mut spec = PersistentVolumeSpec::default();
    match source {
        types::VolumeSource::HostPath(s) => {
            spec.host_path = Some(HostPathVolumeSource {
                path: s.path,
                type_: s.path_type,
            });
        }
        types::VolumeSource::Local(s) => {
            spec.local = Some(LocalVolumeSource {
                path: s.path,
                fs_type: s.fs_type,
            });
        }
        types::VolumeSource::Nfs(s) => {
            spec.nfs = Some(NFSVolumeSource {
                server: s.server,
                path: s.path,
                read_only: s.read_only.then_some(true),
            });
        }
        types::VolumeSource::Csi(s) => {
            spec.csi = Some(CSIPersistentVolumeSource {
                driver: s.driver,
                volume_handle: s.volume_handle,
                fs_type: s.fs_type,
                read_only: s.read_only.then_some(true),
                volume_attributes: (!s.volume_attributes.is_empty())
                    .then(|| s.volume_attributes.into_iter().collect()),
                ..Default::default()
            });
        }
        types::VolumeSource::Iscsi(s) => {
            spec.iscsi = Some(ISCSIPersistentVolumeSource {
                target_portal: s.target_portal,
                iqn: s.iqn,
                lun: s.lun,
                iscsi_interface: s.iscsi_interface,
                fs_type: s.fs_type,
                read_only: s.read_only.then_some(true),
                portals: (!s.portals.is_empty()).then_some(s.portals),
                ..Default::default()
            });
        }
        types::VolumeSource::Json(text) => spec = json_source(volume, &text)?,
    }
    Ok(spec)
}

/// Parses a `json` source: one key naming a PersistentVolumeSource, its value checked
/// against the Kubernetes schema, including fields Kubernetes would silently drop.
fn json_source(volume: &str, text: &str) -> Result<PersistentVolumeSpec, Error> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::JsonSyntax {
        volume: volume.to_owned(),
        why: e.to_string(),
    })?;
    let Value::Object(object) = value else {
        return Err(Error::JsonSyntax {
            volume: volume.to_owned(),
            why: "it is not an object".into(),
        });
    };
    if object.len() != 1 {
        return Err(Error::JsonKeyCount {
            volume: volume.to_owned(),
            count: object.len(),
            keys: object.keys().cloned().collect::<Vec<_>>().join(", "),
        });
    }
    let (key, inner) = object.into_iter().next().expect("one key");
    if !SOURCE_KEYS.contains(&key.as_str()) {
        return Err(Error::JsonUnknownSource {
            volume: volume.to_owned(),
            key,
        });
    }
    let invalid = |why: String| Error::JsonInvalid {
        volume: volume.to_owned(),
        key: key.clone(),
        why,
    };
    if !inner.is_object() {
        return Err(invalid("its value is not an object".into()));
    }
    let spec: PersistentVolumeSpec =
        serde_json::from_value(serde_json::json!({ key.as_str(): inner.clone() }))
            .map_err(|e| invalid(e.to_string()))?;
    // k8s-openapi, like the API server, ignores unknown fields; a plugin's typo would
    // silently vanish. Serialize back and refuse any input field that did not survive.
    let back = serde_json::to_value(&spec).map_err(|e| invalid(e.to_string()))?;
    if let Some(field) = lost_field(&inner, &back[key.as_str()], "") {
        return Err(Error::JsonUnknownField {
            volume: volume.to_owned(),
            key,
            field,
        });
    }
    // It also fills a missing required field with its default ("" for nfs.path); a
    // field that appeared on the way back was required and missing.
    if let Some(field) = lost_field(&back[key.as_str()], &inner, "") {
        return Err(Error::JsonMissingField {
            volume: volume.to_owned(),
            key,
            field,
        });
    }
    Ok(spec)
}

/// The path of the first non-null field of `input` that `output` lacks.
fn lost_field(input: &Value, output: &Value, path: &str) -> Option<String> {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => i.iter().find_map(|(k, v)| {
            let here = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match o.get(k) {
                _ if v.is_null() => None,
                None => Some(here),
                Some(ov) => lost_field(v, ov, &here),
            }
        }),
        (Value::Array(i), Value::Array(o)) => i
            .iter()
            .zip(o)
            .enumerate()
            .find_map(|(n, (iv, ov))| lost_field(iv, ov, &format!("{path}[{n}]"))),
        _ => None,
    }
}
