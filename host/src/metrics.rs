//! Prometheus metrics: the Go library's six provisioning metrics with their exact names and
//! labels, plus what their users asked for: an end-to-end claim-to-volume histogram,
//! in-flight operations, guest calls by module and outcome, module reloads and refusals,
//! queue depth and leader status.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use wasm_provisioner_rules::names;
use wasm_provisioner_runtime::Runtime;
use wasm_provisioner_runtime::engine::Allocator;

/// The plugin runtime's counters as Prometheus counters, copied at each scrape.
struct RuntimeCollector {
    runtime: Runtime,
    descs: Vec<prometheus::core::Desc>,
}

const RUNTIME_COUNTERS: [(&str, &str); 4] = [
    (
        "wasm_provisioner_module_reloads_total",
        "Module versions loaded and put in service (the first load counts), by module",
    ),
    (
        "wasm_provisioner_module_refusals_total",
        "Module versions refused (did not compile, wrong world, describe failed), by module",
    ),
    (
        "wasm_provisioner_module_removals_total",
        "Modules taken out of service because their file disappeared, by module",
    ),
    (
        "wasm_provisioner_guest_log_dropped_bytes_total",
        "Bytes of guest log dropped past the per-call bounds (--guest-log-bytes-per-call), by module",
    ),
];

