//! Grants: what each plugin module may touch, and under which limits it runs.
//!
//! Grants come from one YAML file the cluster admin controls (`--grants FILE`, mounted
//! from a ConfigMap in production), never from a claim or a class. By default a module
//! sees no filesystem, no network and no environment; the file can grant it directories
//! (WASI preopens) and outbound HTTP to listed `host:port` authorities, each bounded by
//! the host-level `allow` list, and can override its limits.
//!
//! ```yaml
//! allow:
//!   directories: [/var/lib/wasm-provisioner]
//!   httpHosts: ["storage-api.example.com:443"]
//! defaults:
//!   limits: { timeoutSeconds: 10, memoryBytes: 134217728, maxConcurrentCalls: 8 }
//! modules:
//!   hostpath:
//!     limits: { timeoutSeconds: 5 }
//!     directories:
//!       - { host: /var/lib/wasm-provisioner/hostpath, guest: /volumes, mode: read-write }
//!     http:
//!       - { host: "storage-api.example.com:443", scheme: https }
//!     secrets: ["${pvc.namespace}/storage-api-token"]
//! ```

pub mod directories;
pub mod limits;
pub mod source;
pub mod volumes;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use self::limits::{Limits, MAX_CONCURRENT_CALLS, MAX_MEMORY_BYTES, MAX_TIMEOUT, MIN_MEMORY_BYTES};
use self::source::{ModuleSource, RegistryFile, RegistrySettings, SourceFile};
use self::volumes::{VolumeGrants, VolumesFile};

/// Access a module has to a granted directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirectoryMode {
    ReadOnly,
    ReadWrite,
}

/// URL scheme of an HTTP grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HttpScheme {
    Http,
    #[default]
    Https,
}

impl HttpScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpScheme::Http => "http",
            HttpScheme::Https => "https",
        }
    }
}

/// A host directory made visible to a module at a guest path (a WASI preopen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryGrant {
    /// Absolute path on the host (the provisioner's container).
    pub host: PathBuf,
    /// Absolute path the guest sees, such as `/volumes`.
    pub guest: String,
    pub mode: DirectoryMode,
}

/// Outbound HTTP to one authority with one scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    /// Host name or IP literal, lowercase, without brackets.
    pub host: String,
    pub port: u16,
    pub scheme: HttpScheme,
}

impl HttpGrant {
    /// Whether a request to `scheme://host:port` is covered by this grant.
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.scheme.as_str().eq_ignore_ascii_case(scheme)
            && normalize_host(host) == self.host
            && self.port == port
    }
}

impl fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(
                f,
                "{}://[{}]:{}",
                self.scheme.as_str(),
                self.host,
                self.port
            )
        } else {
            write!(f, "{}://{}:{}", self.scheme.as_str(), self.host, self.port)
        }
    }
}

/// Everything granted to one module.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModuleGrants {
    pub limits: Limits,
    pub directories: Vec<DirectoryGrant>,
    pub http: Vec<HttpGrant>,
    /// The volume sources it may publish (nothing by default).
    pub volumes: VolumeGrants,
    /// The Secrets it may receive, as `namespace/name` patterns (each part a name or a
    /// template with `${pvc.namespace}`, `${pvc.name}`, `${pv.name}`); none by default.
    /// A class names the Secret; this bounds which ones it can name.
    pub secrets: Vec<String>,
    /// Where its bytes come from when not from the modules directory: an OCI artifact
    /// (see `source`, docs/modules.md).
    pub source: Option<ModuleSource>,
}

/// The validated grants file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grants {
    /// Limits of modules the file does not name (and the base of those it does).
    pub defaults: Limits,
    pub modules: BTreeMap<String, ModuleGrants>,
    /// How to reach the registries modules come from (`registries`).
    pub registries: Vec<RegistrySettings>,
}

