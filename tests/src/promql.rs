//! The PromQL of the alert rules and the dashboard (`deploy/observability/`), checked
//! against what a real host exports: an expression that does not parse, selects a
//! metric the host does not export, or names a label its series do not carry (in a
//! matcher, `by`, `without`, `on` or `ignoring`) is a rules file Prometheus refuses, or
//! an alert that can never fire; an annotation's `$labels.x` or a legend's `{{x}}`
//! that the result does not carry prints nothing. Prometheus' `promtool` would catch
//! the first; none of them is caught by reading the files.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::{METRIC_NAME, MatchOp, Matchers};
use promql_parser::parser::{self, Expr, LabelModifier, VectorSelector};

/// Each sample name of an exposition (histograms by their `_bucket`, `_sum` and
/// `_count` series) and the label names its samples carry.
pub type Exported = BTreeMap<String, BTreeSet<String>>;

/// Labels Prometheus adds to every series of a scrape target (the job's, and those a
/// prometheus-operator ServiceMonitor or PodMonitor sets from the target's pod).
pub const TARGET_LABELS: [&str; 7] = [
    "job",
    "instance",
    "pod",
    "namespace",
    "service",
    "container",
    "endpoint",
];

/// The sample names and label names of a Prometheus text exposition.
pub fn exported(exposition: &str) -> Exported {
    let mut exported = Exported::new();
    for sample in crate::metrics::parse_samples(exposition) {
        exported
            .entry(sample.name)
            .or_default()
            .extend(sample.labels.into_keys());
    }
    exported
}

/// Checks `expr` against `exported` and returns the labels its result series carry
/// (`None`: it is a scalar).
pub fn result_labels(expr: &str, exported: &Exported) -> Result<Option<BTreeSet<String>>, String> {
    let ast = parser::parse(expr).map_err(|error| format!("does not parse: {error}"))?;
    labels_of(&ast, exported)
}

fn labels_of(expr: &Expr, exported: &Exported) -> Result<Option<BTreeSet<String>>, String> {
    Ok(match expr {
        Expr::VectorSelector(selector) => Some(selected(selector, exported)?),
        Expr::MatrixSelector(matrix) => Some(selected(&matrix.vs, exported)?),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => None,
        Expr::Paren(paren) => labels_of(&paren.expr, exported)?,
        Expr::Unary(unary) => labels_of(&unary.expr, exported)?,
        Expr::Subquery(subquery) => labels_of(&subquery.expr, exported)?,
        Expr::Call(call) => {
            let mut vectors = Vec::new();
            for arg in &call.args.args {
                if let Some(labels) = labels_of(arg, exported)? {
                    vectors.push(labels);
                }
            }
            let first = vectors.into_iter().next();
            match (call.func.name, first) {
                // One series, labelled by the selector's equality matchers, when it
                // selects nothing.
                ("absent" | "absent_over_time", Some(_)) => Some(absent_labels(&call.args.args[0])),
                ("histogram_quantile", Some(mut labels)) => {
                    if !labels.remove("le") {
                        return Err(format!(
                            "histogram_quantile over series without `le` (keep it in `by`): {call}"
                        ));
                    }
                    Some(labels)
                }
                (_, first) => first,
            }
        }
        Expr::Aggregate(aggregate) => {
            let inner = labels_of(&aggregate.expr, exported)?.unwrap_or_default();
            let op = aggregate.op.to_string();
            match &aggregate.modifier {
                _ if ["topk", "bottomk", "limitk", "limit_ratio"].contains(&op.as_str()) => {
                    Some(inner)
                }
                None => Some(BTreeSet::new()),
                Some(modifier) => {
                    let what = format!("{op} {}", clause(modifier, "by", "without"));
                    let named = carried(modifier, &inner, &what)?;
                    Some(match modifier {
                        LabelModifier::Include(_) => named,
                        LabelModifier::Exclude(_) => inner.difference(&named).cloned().collect(),
                    })
                }
            }
        }
        Expr::Binary(binary) => {
            let lhs = labels_of(&binary.lhs, exported)?;
            let rhs = labels_of(&binary.rhs, exported)?;
            match (lhs, rhs) {
                (Some(lhs), Some(rhs)) => {
                    let op = binary.op.to_string();
                    let matching = binary.modifier.as_ref().and_then(|m| m.matching.as_ref());
                    match matching {
                        Some(modifier) => {
                            let what = format!("{op} {}", clause(modifier, "on", "ignoring"));
                            carried(modifier, &lhs, &what)?;
                            carried(modifier, &rhs, &what)?;
                        }
                        // Matching on every label (`and`, `unless`, arithmetic and
                        // comparisons; `or` keeps both sides whatever they carry): sides
                        // with different labels never match.
                        None if op != "or" && lhs != rhs => {
                            return Err(format!(
                                "the two sides of `{op}` carry different labels ({lhs:?} and {rhs:?}), so no series ever matches; use `on` or `ignoring`: {binary}"
                            ));
                        }
                        None => {}
                    }
                    Some(if op == "or" {
                        lhs.union(&rhs).cloned().collect()
                    } else {
                        lhs
                    })
                }
                (lhs, rhs) => lhs.or(rhs),
            }
        }
        Expr::Extension(_) => return Err("an extension expression".to_string()),
    })
}

