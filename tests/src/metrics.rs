//! A provisioner's and the API server's metrics as the tests and the load benchmark
//! (`bench/`) read them: the Prometheus text format, and API requests counted by verb,
//! resource and status code, from the host's (or the Go library's provisioner's)
//! `wasm_provisioner_kube_api_requests_total` or the API server's
//! `apiserver_request_total`.

use std::collections::BTreeMap;

/// One sample of a Prometheus text exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of a text exposition (comments and malformed lines skipped).
pub fn parse_samples(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let name = &line[..open];
            let (labels, after) = parse_labels(&line[open + 1..])?;
            (name, labels, after)
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    // a value, then an optional timestamp
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"} rest` into the labels and `rest`.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, after) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break index,
                c => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        text = &after[end + 1..];
    }
}

/// A request kind: Kubernetes verb (get, list, create, update, patch, delete, ...) and
/// resource (`resource` or `resource/subresource`).
pub type Kind = (String, String);

/// Requests by kind and status code.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requests(pub BTreeMap<(String, String, String), f64>);

impl Requests {
    /// The host's (or this benchmark's) own counter,
    /// `wasm_provisioner_kube_api_requests_total{verb,resource,code}`.
    pub fn from_client(samples: &[Sample]) -> Requests {
        Self::collect(
            samples,
            "wasm_provisioner_kube_api_requests_total",
            |labels| {
                Some((
                    labels.get("verb")?.clone(),
                    labels.get("resource")?.clone(),
                    labels.get("code")?.clone(),
                ))
            },
        )
    }

    /// The API server's `apiserver_request_total{verb,resource,subresource,code}`, its
    /// verbs (`POST`, `LIST`, ...) in the client's words (`create`, `list`, ...).
    pub fn from_apiserver(samples: &[Sample]) -> Requests {
        Self::collect(samples, "apiserver_request_total", |labels| {
            let verb = match labels.get("verb")?.as_str() {
                "POST" => "create",
                "GET" => "get",
                "LIST" => "list",
                "WATCH" | "WATCHLIST" => "watch",
                "PUT" => "update",
                "PATCH" => "patch",
                "APPLY" => "apply",
                "DELETE" => "delete",
                "DELETECOLLECTION" => "deletecollection",
                other => return Some((other.to_lowercase(), String::new(), String::new())),
            };
            let resource = labels.get("resource")?;
            let resource = match labels.get("subresource").map(String::as_str) {
                Some("") | None => resource.clone(),
                Some(sub) => format!("{resource}/{sub}"),
            };
            Some((verb.to_string(), resource, labels.get("code")?.clone()))
        })
    }

    fn collect(
        samples: &[Sample],
        name: &str,
        key: impl Fn(&BTreeMap<String, String>) -> Option<(String, String, String)>,
    ) -> Requests {
        let mut requests = Requests::default();
        for sample in samples.iter().filter(|s| s.name == name) {
            if let Some(key) = key(&sample.labels) {
                *requests.0.entry(key).or_default() += sample.value;
            }
        }
        requests
    }

    /// `self - earlier`, dropping zeros.
    pub fn since(&self, earlier: &Requests) -> Requests {
        let mut delta = Requests::default();
        for (key, value) in &self.0 {
            let change = value - earlier.0.get(key).copied().unwrap_or(0.0);
            if change != 0.0 {
                delta.0.insert(key.clone(), change);
            }
        }
        delta
    }

    /// `self - other`, floored at zero per key (another client's share removed).
    pub fn minus(&self, other: &Requests) -> Requests {
        let mut rest = Requests::default();
        for (key, value) in &self.0 {
            let left = value - other.0.get(key).copied().unwrap_or(0.0);
            if left > 0.0 {
                rest.0.insert(key.clone(), left);
            }
        }
        rest
    }

    /// Requests that are neither watches nor non-resource paths.
    fn counted(&self) -> impl Iterator<Item = (&(String, String, String), &f64)> {
        self.0
            .iter()
            .filter(|((verb, resource, _), _)| verb != "watch" && !resource.is_empty())
    }

    /// Writes (create, update, patch, apply, delete, deletecollection).
    pub fn writes(&self) -> f64 {
        self.counted()
            .filter(|((verb, _, _), _)| is_write(verb))
            .map(|(_, v)| v)
            .sum()
    }

    /// Writes to `resource` (such as `configmaps`, or `persistentvolumes/status`).
    pub fn writes_to(&self, resource: &str) -> f64 {
        self.counted()
            .filter(|((verb, kind, _), _)| is_write(verb) && kind == resource)
            .map(|(_, v)| v)
            .sum()
    }

    /// Reads (get, list; watches are not counted).
    pub fn reads(&self) -> f64 {
        self.counted()
            .filter(|((verb, _, _), _)| !is_write(verb))
            .map(|(_, v)| v)
            .sum()
    }

    /// Requests answered 409 Conflict.
    pub fn conflicts(&self) -> f64 {
        self.counted()
            .filter(|((_, _, code), _)| code == "409")
            .map(|(_, v)| v)
            .sum()
    }

    /// All counted requests.
    pub fn total(&self) -> f64 {
        self.counted().map(|(_, v)| v).sum()
    }