impl Grants {
    /// No capabilities for anyone, default limits.
    pub fn none() -> Self {
        Grants::default()
    }

    /// Reads and validates a grants file.
    pub fn load(path: &Path) -> Result<Self, GrantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| GrantsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates grants; `source` names the file in error messages.
    pub fn from_yaml(text: &str, source: &str) -> Result<Self, GrantsError> {
        let parse_error = |error: serde_yaml::Error| GrantsError::Parse {
            source_name: source.to_string(),
            message: error.to_string(),
        };
        let file: GrantsFile = if text.trim().is_empty() {
            GrantsFile::default()
        } else {
            // A generic YAML value refuses duplicate keys at any depth, where maps of
            // the typed file would keep the last one silently: a module granted twice is
            // a mistake to report, not to resolve.
            serde_yaml::from_str::<serde_yaml::Value>(text).map_err(parse_error)?;
            serde_yaml::from_str(text).map_err(parse_error)?
        };
        file.validate().map_err(|problems| GrantsError::Invalid {
            source_name: source.to_string(),
            problems,
        })
    }

    /// The largest memory budget any module has (the defaults' or a module's own): no
    /// linear memory may grow past it.
    pub fn max_memory_bytes(&self) -> u64 {
        self.modules
            .values()
            .map(|module| module.limits.memory_bytes)
            .fold(self.defaults.memory_bytes, u64::max)
    }

    /// What `module` is granted: its own entry, or the defaults and nothing else.
    pub fn for_module(&self, module: &str) -> ModuleGrants {
        self.modules.get(module).cloned().unwrap_or(ModuleGrants {
            limits: self.defaults,
            ..ModuleGrants::default()
        })
    }

    /// The modules whose bytes come from an OCI registry, with their sources.
    pub fn oci_sources(&self) -> BTreeMap<String, ModuleSource> {
        self.modules
            .iter()
            .filter_map(|(name, grants)| Some((name.clone(), grants.source.clone()?)))
            .collect()
    }

    /// The settings of registry `host` (`host:port`); the defaults (https, the system's
    /// CAs, anonymous) when the file does not list it.
    pub fn registry(&self, host: &str) -> RegistrySettings {
        self.registries
            .iter()
            .find(|registry| registry.host == host)
            .cloned()
            .unwrap_or_else(|| RegistrySettings {
                host: host.to_string(),
                ..RegistrySettings::default()
            })
    }
}

/// Why a grants file was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum GrantsError {
    #[error("cannot read the grants file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the grants file {source_name} is not valid YAML for grants: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("the grants file {source_name} is refused:\n  - {}", problems.join("\n  - "))]
    Invalid {
        source_name: String,
        problems: Vec<String>,
    },
}