/// The labels of `absent(selector)`'s series: those its equality matchers name.
fn absent_labels(arg: &Expr) -> BTreeSet<String> {
    let selector = match arg {
        Expr::VectorSelector(selector) => selector,
        Expr::MatrixSelector(matrix) => &matrix.vs,
        _ => return BTreeSet::new(),
    };
    selector
        .matchers
        .matchers
        .iter()
        .filter(|m| m.op == MatchOp::Equal && m.name != METRIC_NAME)
        .map(|m| m.name.clone())
        .collect()
}

/// The labels of a selector's series, once its metric and matchers are checked.
fn selected(selector: &VectorSelector, exported: &Exported) -> Result<BTreeSet<String>, String> {
    let name = selector
        .name
        .as_deref()
        .ok_or_else(|| format!("selects no metric by name: {selector}"))?;
    let mut labels = exported
        .get(name)
        .cloned()
        .ok_or_else(|| format!("selects `{name}`, which the host does not export"))?;
    labels.extend(TARGET_LABELS.map(String::from));
    let Matchers {
        matchers,
        or_matchers,
    } = &selector.matchers;
    for matcher in matchers.iter().chain(or_matchers.iter().flatten()) {
        if matcher.name != METRIC_NAME && !labels.contains(&matcher.name) {
            return Err(format!(
                "matches on `{}`, which `{name}` does not carry (it has {labels:?})",
                matcher.name
            ));
        }
    }
    Ok(labels)
}

/// The labels a `by`, `without`, `on` or `ignoring` names, once each is checked to be
/// one the series carry.
fn carried(
    modifier: &LabelModifier,
    labels: &BTreeSet<String>,
    what: &str,
) -> Result<BTreeSet<String>, String> {
    let named: BTreeSet<String> = modifier.labels().labels.iter().cloned().collect();
    let missing: Vec<_> = named.difference(labels).collect();
    if missing.is_empty() {
        Ok(named)
    } else {
        Err(format!(
            "`{what}` names {missing:?}, which the series do not carry (they have {labels:?})"
        ))
    }
}

/// A `by`/`without` (`on`/`ignoring`) clause as written.
fn clause(modifier: &LabelModifier, include: &str, exclude: &str) -> String {
    let keyword = match modifier {
        LabelModifier::Include(_) => include,
        LabelModifier::Exclude(_) => exclude,
    };
    format!("{keyword} ({})", modifier.labels().labels.join(", "))
}

/// The labels a Go template of an alert's annotations reads: `{{ $labels.x }}`.
pub fn annotation_labels(template: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let mut rest = template;
    while let Some(start) = rest.find("$labels.") {
        rest = &rest[start + "$labels.".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        labels.insert(rest[..end].to_string());
    }
    labels
}

/// The labels a Grafana legend reads: `{{x}}` (or `{{ x }}`).
pub fn legend_labels(legend: &str) -> BTreeSet<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(label, _)| label.trim().to_string())
        .collect()
}