impl RuntimeCollector {
    fn new(runtime: Runtime) -> Self {
        let descs = Self::families(&runtime)
            .iter()
            .flat_map(|family| {
                prometheus::core::Collector::desc(family)
                    .into_iter()
                    .cloned()
            })
            .chain(
                prometheus::core::Collector::desc(&grants_without_module(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(
                prometheus::core::Collector::desc(&calls_stuck(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(
                prometheus::core::Collector::desc(&modules_loading(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(
                prometheus::core::Collector::desc(&module_versions(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(
                prometheus::core::Collector::desc(&compile_limit_refusals(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(
                prometheus::core::Collector::desc(&module_pulls(&runtime))
                    .into_iter()
                    .cloned(),
            )
            .chain(compile_counters(&runtime).iter().flat_map(|counter| {
                prometheus::core::Collector::desc(counter)
                    .into_iter()
                    .cloned()
                    .collect::<Vec<_>>()
            }))
            .collect();
        Self { runtime, descs }
    }

    fn families(runtime: &Runtime) -> Vec<IntCounterVec> {
        let snapshot = runtime.metrics().snapshot();
        RUNTIME_COUNTERS
            .iter()
            .enumerate()
            .map(|(index, (name, help))| {
                let family = IntCounterVec::new(Opts::new(*name, *help), &["module"])
                    .expect("valid counter");
                for (module, counters) in &snapshot {
                    let value = match index {
                        0 => counters.reloads_total,
                        1 => counters.refusals_total,
                        2 => counters.removals_total,
                        _ => counters.guest_log_dropped_bytes_total,
                    };
                    family.with_label_values(&[module.as_str()]).inc_by(value);
                }
                family
            })
            .collect()
    }
}

impl prometheus::core::Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let grants = grants_without_module(&self.runtime);
        let stuck = calls_stuck(&self.runtime);
        Self::families(&self.runtime)
            .iter()
            .flat_map(prometheus::core::Collector::collect)
            .chain(prometheus::core::Collector::collect(&grants))
            .chain(prometheus::core::Collector::collect(&stuck))
            .chain(prometheus::core::Collector::collect(&modules_loading(
                &self.runtime,
            )))
            .chain(prometheus::core::Collector::collect(&module_versions(
                &self.runtime,
            )))
            .chain(prometheus::core::Collector::collect(
                &compile_limit_refusals(&self.runtime),
            ))
            .chain(prometheus::core::Collector::collect(&module_pulls(
                &self.runtime,
            )))
            .chain(
                compile_counters(&self.runtime)
                    .iter()
                    .flat_map(prometheus::core::Collector::collect),
            )
            .collect()
    }
}

/// The runtime's overall compile counters (no labels): compiles, and the precompiled
/// cache's hits and misses.
const COMPILE_COUNTERS: [(&str, &str); 3] = [
    (
        "wasm_provisioner_module_compiles_total",
        "Module versions compiled from wasm (at load or reload; cache misses included)",
    ),
    (
        "wasm_provisioner_compile_cache_hits_total",
        "Module versions loaded from the precompiled cache (--cache-dir) without compiling",
    ),
    (
        "wasm_provisioner_compile_cache_misses_total",
        "Module versions the precompiled cache had no usable entry for (missing or refused), so compiled",
    ),
];

fn compile_counters(runtime: &Runtime) -> Vec<prometheus::IntCounter> {
    let metrics = runtime.metrics();
    let values = [
        metrics.compiles_total(),
        metrics.cache_hits_total(),
        metrics.cache_misses_total(),
    ];
    COMPILE_COUNTERS
        .iter()
        .zip(values)
        .map(|((name, help), value)| {
            let counter = prometheus::IntCounter::new(*name, *help).expect("valid counter");
            counter.inc_by(value);
            counter
        })
        .collect()
}

/// Module versions refused because their compile hit a limit, by module and limit.
fn compile_limit_refusals(runtime: &Runtime) -> IntCounterVec {
    let family = IntCounterVec::new(
        Opts::new(
            "wasm_provisioner_module_compile_limit_refusals_total",
            "Module versions refused because their compile was stopped at a limit (limit: timeout for --compile-timeout, memory for --compile-memory-bytes), by module; each is also in wasm_provisioner_module_refusals_total",
        ),
        &["module", "limit"],
    )
    .expect("valid counter");
    for (module, counters) in runtime.metrics().snapshot() {
        for (limit, value) in counters.compile_limit_refusals_total {
            family
                .with_label_values(&[module.as_str(), limit])
                .inc_by(value);
        }
    }
    family
}

/// Pulls of the modules' OCI sources, by module and outcome.
fn module_pulls(runtime: &Runtime) -> IntCounterVec {
    let family = IntCounterVec::new(
        Opts::new(
            "wasm_provisioner_module_pulls_total",
            "Pulls of modules' OCI sources (docs/modules.md), by module and outcome: pulled (downloaded), store_hit (all from the module store), unchanged (a tag polled, same digest), and the refusals registry_error, digest_mismatch, too_large, not_a_module, unsigned, bad_signature (each also in wasm_provisioner_module_refusals_total)",
        ),
        &["module", "outcome"],
    )
    .expect("valid counter");
    for (module, counters) in runtime.metrics().snapshot() {
        for (outcome, value) in counters.pulls_total {
            family
                .with_label_values(&[module.as_str(), outcome])
                .inc_by(value);
        }
    }
    family
}

/// The calls of each module stuck in a system call past their timeout.
fn calls_stuck(runtime: &Runtime) -> IntGaugeVec {
    gauge_by_module(
        "wasm_provisioner_guest_calls_stuck",
        "Guest calls running past their timeout, stuck in a system call (a hung filesystem): each holds a thread, an instance and one of the module's maxConcurrentCalls until it returns, by module",
        runtime
            .metrics()
            .snapshot()
            .into_iter()
            .map(|(module, counters)| {
                (
                    module,
                    i64::try_from(counters.calls_stuck).unwrap_or(i64::MAX),
                )
            }),
    )
}

/// 1 for each module whose file is there but which is not in service yet because it is
/// still loading (compiling).
fn modules_loading(runtime: &Runtime) -> IntGaugeVec {
    gauge_by_module(
        "wasm_provisioner_module_loading",
        "1 for each module not in service yet because its first version is still loading (compiling, at most --compile-timeout); its claims wait without Events or failed attempts",
        runtime
            .modules_loading()
            .into_iter()
            .map(|module| (module, 1)),
    )
}

/// 1 for the version in service of each module: which bytes serve it (its full sha256, as
/// a class's `moduleSHA256` pins it) and the plugin's own name for its version.
fn module_versions(runtime: &Runtime) -> IntGaugeVec {
    let family = IntGaugeVec::new(
        Opts::new(
            "wasm_provisioner_module_version_info",
            "1 for the version in service of each module: sha256 is the full sha256 of its bytes (what a class's moduleSHA256 pins), plugin_version what the plugin reports",
        ),
        &["module", "sha256", "plugin_version"],
    )
    .expect("valid gauge");
    for module in runtime.modules() {
        family
            .with_label_values(&[module.name(), module.sha256(), &module.info().version])
            .set(1);
    }
    family
}

/// 1 for each module the grants file names that the modules directory lacks.
fn grants_without_module(runtime: &Runtime) -> IntGaugeVec {
    gauge_by_module(
        "wasm_provisioner_grants_without_module",
        "1 for each module the grants file names but the modules directory has no file for (a typo?)",
        runtime
            .metrics()
            .grants_without_module()
            .into_iter()
            .map(|module| (module, 1)),
    )
}

/// A gauge family labelled by module, with `values`.
fn gauge_by_module(
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (String, i64)>,
) -> IntGaugeVec {
    let family = IntGaugeVec::new(Opts::new(name, help), &["module"]).expect("valid gauge");
    for (module, value) in values {
        family.with_label_values(&[module.as_str()]).set(value);
    }
    family
}

/// Go client's DefBuckets, which the Go library's duration histograms use.
const DEFAULT_BUCKETS: &[f64] = &names::METRIC_DURATION_BUCKETS;

/// Buckets for a claim's whole wait, which includes retries and back-off.
const END_TO_END_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Every metric the host exports, registered on one registry.
pub struct Metrics {
    registry: Registry,
    pub provision_total: IntCounterVec,
    pub provision_failed_total: IntCounterVec,
    pub provision_duration: HistogramVec,
    pub delete_total: IntCounterVec,
    pub delete_failed_total: IntCounterVec,
    pub delete_duration: HistogramVec,
    /// From the claim's creation to the PV's creation, by class.
    pub claim_to_volume: HistogramVec,
    /// Operations running now, by operation (provision, delete, expand).
    pub in_flight: IntGaugeVec,
    /// Guest calls by module, call and outcome.
    pub guest_call_duration: HistogramVec,
    pub guest_call_failures: IntCounterVec,
    /// Node-local mode: guest calls the leader sent to another node's instance, by
    /// outcome ("ok" or "unreachable").
    pub node_call_duration: HistogramVec,
    /// Node-local mode: PV objects removed without deleting their backend volume, by
    /// reason ("node_gone").
    pub volumes_abandoned: IntCounterVec,
    /// Items waiting or retrying in each queue (claims, volumes).
    pub queue_depth: IntGaugeVec,
    /// Items waiting for a worker of their module's share, by module and queue.
    pub module_waiting: IntGaugeVec,
    /// 1 while this process holds the leader lease.
    pub leader: IntGauge,
    /// Volume expansions by class, module and outcome.
    pub expansions_total: IntCounterVec,
    /// One successful expansion, from the module's call to the claim's new capacity.
    pub expansion_duration: HistogramVec,
    /// Claims and volumes given up on past their failure threshold, by queue.
    pub given_up: IntCounterVec,
    /// Reconciles that did not finish, by controller and the error's metric label.
    pub reconcile_errors: IntCounterVec,
    /// 1 for a class its module accepts, 0 for one it rejects or could not validate,
    /// by class and module (only modules with `validate-class`).
    pub class_valid: IntGaugeVec,
    /// The backend's space as `get-capacity` answers it, by class, module and kind.
    pub backend_capacity: IntGaugeVec,
    /// Capacity polls that failed, by class and module.
    pub capacity_poll_failures: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique counter");
            metric
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let metric = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid histogram");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique histogram");
            metric
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique gauge");
            metric
        };
        let leader = IntGauge::new(
            "wasm_provisioner_leader",
            "1 while this process holds the leader lease",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(leader.clone()))
            .expect("unique gauge");
        // Which build this is: 1, labelled with the crate's version.
        gauge(
            "wasm_provisioner_build_info",
            "1, labelled with the version of the wasm-provisioner build",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        // process_start_time_seconds and the rest, read from /proc/self at each scrape.
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metrics registered once");
        // The client's request counter is process-wide (one client per process).
        registry
            .register(Box::new(crate::client::KUBE_API_REQUESTS.clone()))
            .expect("unique counter");

        Self {
            provision_total: counter(
                names::METRIC_PROVISION_TOTAL,
                "Total number of persistent volumes provisioned succesfully",
                &["class", "source"],
            ),
            provision_failed_total: counter(
                names::METRIC_PROVISION_FAILED_TOTAL,
                "Total number of persistent volume provision failed attempts",
                &["class", "source"],
            ),
            provision_duration: histogram(
                names::METRIC_PROVISION_DURATION_SECONDS,
                "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored",
                &["class", "source"],
                DEFAULT_BUCKETS,
            ),
            delete_total: counter(
                names::METRIC_DELETE_TOTAL,
                "Total number of persistent volumes deleted succesfully",
                &["class"],
            ),
            delete_failed_total: counter(
                names::METRIC_DELETE_FAILED_TOTAL,
                "Total number of persistent volume delete failed attempts",
                &["class"],
            ),
            delete_duration: histogram(
                names::METRIC_DELETE_DURATION_SECONDS,
                "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored",
                &["class"],
                DEFAULT_BUCKETS,
            ),
            claim_to_volume: histogram(
                "wasm_provisioner_claim_to_volume_seconds",
                "Seconds from a claim's creation to the creation of its PV, retries and back-off included",
                &["class"],
                END_TO_END_BUCKETS,
            ),
            in_flight: gauge(
                "wasm_provisioner_operations_in_flight",
                "Provision, delete and expand operations running now",
                &["operation"],
            ),
            guest_call_duration: histogram(
                "wasm_provisioner_guest_call_duration_seconds",
                "Seconds one guest call took (fresh instance, call, answer checks)",
                &["module", "call", "outcome"],
                DEFAULT_BUCKETS,
            ),
            volumes_abandoned: counter(
                "wasm_provisioner_volumes_abandoned_total",
                "PV objects removed without deleting their backend volume (node-local mode, --node-gone-policy=remove), by reason",
                &["reason"],
            ),
            node_call_duration: histogram(
                "wasm_provisioner_node_call_duration_seconds",
                "Seconds a guest call the leader sent to another node's instance took, the guest's own time included (node-local mode)",
                &["outcome"],
                DEFAULT_BUCKETS,
            ),
            guest_call_failures: counter(
                "wasm_provisioner_guest_call_failures_total",
                "Guest calls that did not succeed, by outcome (an error variant, trap, timeout, ...)",
                &["module", "call", "outcome"],
            ),
            queue_depth: gauge(
                "wasm_provisioner_queue_depth",
                "Items waiting for a worker or for their retry, by queue",
                &["queue"],
            ),
            module_waiting: gauge(
                "wasm_provisioner_module_waiting",
                "Items waiting because their module holds its whole share of the workers, by module and queue",
                &["module", "queue"],
            ),
            expansions_total: counter(
                "wasm_provisioner_volume_expansions_total",
                "Volume expansions of bound claims, by class, module and outcome (ok, the module's answer: failed, infeasible, in_background; too_small; the guest call's failure; unsupported: the module cannot expand; shrink; not_allowed; no_module; no_class)",
                &["class", "module", "outcome"],
            ),
            expansion_duration: histogram(
                "wasm_provisioner_volume_expansion_duration_seconds",
                "Seconds one successful expansion took, from the module's expand call to the claim's new status capacity",
                &["class", "module"],
                DEFAULT_BUCKETS,
            ),
            leader,
            given_up: {
                let given_up = counter(
                    "wasm_provisioner_given_up_total",
                    "Claims (volumes, expansions) given up on after --failed-provision-threshold (--failed-delete-threshold, --failed-provision-threshold) failed attempts, by queue",
                    &["queue"],
                );
                // Both series exist from the start, so alerts see them go from 0.
                for queue in ["claims", "volumes", "expansions"] {
                    given_up.with_label_values(&[queue]);
                }
                given_up
            },
            reconcile_errors: counter(
                "wasm_provisioner_reconcile_errors_total",
                "Reconciles of claims (volumes) that did not finish and will be retried, by controller and error kind",
                &["controller", "error"],
            ),
            class_valid: gauge(
                "wasm_provisioner_class_valid",
                "1 for a StorageClass its module's validate-class accepts, 0 for one it rejects or could not validate (its claims fail at once), by class and module",
                &["class", "module"],
            ),
            backend_capacity: gauge(
                "wasm_provisioner_backend_capacity_bytes",
                "The backend's space for a StorageClass as its module's get-capacity answers it (polled every --capacity-poll-interval by the leader), by class, module and kind (total, available, maximum_volume)",
                &["class", "module", "kind"],
            ),
            capacity_poll_failures: counter(
                "wasm_provisioner_capacity_poll_failures_total",
                "Capacity polls (get-capacity) that failed, by class and module; the class's capacity gauges are removed until a poll succeeds",
                &["class", "module"],
            ),
            registry,
        }
    }

    /// Exports the plugin runtime's module counters (reloads, refusals, removals) and its
    /// compile counters, read at scrape time.
    pub fn register_runtime(&self, runtime: Runtime) {
        let pool = IntGauge::new(
            "wasm_provisioner_instance_pool_slots",
            "Guest instances the pooling allocator reserved at start (--max-guest-instances); 0: the on-demand allocator, asked for with --max-guest-instances 0 or used because the pool's address space could not be reserved (the log says which)",
        )
        .expect("valid gauge");
        let unavailable = IntGauge::new(
            "wasm_provisioner_instance_pool_unavailable",
            "1 when the instance pool (--max-guest-instances) could not be reserved at start and calls use the on-demand allocator instead (about twice the CPU per call; the log says why); 0 otherwise",
        )
        .expect("valid gauge");
        match runtime.allocator() {
            Allocator::Pooling { instances } => pool.set(i64::from(instances)),
            Allocator::OnDemand { pool_unavailable } => {
                pool.set(0);
                unavailable.set(i64::from(pool_unavailable));
            }
        }
        for gauge in [pool, unavailable] {
            self.registry
                .register(Box::new(gauge))
                .expect("pool metrics registered once");
        }
        self.registry
            .register(Box::new(RuntimeCollector::new(runtime)))
            .expect("runtime metrics registered once");
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding cannot fail");
        String::from_utf8(buffer).expect("text exposition is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_metric_names_and_labels_are_exact() {
        let metrics = Metrics::new();
        metrics
            .provision_total
            .with_label_values(&["fast", ""])
            .inc();
        metrics
            .provision_failed_total
            .with_label_values(&["fast", "VolumeSnapshot"])
            .inc();
        metrics
            .provision_duration
            .with_label_values(&["fast", ""])
            .observe(0.2);
        metrics.delete_total.with_label_values(&["fast"]).inc();
        metrics
            .delete_failed_total
            .with_label_values(&["fast"])
            .inc();
        metrics
            .delete_duration
            .with_label_values(&["fast"])
            .observe(0.1);
        let text = metrics.render();
        for line in [
            "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\",source=\"VolumeSnapshot\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_bucket{class=\"fast\",source=\"\",le=\"0.25\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"fast\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn expansion_metric_names_and_labels_are_as_documented() {
        let metrics = Metrics::new();
        metrics
            .expansions_total
            .with_label_values(&["fast", "hostpath", "ok"])
            .inc();
        metrics
            .expansion_duration
            .with_label_values(&["fast", "hostpath"])
            .observe(0.2);
        let text = metrics.render();
        for line in [
            "wasm_provisioner_volume_expansions_total{class=\"fast\",module=\"hostpath\",outcome=\"ok\"} 1",
            "wasm_provisioner_volume_expansion_duration_seconds_count{class=\"fast\",module=\"hostpath\"} 1",
            "wasm_provisioner_given_up_total{queue=\"expansions\"} 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[tokio::test]
    async fn compile_counters_are_exported_even_before_any_load() {
        let metrics = Metrics::new();
        let runtime = wasm_provisioner_runtime::Runtime::new(
            wasm_provisioner_runtime::RuntimeConfig::default(),
        )
        .expect("runtime");
        metrics.register_runtime(runtime);
        let text = metrics.render();
        for line in [
            "wasm_provisioner_module_compiles_total 0",
            "wasm_provisioner_compile_cache_hits_total 0",
            "wasm_provisioner_compile_cache_misses_total 0",
            "wasm_provisioner_instance_pool_slots 128",
            "wasm_provisioner_instance_pool_unavailable 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
