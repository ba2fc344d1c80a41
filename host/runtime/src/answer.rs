//! Checks of a guest's answer after the call: a bounded size, and a sane `describe`.
//! (Whether a volume can become a PV, capacity included, is `wasm_provisioner_rules::volume`'s business.)

use super::limits::MAX_ANSWER_BYTES;
use wasm_provisioner_rules::types::{
    BackendCapacity, Capability, DeleteError, ExpandError, NodeSelectorRequirement,
    NodeSelectorTerm, PluginInfo, ProvisionError, Volume, VolumeSource,
};

/// Bytes each list element counts for on top of its strings: a list of a million empty
/// strings is as hostile as a megabyte of text.
const ELEMENT_BYTES: usize = 8;

/// The size of an answer: its string bytes, plus [`ELEMENT_BYTES`] per list element.
pub(crate) trait AnswerSize {
    fn answer_bytes(&self) -> usize;
}

impl AnswerSize for String {
    fn answer_bytes(&self) -> usize {
        self.len()
    }
}

impl<T: AnswerSize> AnswerSize for Vec<T> {
    fn answer_bytes(&self) -> usize {
        self.iter()
            .map(|item| item.answer_bytes().saturating_add(ELEMENT_BYTES))
            .fold(0, usize::saturating_add)
    }
}

impl<T: AnswerSize> AnswerSize for Option<T> {
    fn answer_bytes(&self) -> usize {
        self.as_ref().map_or(0, AnswerSize::answer_bytes)
    }
}

impl<A: AnswerSize, B: AnswerSize> AnswerSize for (A, B) {
    fn answer_bytes(&self) -> usize {
        self.0.answer_bytes().saturating_add(self.1.answer_bytes())
    }
}

impl AnswerSize for NodeSelectorRequirement {
    fn answer_bytes(&self) -> usize {
        sum(&[
            self.key.answer_bytes(),
            self.operator.answer_bytes(),
            self.values.answer_bytes(),
        ])
    }
}

impl AnswerSize for NodeSelectorTerm {
    fn answer_bytes(&self) -> usize {
        self.match_expressions.answer_bytes()
    }
}

impl AnswerSize for VolumeSource {
    fn answer_bytes(&self) -> usize {
        match self {
            VolumeSource::HostPath(s) => sum(&[s.path.answer_bytes(), s.path_type.answer_bytes()]),
            VolumeSource::Local(s) => sum(&[s.path.answer_bytes(), s.fs_type.answer_bytes()]),
            VolumeSource::Nfs(s) => sum(&[s.server.answer_bytes(), s.path.answer_bytes()]),
            VolumeSource::Csi(s) => sum(&[
                s.driver.answer_bytes(),
                s.volume_handle.answer_bytes(),
                s.fs_type.answer_bytes(),
                s.volume_attributes.answer_bytes(),
            ]),
            VolumeSource::Iscsi(s) => sum(&[
                s.target_portal.answer_bytes(),
                s.iqn.answer_bytes(),
                s.iscsi_interface.answer_bytes(),
                s.fs_type.answer_bytes(),
                s.portals.answer_bytes(),
            ]),
            VolumeSource::Json(json) => json.answer_bytes(),
        }
    }
}

impl AnswerSize for Volume {
    fn answer_bytes(&self) -> usize {
        sum(&[
            self.source.answer_bytes(),
            self.node_affinity.answer_bytes(),
            self.labels.answer_bytes(),
            self.annotations.answer_bytes(),
            self.mount_options.answer_bytes(),
        ])
    }
}

impl AnswerSize for ProvisionError {
    fn answer_bytes(&self) -> usize {
        match self {
            ProvisionError::Ignored(m)
            | ProvisionError::Failed(m)
            | ProvisionError::InBackground(m)
            | ProvisionError::Reschedule(m)
            | ProvisionError::Infeasible(m) => m.answer_bytes(),
        }
    }
}

impl AnswerSize for DeleteError {
    fn answer_bytes(&self) -> usize {
        match self {
            DeleteError::Ignored(m) | DeleteError::Failed(m) | DeleteError::InBackground(m) => {
                m.answer_bytes()
            }
        }
    }
}

impl AnswerSize for ExpandError {
    fn answer_bytes(&self) -> usize {
        match self {
            ExpandError::Failed(m) | ExpandError::InBackground(m) | ExpandError::Infeasible(m) => {
                m.answer_bytes()
            }
        }
    }
}

impl AnswerSize for PluginInfo {
    fn answer_bytes(&self) -> usize {
        sum(&[
            self.name.answer_bytes(),
            self.version.answer_bytes(),
            self.data_source_kinds.answer_bytes(),
            self.capabilities.len().saturating_mul(ELEMENT_BYTES),
        ])
    }
}