/// Checks each alert of a PrometheusRule (`yaml`) against `exported`: its expression
/// (as [`result_labels`]), and the `$labels.x` of its annotations against what its
/// result carries (with `alertname` and the rule's own labels). Returns the number of
/// alerts and what is wrong, one line each.
pub fn check_alerts(yaml: &str, exported: &Exported) -> anyhow::Result<(usize, Vec<String>)> {
    let rules: serde_yaml::Value = serde_yaml::from_str(yaml)?;
    let (mut alerts, mut problems) = (0, Vec::new());
    for rule in rules["spec"]["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_sequence().into_iter().flatten())
    {
        alerts += 1;
        let name = rule["alert"].as_str().unwrap_or("(a rule without a name)");
        let expr = rule["expr"].as_str().unwrap_or_default();
        let mut carried = match result_labels(expr, exported) {
            Ok(labels) => labels.unwrap_or_default(),
            Err(error) => {
                problems.push(format!("alert {name}: {error}"));
                continue;
            }
        };
        carried.insert("alertname".to_string());
        carried.extend(
            rule["labels"]
                .as_mapping()
                .into_iter()
                .flatten()
                .filter_map(|(key, _)| key.as_str().map(String::from)),
        );
        for (key, template) in rule["annotations"].as_mapping().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            for label in annotation_labels(template.as_str().unwrap_or_default()) {
                if !carried.contains(&label) {
                    problems.push(format!(
                        "alert {name}: its {key} reads $labels.{label}, which its series do not carry ({carried:?})"
                    ));
                }
            }
        }
    }
    Ok((alerts, problems))
}