// ---- the file as written ------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GrantsFile {
    #[serde(default)]
    allow: AllowFile,
    #[serde(default)]
    registries: Vec<RegistryFile>,
    #[serde(default)]
    defaults: DefaultsFile,
    #[serde(default)]
    modules: BTreeMap<String, ModuleFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AllowFile {
    #[serde(default)]
    directories: Vec<String>,
    #[serde(default)]
    http_hosts: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DefaultsFile {
    #[serde(default)]
    limits: LimitsFile,
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LimitsFile {
    timeout_seconds: Option<f64>,
    memory_bytes: Option<u64>,
    max_concurrent_calls: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ModuleFile {
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    directories: Vec<DirectoryFile>,
    #[serde(default)]
    http: Vec<HttpFile>,
    #[serde(default)]
    volumes: VolumesFile,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    source: Option<SourceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DirectoryFile {
    host: String,
    guest: String,
    mode: DirectoryMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HttpFile {
    host: String,
    #[serde(default)]
    scheme: HttpScheme,
}

impl GrantsFile {
    fn validate(self) -> Result<Grants, Vec<String>> {
        let mut problems = Vec::new();

        let mut allowed_dirs = Vec::new();
        for (i, dir) in self.allow.directories.iter().enumerate() {
            match absolute_normal_path(dir) {
                Ok(path) => allowed_dirs.push(path),
                Err(why) => problems.push(format!("allow.directories[{i}] {dir:?}: {why}")),
            }
        }
        let mut allowed_hosts = Vec::new();
        for (i, entry) in self.allow.http_hosts.iter().enumerate() {
            match parse_authority(entry) {
                Ok(authority) => allowed_hosts.push(authority),
                Err(why) => problems.push(format!("allow.httpHosts[{i}] {entry:?}: {why}")),
            }
        }

        let registries = source::validate_registries(self.registries, &mut problems);

        let defaults =
            self.defaults
                .limits
                .apply(Limits::default(), "defaults.limits", &mut problems);

        let mut modules = BTreeMap::new();
        for (name, module) in self.modules {
            let at = format!("modules.{name}");
            if !crate::is_valid_module_name(&name) {
                problems.push(format!(
                    "{at}: {name:?} is not a valid module name (lowercase letters, digits and '-', \
                     at most 63 characters, starting and ending with a letter or digit)"
                ));
            }
            let limits = module
                .limits
                .apply(defaults, &format!("{at}.limits"), &mut problems);

            let mut directories: Vec<DirectoryGrant> = Vec::new();
            for (i, dir) in module.directories.into_iter().enumerate() {
                let field = format!("{at}.directories[{i}]");
                let host = match absolute_normal_path(&dir.host) {
                    Ok(host) => host,
                    Err(why) => {
                        problems.push(format!("{field}.host {:?}: {why}", dir.host));
                        continue;
                    }
                };
                if !allowed_dirs.iter().any(|allowed| within(&host, allowed)) {
                    problems.push(format!(
                        "{field}.host {}: outside the host allowlist; add {} (or a parent \
                         directory) to allow.directories",
                        host.display(),
                        host.display()
                    ));
                    continue;
                }
                let guest = match absolute_normal_path(&dir.guest) {
                    Ok(guest) => guest.to_string_lossy().into_owned(),
                    Err(why) => {
                        problems.push(format!("{field}.guest {:?}: {why}", dir.guest));
                        continue;
                    }
                };
                if directories.iter().any(|other| other.guest == guest) {
                    problems.push(format!("{field}.guest {guest}: granted twice"));
                    continue;
                }
                directories.push(DirectoryGrant {
                    host,
                    guest,
                    mode: dir.mode,
                });
            }

            let mut http = Vec::new();
            for (i, grant) in module.http.into_iter().enumerate() {
                let field = format!("{at}.http[{i}]");
                let (host, port) = match parse_authority(&grant.host) {
                    Ok(authority) => authority,
                    Err(why) => {
                        problems.push(format!("{field}.host {:?}: {why}", grant.host));
                        continue;
                    }
                };
                if !allowed_hosts.contains(&(host.clone(), port)) {
                    problems.push(format!(
                        "{field}.host {:?}: not in the host allowlist; add it to allow.httpHosts",
                        grant.host
                    ));
                    continue;
                }
                http.push(HttpGrant {
                    host,
                    port,
                    scheme: grant.scheme,
                });
            }

            let volumes =
                module
                    .volumes
                    .validate(&format!("{at}.volumes"), &directories, &mut problems);
            for (i, pattern) in module.secrets.iter().enumerate() {
                if let Err(why) = wasm_provisioner_rules::secret::check_pattern(pattern) {
                    problems.push(format!("{at}.secrets[{i}] {pattern:?}: {why}"));
                }
            }
            let source = module
                .source
                .and_then(|source| source.validate(&at, &registries, &mut problems));
            modules.insert(
                name,
                ModuleGrants {
                    limits,
                    directories,
                    http,
                    volumes,
                    secrets: module.secrets,
                    source,
                },
            );
        }
        overlapping_writable_directories(&modules, &mut problems);

        if problems.is_empty() {
            Ok(Grants {
                defaults,
                modules,
                registries,
            })
        } else {
            Err(problems)
        }
    }
}

/// Two directory grants that overlap (one is the other or lies inside it) where at least
/// one is read-write: the writer could replace a directory on the other grant's path
/// with a symlink, or read and write another module's files. Refused for any two grants,
/// of one module or of two.
fn overlapping_writable_directories(
    modules: &BTreeMap<String, ModuleGrants>,
    problems: &mut Vec<String>,
) {
    let grants: Vec<(String, &DirectoryGrant)> = modules
        .iter()
        .flat_map(|(name, module)| {
            module
                .directories
                .iter()
                .enumerate()
                .map(move |(i, dir)| (format!("modules.{name}.directories[{i}]"), dir))
        })
        .collect();
    for (i, (field, dir)) in grants.iter().enumerate() {
        for (other_field, other) in &grants[i + 1..] {
            let writable =
                dir.mode == DirectoryMode::ReadWrite || other.mode == DirectoryMode::ReadWrite;
            if writable && (dir.host.starts_with(&other.host) || other.host.starts_with(&dir.host))
            {
                problems.push(format!(
                    "{field}.host {} and {other_field}.host {} overlap and one of them is read-write; \
                     a writer could swap a directory on the other's path for a symlink. Give \
                     each grant its own directory, side by side",
                    dir.host.display(),
                    other.host.display()
                ));
            }
        }
    }
}

impl LimitsFile {
    fn apply(self, base: Limits, at: &str, problems: &mut Vec<String>) -> Limits {
        let mut limits = base;
        if let Some(seconds) = self.timeout_seconds {
            if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT.as_secs_f64() {
                limits.timeout = Duration::from_secs_f64(seconds);
            } else {
                problems.push(format!(
                    "{at}.timeoutSeconds {seconds}: must be more than 0 and at most {}",
                    MAX_TIMEOUT.as_secs()
                ));
            }
        }
        if let Some(bytes) = self.memory_bytes {
            if (MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&bytes) {
                limits.memory_bytes = bytes;
            } else {
                problems.push(format!(
                    "{at}.memoryBytes {bytes}: must be between {MIN_MEMORY_BYTES} and {MAX_MEMORY_BYTES}"
                ));
            }
        }
        if let Some(calls) = self.max_concurrent_calls {
            if (1..=MAX_CONCURRENT_CALLS).contains(&calls) {
                limits.max_concurrent_calls = calls;
            } else {
                problems.push(format!(
                    "{at}.maxConcurrentCalls {calls}: must be between 1 and {MAX_CONCURRENT_CALLS}"
                ));
            }
        }
        limits
    }
}

/// An absolute path without `.` or `..` components (so a prefix check means what it says).
fn absolute_normal_path(path: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err("must be an absolute path");
    }
    let mut normal = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => normal.push(part),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err("must not contain '.' or '..' components");
            }
        }
    }
    Ok(normal)
}

/// Whether `path` is `allowed` or below it, lexically and, when both exist, after
/// resolving symlinks (a symlink inside an allowed directory must not lead out of it).
fn within(path: &Path, allowed: &Path) -> bool {
    if !path.starts_with(allowed) {
        return false;
    }
    match (path.canonicalize(), allowed.canonicalize()) {
        (Ok(real), Ok(real_allowed)) => real.starts_with(real_allowed),
        _ => true,
    }
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// `host:port` (an IPv6 literal in brackets) into a normalized host and the port.
fn parse_authority(text: &str) -> Result<(String, u16), &'static str> {
    let authority: ::http::uri::Authority = text
        .parse()
        .map_err(|_| "must be host:port, such as storage-api.example.com:443")?;
    if authority.as_str().contains('@') {
        return Err("must not contain user information");
    }
    let port = authority
        .port_u16()
        .ok_or("must name the port explicitly, such as storage-api.example.com:443")?;
    let host = normalize_host(authority.host());
    if host.is_empty() {
        return Err("must name a host");
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Grants, GrantsError> {
        Grants::from_yaml(text, "grants.yaml")
    }

    fn problems(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    const FULL: &str = r#"
allow:
  directories: [/var/lib/wasm-provisioner]
  httpHosts: ["storage-api.example.com:443", "[::1]:8080"]
defaults:
  limits: { timeoutSeconds: 20 }
modules:
  hostpath:
    limits: { timeoutSeconds: 5, memoryBytes: 67108864, maxConcurrentCalls: 4 }
    directories:
      - { host: /var/lib/wasm-provisioner/hostpath, guest: /volumes, mode: read-write }
    http:
      - { host: "Storage-API.example.com:443", scheme: https }
      - { host: "[::1]:8080", scheme: http }
  other: {}
"#;

    #[test]
    fn full_file_is_accepted() {
        let grants = parse(FULL).unwrap();
        assert_eq!(grants.defaults.timeout, Duration::from_secs(20));
        let hostpath = grants.for_module("hostpath");
        assert_eq!(hostpath.limits.timeout, Duration::from_secs(5));
        assert_eq!(hostpath.limits.memory_bytes, 64 * 1024 * 1024);
        assert_eq!(hostpath.limits.max_concurrent_calls, 4);
        assert_eq!(
            hostpath.directories,
            vec![DirectoryGrant {
                host: "/var/lib/wasm-provisioner/hostpath".into(),
                guest: "/volumes".into(),
                mode: DirectoryMode::ReadWrite,
            }]
        );
        assert!(hostpath.http[0].allows("https", "storage-api.example.com", 443));
        assert!(!hostpath.http[0].allows("http", "storage-api.example.com", 443));
        assert!(!hostpath.http[0].allows("https", "storage-api.example.com", 8443));
        assert!(hostpath.http[1].allows("http", "[::1]", 8080));
        // A module listed without limits inherits the file's defaults.
        assert_eq!(
            grants.for_module("other").limits.timeout,
            Duration::from_secs(20)
        );
        // A module not listed gets the defaults and nothing else.
        let unlisted = grants.for_module("unlisted");
        assert_eq!(
            unlisted.limits.memory_bytes,
            crate::limits::DEFAULT_MEMORY_BYTES
        );
        assert!(unlisted.directories.is_empty() && unlisted.http.is_empty());
    }

    #[test]
    fn secret_patterns_are_granted_per_module_and_checked() {
        let grants = parse(
            r#"
modules:
  api: { secrets: ["${pvc.namespace}/api-token", "storage/shared"] }
"#,
        )
        .unwrap();
        assert_eq!(
            grants.for_module("api").secrets,
            ["${pvc.namespace}/api-token", "storage/shared"]
        );
        assert!(grants.for_module("other").secrets.is_empty());
        let message = problems("modules: { api: { secrets: [\"token\", \"${pvc.uid}/x\"] } }");
        assert!(
            message.contains("modules.api.secrets[0] \"token\""),
            "{message}"
        );
        assert!(message.contains("unknown variable ${pvc.uid}"), "{message}");
    }

    #[test]
    fn empty_file_grants_nothing() {
        assert_eq!(parse("").unwrap(), Grants::none());
    }

    #[test]
    fn directory_outside_allowlist_is_refused_naming_module_and_entry() {
        let message = problems(
            r#"
allow: { directories: [/var/lib/wasm-provisioner] }
modules:
  hostpath:
    directories: [{ host: /etc, guest: /volumes, mode: read-only }]
"#,
        );
        assert!(
            message.contains("modules.hostpath.directories[0].host /etc"),
            "{message}"
        );
        assert!(
            message.contains("add /etc (or a parent directory) to allow.directories"),
            "{message}"
        );
    }

    #[test]
    fn parent_components_cannot_climb_out_of_the_allowlist() {
        let message = problems(
            r#"
allow: { directories: [/var/lib/wasm-provisioner] }
modules:
  hostpath:
    directories: [{ host: "/var/lib/wasm-provisioner/../../etc", guest: /v, mode: read-only }]
"#,
        );
        assert!(message.contains("'..'"), "{message}");
    }

    #[test]
    fn prefix_of_a_name_is_not_within() {
        let message = problems(
            r#"
allow: { directories: [/var/lib/wasm] }
modules:
  m:
    directories: [{ host: /var/lib/wasm-other, guest: /v, mode: read-only }]
"#,
        );
        assert!(message.contains("outside the host allowlist"), "{message}");
    }

    #[test]
    fn http_host_outside_allowlist_is_refused() {
        let message = problems(
            r#"
allow: { httpHosts: ["a.example.com:443"] }
modules:
  m:
    http: [{ host: "b.example.com:443" }]
"#,
        );
        assert!(
            message.contains("modules.m.http[0].host \"b.example.com:443\""),
            "{message}"
        );
        assert!(message.contains("add it to allow.httpHosts"), "{message}");
    }

    #[test]
    fn http_host_needs_a_port() {
        let message = problems(r#"allow: { httpHosts: ["a.example.com"] }"#);
        assert!(message.contains("must name the port"), "{message}");
    }

    #[test]
    fn bad_limits_and_names_are_all_reported() {
        let message = problems(
            r#"
modules:
  Bad_Name:
    limits: { timeoutSeconds: 0, memoryBytes: 10, maxConcurrentCalls: 0 }
"#,
        );
        assert!(
            message.contains("modules.Bad_Name: \"Bad_Name\" is not a valid module name"),
            "{message}"
        );
        assert!(
            message.contains("modules.Bad_Name.limits.timeoutSeconds 0"),
            "{message}"
        );
        assert!(
            message.contains("modules.Bad_Name.limits.memoryBytes 10"),
            "{message}"
        );
        assert!(
            message.contains("modules.Bad_Name.limits.maxConcurrentCalls 0"),
            "{message}"
        );
    }

    #[test]
    fn unknown_fields_are_errors() {
        let message = problems("modules: { m: { directory: [] } }");
        assert!(message.contains("unknown field `directory`"), "{message}");
    }

    #[test]
    fn relative_guest_path_is_refused() {
        let message = problems(
            r#"
allow: { directories: [/srv] }
modules:
  m:
    directories: [{ host: /srv/a, guest: volumes, mode: read-write }]
"#,
        );
        assert!(
            message
                .contains("modules.m.directories[0].guest \"volumes\": must be an absolute path"),
            "{message}"
        );
    }

    #[test]
    fn duplicate_keys_are_errors_not_last_wins() {
        let message = problems(
            r#"
modules:
  hostpath: { limits: { timeoutSeconds: 5 } }
  hostpath: { limits: { timeoutSeconds: 50 } }
"#,
        );
        assert!(message.contains("duplicate"), "{message}");
        assert!(message.contains("hostpath"), "{message}");
        let message =
            problems("modules: { m: { limits: { timeoutSeconds: 1, timeoutSeconds: 2 } } }");
        assert!(message.contains("duplicate"), "{message}");
    }

    #[test]
    fn overlapping_grants_with_a_writer_are_refused() {
        let message = problems(
            r#"
allow: { directories: [/srv] }
modules:
  a: { directories: [{ host: /srv/data, guest: /v, mode: read-write }] }
  b: { directories: [{ host: /srv/data/b, guest: /v, mode: read-only }] }
"#,
        );
        assert!(
            message.contains("modules.a.directories[0].host /srv/data and modules.b.directories[0].host /srv/data/b overlap"),
            "{message}"
        );
        // The same directory read-write for two modules, and nested grants of one module.
        let message = problems(
            r#"
allow: { directories: [/srv] }
modules:
  a: { directories: [{ host: /srv/x, guest: /v, mode: read-write }, { host: /srv/x/y, guest: /w, mode: read-only }] }
  b: { directories: [{ host: /srv/z, guest: /v, mode: read-write }] }
  c: { directories: [{ host: /srv/z, guest: /v, mode: read-write }] }
"#,
        );
        assert!(
            message.contains(
                "modules.a.directories[0].host /srv/x and modules.a.directories[1].host /srv/x/y"
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "modules.b.directories[0].host /srv/z and modules.c.directories[0].host /srv/z"
            ),
            "{message}"
        );
        // Read-only overlaps and side-by-side read-write grants are fine.
        parse(
            r#"
allow: { directories: [/srv] }
modules:
  a: { directories: [{ host: /srv/shared, guest: /s, mode: read-only }, { host: /srv/a, guest: /v, mode: read-write }] }
  b: { directories: [{ host: /srv/shared/sub, guest: /s, mode: read-only }, { host: /srv/ab, guest: /v, mode: read-write }] }
"#,
        )
        .unwrap();
    }

    #[test]
    fn volume_grants_are_parsed_and_validated_per_module() {
        let grants = parse(
            r#"
allow: { directories: [/var/lib/wasm-provisioner, /mnt/disks] }
modules:
  hostpath:
    directories:
      - { host: /var/lib/wasm-provisioner/hostpath, guest: /volumes, mode: read-write }
      - { host: /mnt/disks, guest: /disks, mode: read-write }
    volumes:
      hostPath: [{ pathPrefix: /var/lib/wasm-provisioner/hostpath }]
      local: [{ pathPrefix: /mnt/disks }]
"#,
        )
        .unwrap();
        let volumes = grants.for_module("hostpath").volumes;
        assert_eq!(
            volumes.host_path[0].types,
            ["Directory", "DirectoryOrCreate"]
        );
        assert_eq!(volumes.local[0].path_prefix, "/mnt/disks");
        assert_eq!(volumes.local[0].directory, "/disks");
        assert!(grants.for_module("unlisted").volumes.is_empty());
        let message = problems(
            "modules: { m: { volumes: { hostPath: [{ pathPrefix: /, types: [Socket] }], nfs: [{ server: x, pathPrefix: rel }], other: { cephfs: { secrets: [bad] } } } } }",
        );
        assert!(
            message.contains("modules.m.volumes.hostPath[0]"),
            "{message}"
        );
        assert!(
            message.contains("modules.m.volumes.nfs[0].pathPrefix \"rel\""),
            "{message}"
        );
        assert!(
            message.contains("modules.m.volumes.other.cephfs.secrets[0] \"bad\""),
            "{message}"
        );
        let message = problems("modules: { m: { volumes: { hostpath: [] } } }");
        assert!(message.contains("unknown field `hostpath`"), "{message}");
    }

    fn public_key_file(dir: &Path, name: &str) -> PathBuf {
        let signer = sigstore::crypto::SigningScheme::default()
            .create_signer()
            .unwrap();
        let pem = signer
            .to_sigstore_keypair()
            .unwrap()
            .public_key_to_pem()
            .unwrap();
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    }

    #[test]
    fn oci_sources_registries_and_signature_rules_are_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let release = public_key_file(dir.path(), "release.pub");
        let team = public_key_file(dir.path(), "team.pub");
        let ca = dir.path().join("ca.crt");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let hex = "ab".repeat(32);
        let grants = parse(&format!(
            r#"
registries:
  - host: Registry.Example.com:5000
    caFile: {ca}
    pullSecret: /etc/wasm-provisioner/pull/.dockerconfigjson
    mirror: mirror.internal:5000
    signatures: {{ allOf: [{{ publicKey: {release} }}] }}
  - {{ host: "127.0.0.1:5001", insecure: true }}
modules:
  hostpath:
    source:
      oci: registry.example.com:5000/wasm-provisioner/hostpath@sha256:{hex}
  tagged:
    source:
      oci: 127.0.0.1:5001/tagged:v1
      signatures: {{ anyOf: [{{ publicKey: {release} }}, {{ publicKey: {team} }}] }}
  files: {{}}
"#,
            ca = ca.display(),
            release = release.display(),
            team = team.display(),
        ))
        .unwrap();
        let sources = grants.oci_sources();
        assert_eq!(sources.keys().collect::<Vec<_>>(), ["hostpath", "tagged"]);
        let hostpath = &sources["hostpath"];
        assert_eq!(hostpath.oci.pin, source::Pin::Digest(hex));
        // The registry's rule applies to a module that has none of its own.
        let rule = hostpath.signatures.as_ref().unwrap();
        assert_eq!(rule.all_of.len(), 1);
        assert_eq!(rule.all_of[0].path, release);
        let tagged = sources["tagged"].signatures.as_ref().unwrap();
        assert!(tagged.all_of.is_empty());
        assert_eq!(tagged.any_of.len(), 2);
        let registry = grants.registry("registry.example.com:5000");
        assert_eq!(registry.mirror.as_deref(), Some("mirror.internal:5000"));
        assert_eq!(registry.ca_file.as_deref(), Some(ca.as_path()));
        assert!(!registry.insecure && grants.registry("127.0.0.1:5001").insecure);
        // A registry not listed: https, no credentials.
        assert!(!grants.registry("other.example.com").insecure);
    }

    #[test]
    fn bad_sources_name_the_module_the_field_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_key = dir.path().join("not-a-key.pub");
        std::fs::write(&not_a_key, "hello").unwrap();
        let message = problems(&format!(
            r#"
registries:
  - {{ host: "r.example.com", caFile: relative/ca.crt }}
  - {{ host: "r.example.com" }}
  - {{ host: "https://r2.example.com" }}
modules:
  hostpath: {{ source: {{ oci: "hostpath:v1" }} }}
  nosig:
    source:
      oci: "r.example.com/nosig:v1"
      signatures: {{}}
  keys:
    source:
      oci: "r.example.com/keys:v1"
      signatures: {{ allOf: [{{ publicKey: /nonexistent/cosign.pub }}], anyOf: [{{ publicKey: {bad} }}] }}
"#,
            bad = not_a_key.display()
        ));
        for expected in [
            "modules.hostpath.source.oci \"hostpath:v1\": names no registry host; write registry/repository@sha256:",
            "modules.nosig.source.signatures: names no key",
            "modules.keys.source.signatures.allOf[0].publicKey \"/nonexistent/cosign.pub\": cannot be read",
            "mount the public key there",
            "modules.keys.source.signatures.anyOf[0].publicKey",
            "is not a public key cosign can verify with",
            "registries[0].caFile \"relative/ca.crt\": must be an absolute path",
            "registries[1].host r.example.com: listed twice",
            "registries[2].host \"https://r2.example.com\": must be a registry host",
        ] {
            assert!(message.contains(expected), "{expected}\n{message}");
        }
        let message =
            problems("modules: { m: { source: { oci: \"r.example.com/m:v1\", tag: x } } }");
        assert!(message.contains("unknown field `tag`"), "{message}");
    }

    #[test]
    fn the_deployed_grants_file_is_valid_and_grants_what_the_example_classes_publish() {
        let grants = parse(include_str!("../../../../deploy/grants/grants.yaml")).unwrap();
        let hostpath = grants.for_module("hostpath").volumes;
        assert_eq!(
            hostpath.host_path[0].path_prefix,
            "/var/lib/wasm-provisioner/hostpath"
        );
        assert_eq!(
            grants.for_module("nfs-subdir").volumes.nfs[0].server,
            "nfs.example.com"
        );
    }
}