/// Numbers only: nothing a guest can grow.
macro_rules! fixed_size {
    ($($t:ty),*) => {$(
        impl AnswerSize for $t {
            fn answer_bytes(&self) -> usize {
                0
            }
        }
    )*};
}
fixed_size!((), bool, u64, BackendCapacity);

impl<T: AnswerSize, E: AnswerSize> AnswerSize for Result<T, E> {
    fn answer_bytes(&self) -> usize {
        match self {
            Ok(ok) => ok.answer_bytes(),
            Err(err) => err.answer_bytes(),
        }
    }
}

fn sum(parts: &[usize]) -> usize {
    parts.iter().copied().fold(0, usize::saturating_add)
}

/// Refuses an answer bigger than [`MAX_ANSWER_BYTES`].
pub(crate) fn check_size(answer: &impl AnswerSize) -> Result<(), String> {
    let size = answer.answer_bytes();
    if size > MAX_ANSWER_BYTES {
        Err(format!(
            "the answer is {size} bytes, more than the {MAX_ANSWER_BYTES} bytes an answer may have"
        ))
    } else {
        Ok(())
    }
}

/// Most characters of the plugin's name and version in `describe`.
const MAX_INFO_FIELD: usize = 63;

/// Checks `describe`'s answer; `exported` is the optional capabilities the component
/// exports, which the answer must list, no more and no fewer.
pub(crate) fn check_info(info: &PluginInfo, exported: &[Capability]) -> Result<(), String> {
    check_size(info)?;
    let mut listed = info.capabilities.clone();
    listed.sort();
    listed.dedup();
    if listed != exported {
        let names = |list: &[Capability]| {
            let names: Vec<&str> = list.iter().map(|c| c.as_str()).collect();
            format!("[{}]", names.join(", "))
        };
        return Err(format!(
            "describe lists the capabilities {} but the component exports the interfaces of {}: \
             a plugin must export exactly the capabilities it lists (the SDKs list them for you)",
            names(&listed),
            names(exported)
        ));
    }
    if info.name.trim().is_empty() {
        return Err("describe returned an empty plugin name".into());
    }
    for (field, value) in [("name", &info.name), ("version", &info.version)] {
        if value.chars().count() > MAX_INFO_FIELD || value.chars().any(char::is_control) {
            return Err(format!(
                "describe returned a plugin {field} longer than {MAX_INFO_FIELD} characters or with control characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_provisioner_rules::types::{HostPathSource, VolumeMode};

    fn volume(path: &str) -> Volume {
        Volume {
            capacity_bytes: 10,
            source: VolumeSource::HostPath(HostPathSource {
                path: path.into(),
                path_type: Some("DirectoryOrCreate".into()),
            }),
            node_affinity: vec![],
            labels: vec![("a".into(), "b".into())],
            annotations: vec![],
            mount_options: vec![],
            volume_mode: Some(VolumeMode::Filesystem),
        }
    }

    #[test]
    fn size_counts_strings_and_elements() {
        // "/x" + "DirectoryOrCreate" + ("a" + "b" + 8)
        assert_eq!(volume("/x").answer_bytes(), 2 + 17 + 2 + ELEMENT_BYTES);
    }

    #[test]
    fn oversized_volume_is_refused() {
        let big = volume(&"x".repeat(MAX_ANSWER_BYTES + 1));
        assert!(check_size(&big).unwrap_err().contains("more than the"));
        let mut many = volume("/x");
        many.mount_options = vec![String::new(); MAX_ANSWER_BYTES / ELEMENT_BYTES + 1];
        assert!(check_size(&many).is_err());
        assert!(check_size(&volume("/x")).is_ok());
    }

    #[test]
    fn info_needs_a_sane_name() {
        let mut info = PluginInfo {
            name: "hostpath".into(),
            version: "1.0.0".into(),
            supports_block: false,
            data_source_kinds: vec![],
            capabilities: vec![],
        };
        assert!(check_info(&info, &[]).is_ok());
        info.name = " ".into();
        assert!(check_info(&info, &[]).is_err());
        info.name = "x".repeat(64);
        assert!(check_info(&info, &[]).is_err());
    }

    #[test]
    fn info_lists_exactly_the_exported_capabilities() {
        let mut info = PluginInfo {
            name: "hostpath".into(),
            version: "1.0.0".into(),
            supports_block: false,
            data_source_kinds: vec![],
            capabilities: vec![Capability::ValidateClass, Capability::Expand],
        };
        let exported = [Capability::Expand, Capability::ValidateClass];
        assert!(check_info(&info, &exported).is_ok());
        let error = check_info(&info, &exported[..1]).unwrap_err();
        assert!(
            error.contains("lists the capabilities [expand, validate-class]"),
            "{error}"
        );
        assert!(
            error.contains("exports the interfaces of [expand]"),
            "{error}"
        );
        info.capabilities.clear();
        assert!(check_info(&info, &exported).is_err());
    }
}