    /// Counted requests by kind (codes summed), and the 409s of each kind.
    pub fn by_kind(&self) -> BTreeMap<Kind, (f64, f64)> {
        let mut kinds: BTreeMap<Kind, (f64, f64)> = BTreeMap::new();
        for ((verb, resource, code), value) in self.counted() {
            let entry = kinds.entry((verb.clone(), resource.clone())).or_default();
            entry.0 += value;
            if code == "409" {
                entry.1 += value;
            }
        }
        kinds
    }
}

/// Whether `verb` (Kubernetes' word, as the request counter has it) changes an object.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "apply" | "delete" | "deletecollection"
    )
}

/// The provisioner's own request count (`wasm_provisioner_kube_api_requests_total`).
pub fn host_requests<P: MetricsEndpoint + ?Sized>(host: &P) -> anyhow::Result<Requests> {
    Ok(Requests::from_client(&parse_samples(
        &host.get("/metrics")?.1,
    )))
}

/// The watches a host holds open (by resource) and the bytes its watches have received,
/// from `wasm_provisioner_kube_api_watches_open` and
/// `wasm_provisioner_kube_api_response_bytes_total{verb="watch"}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Watches {
    pub open: BTreeMap<String, f64>,
    pub bytes: f64,
}

pub fn host_watches<P: MetricsEndpoint + ?Sized>(host: &P) -> anyhow::Result<Watches> {
    let mut watches = Watches::default();
    for sample in parse_samples(&host.get("/metrics")?.1) {
        let resource = sample.labels.get("resource").cloned().unwrap_or_default();
        match sample.name.as_str() {
            "wasm_provisioner_kube_api_watches_open" if sample.value > 0.0 => {
                watches.open.insert(resource, sample.value);
            }
            "wasm_provisioner_kube_api_response_bytes_total"
                if sample.labels.get("verb").map(String::as_str) == Some("watch") =>
            {
                watches.bytes += sample.value;
            }
            _ => {}
        }
    }
    Ok(watches)
}

/// The provisioner's request count once it stopped moving for `quiet` (a provisioner at
/// rest makes no request); an error when it keeps moving for 30 such looks and 15
/// minutes.
pub async fn settled_requests<P: MetricsEndpoint + ?Sized>(
    host: &P,
    quiet: std::time::Duration,
) -> anyhow::Result<Requests> {
    // Long enough for a storm's Events, which trail the work.
    let patience = quiet * 30 + std::time::Duration::from_secs(900);
    let started = std::time::Instant::now();
    let mut last = host_requests(host)?;
    while started.elapsed() < patience {
        tokio::time::sleep(quiet).await;
        let now = host_requests(host)?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    anyhow::bail!("the host's requests never settled: {last:?}")
}

/// A process serving metrics: the host, or the load benchmark's Go library provisioner.
pub trait MetricsEndpoint {
    /// A plain HTTP GET on its metrics endpoint: (status code, body).
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)>;
}

impl MetricsEndpoint for crate::host::Host {
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::host::Host::get(self, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APISERVER: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="namespace",subresource="status",verb="PUT",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
process_cpu_seconds_total 12.5
"#;

    #[test]
    fn parses_the_api_servers_request_counter() {
        let samples = parse_samples(APISERVER);
        assert_eq!(samples.len(), 6);
        let requests = Requests::from_apiserver(&samples);
        assert_eq!(requests.writes(), 12.0);
        assert_eq!(
            requests.writes_to("persistentvolumes"),
            9.0,
            "the POSTs and PATCHes, not the LIST"
        );
        assert_eq!(requests.writes_to("persistentvolumeclaims/status"), 3.0);
        assert_eq!(requests.reads(), 1.0, "watches are not counted");
        assert_eq!(requests.conflicts(), 2.0);
        let kinds = requests.by_kind();
        assert_eq!(
            kinds[&("update".into(), "persistentvolumeclaims/status".into())],
            (3.0, 0.0)
        );
        assert_eq!(
            kinds[&("patch".into(), "persistentvolumes".into())],
            (2.0, 2.0)
        );
    }

    #[test]
    fn label_values_may_hold_escapes_commas_and_braces() {
        let sample = parse_line(r#"m{a="x,\"y\"}",b="z"} 3 1700000000"#).expect("a sample");
        assert_eq!(sample.labels["a"], "x,\"y\"}");
        assert_eq!(sample.labels["b"], "z");
        assert_eq!(sample.value, 3.0);
    }

    #[test]
    fn deltas_and_subtraction() {
        let key = |v: &str| {
            (
                v.to_string(),
                "persistentvolumes".to_string(),
                "201".to_string(),
            )
        };
        let before = Requests([(key("create"), 5.0)].into());
        let after = Requests([(key("create"), 12.0), (key("delete"), 3.0)].into());
        let delta = after.since(&before);
        assert_eq!(delta.0[&key("create")], 7.0);
        let mine = Requests([(key("create"), 10.0)].into());
        let rest = delta.minus(&mine);
        assert!(!rest.0.contains_key(&key("create")), "floored at zero");
        assert_eq!(rest.0[&key("delete")], 3.0);
    }
}