/// Checks each query of a Grafana dashboard (`json`) against `exported`, with
/// Grafana's variables substituted as it does (`$__rate_interval`, `$__range`, `$job`
/// as all jobs), and the `{{x}}` of its legend against what its result carries.
/// Returns the number of queries and what is wrong, one line each.
pub fn check_dashboard(json: &str, exported: &Exported) -> anyhow::Result<(usize, Vec<String>)> {
    let dashboard: serde_json::Value = serde_json::from_str(json)?;
    let (mut queries, mut problems) = (0, Vec::new());
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"]
            .as_str()
            .unwrap_or("(a panel without a title)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries += 1;
            let expr = target["expr"]
                .as_str()
                .unwrap_or_default()
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1h")
                .replace("$job", ".*");
            let carried = match result_labels(&expr, exported) {
                Ok(labels) => labels.unwrap_or_default(),
                Err(error) => {
                    problems.push(format!("dashboard panel {title:?}: {error}"));
                    continue;
                }
            };
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            for label in legend_labels(legend) {
                if !carried.contains(&label) {
                    problems.push(format!(
                        "dashboard panel {title:?}: its legend reads {{{{{label}}}}}, which the query's series do not carry ({carried:?})"
                    ));
                }
            }
        }
    }
    Ok((queries, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = r#"# HELP wasm_provisioner_given_up_total Objects given up on.
# TYPE wasm_provisioner_given_up_total counter
wasm_provisioner_given_up_total{queue="claims"} 0
wasm_provisioner_guest_call_failures_total{module="hostpath",call="provision",outcome="timeout"} 1
wasm_provisioner_claim_to_volume_seconds_bucket{class="a, \"b\"}",le="0.5"} 3
wasm_provisioner_leader 1
controller_persistentvolumeclaim_provision_total{class="fast",source=""} 2
controller_persistentvolumeclaim_provision_failed_total{class="fast",source=""} 0
"#;

    fn labels(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn an_exposition_gives_each_sample_name_its_labels() {
        let exported = exported(EXPOSITION);
        assert_eq!(
            exported["wasm_provisioner_given_up_total"],
            labels(&["queue"]).unwrap()
        );
        assert_eq!(
            exported["wasm_provisioner_claim_to_volume_seconds_bucket"],
            labels(&["class", "le"]).unwrap(),
            "a value with a comma, an escaped quote and a brace"
        );
        assert!(exported["wasm_provisioner_leader"].is_empty());
        assert_eq!(exported.len(), 6);
    }

    #[test]
    fn the_result_carries_what_aggregation_and_functions_keep() {
        let exported = exported(EXPOSITION);
        let check = |expr: &str| result_labels(expr, &exported);
        assert_eq!(
            check(
                "sum by (module, call) (increase(wasm_provisioner_guest_call_failures_total{outcome=\"timeout\"}[10m])) > 0"
            ),
            Ok(labels(&["call", "module"]))
        );
        assert_eq!(
            check(
                "histogram_quantile(0.99, sum by (le, class) (rate(wasm_provisioner_claim_to_volume_seconds_bucket{job=~\".*\"}[5m])))"
            ),
            Ok(labels(&["class"]))
        );
        assert_eq!(
            check(
                "sum by (class) (rate(controller_persistentvolumeclaim_provision_failed_total[10m])) > 0 and sum by (class) (rate(controller_persistentvolumeclaim_provision_total[10m])) == 0"
            ),
            Ok(labels(&["class"]))
        );
        assert_eq!(
            check("sum without (source) (controller_persistentvolumeclaim_provision_total)"),
            Ok(labels(&[
                "class",
                "container",
                "endpoint",
                "instance",
                "job",
                "namespace",
                "pod",
                "service"
            ]))
        );
        assert_eq!(check("sum(wasm_provisioner_leader) + 1"), Ok(labels(&[])));
        assert_eq!(
            check("sum(wasm_provisioner_leader) < 1 or absent(wasm_provisioner_leader{job=\"x\"})"),
            Ok(labels(&["job"])),
            "`or` keeps both sides; `absent` carries its equality matchers"
        );
    }

    #[test]
    fn what_cannot_work_is_refused_with_the_reason() {
        let exported = exported(EXPOSITION);
        let refused = |expr: &str, why: &str| {
            let error = result_labels(expr, &exported).expect_err(expr);
            assert!(error.contains(why), "{expr}: {error}");
        };
        refused("sum by (module (x)", "does not parse");
        refused("rate(wasm_provisioner_given_up[5m])", "does not export");
        refused(
            "wasm_provisioner_given_up_total{queeu=\"claims\"}",
            "`queeu`",
        );
        refused(
            "sum by (modul) (wasm_provisioner_guest_call_failures_total)",
            "[\"modul\"]",
        );
        refused(
            "histogram_quantile(0.5, sum by (class) (wasm_provisioner_claim_to_volume_seconds_bucket))",
            "without `le`",
        );
        refused(
            "sum by (class) (controller_persistentvolumeclaim_provision_total) and sum by (class, source) (controller_persistentvolumeclaim_provision_failed_total)",
            "no series ever matches",
        );
        refused(
            "wasm_provisioner_leader and on (queue) wasm_provisioner_given_up_total",
            "[\"queue\"]",
        );
    }

    #[test]
    fn a_rule_file_and_a_dashboard_are_checked_alert_by_alert_and_query_by_query() {
        let exported = exported(EXPOSITION);
        let rules = r#"
spec:
  groups:
    - name: g
      rules:
        - alert: Good
          expr: increase(wasm_provisioner_given_up_total[15m]) > 0
          labels: { severity: warning }
          annotations:
            summary: "{{ $labels.queue }} ({{ $labels.severity }}, {{ $labels.alertname }})"
        - alert: ReadsALabelAggregatedAway
          expr: sum(wasm_provisioner_given_up_total) > 0
          annotations:
            summary: "{{ $labels.queue }}"
        - alert: Typo
          expr: wasm_provisioner_given_up > 0
"#;
        let (alerts, problems) = check_alerts(rules, &exported).unwrap();
        assert_eq!(alerts, 3);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0]
                .starts_with("alert ReadsALabelAggregatedAway: its summary reads $labels.queue"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("alert Typo: selects `wasm_provisioner_given_up`"),
            "{problems:?}"
        );

        let dashboard = r#"{"panels": [
            {"title": "ok", "targets": [{"expr": "sum by (queue) (rate(wasm_provisioner_given_up_total{job=~\"$job\"}[$__rate_interval]))", "legendFormat": "{{queue}}"}]},
            {"title": "bad legend", "targets": [{"expr": "sum(wasm_provisioner_leader)", "legendFormat": "{{pod}}"}]}
        ]}"#;
        let (queries, problems) = check_dashboard(dashboard, &exported).unwrap();
        assert_eq!(queries, 2);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("dashboard panel \"bad legend\": its legend reads {{pod}}"),
            "{problems:?}"
        );
    }

    #[test]
    fn templates_name_their_labels() {
        assert_eq!(
            annotation_labels(
                "{{ $labels.queue }} of module {{ $labels.module }}: {{ $value | humanize }}"
            ),
            labels(&["module", "queue"]).unwrap()
        );
        assert_eq!(
            legend_labels("{{module}} {{ call }}: {{outcome}}"),
            labels(&["call", "module", "outcome"]).unwrap()
        );
        assert!(legend_labels("cache hits").is_empty());
    }
}
