//! The expansion decision table, one row per case: a snapshot (a Bound claim of ours
//! asking for 2Gi, its status capacity and its PV 1Gi, a class that allows expansion,
//! changed by the row) and the step the decision must name.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;

const US: &str = "p.example.com";
const GI: u64 = 1 << 30;

struct Case {
    claim: PersistentVolumeClaim,
    volume: Option<PersistentVolume>,
    class: Option<StorageClass>,
    now: Instant,
    retry: RetryRecord,
    told: bool,
    finished: bool,
    module: Lookup<Module>,
    marked: bool,
    answer: Option<Answer>,
    volume_saved: bool,
}

impl Case {
    fn new() -> Self {
        let claim = serde_json::from_value(json!({
            "metadata": { "name": "data", "namespace": "ns", "uid": "u-1" },
            "spec": {
                "storageClassName": "fast",
                "volumeName": "pvc-u-1",
                "resources": { "requests": { "storage": "2Gi" } },
            },
            "status": { "phase": "Bound", "capacity": { "storage": "1Gi" } },
        }))
        .expect("a claim");
        let volume = serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-u-1",
                "annotations": { names::ANN_PROVISIONED_BY: US, names::ANN_MODULE: "hostpath" },
            },
            "spec": {
                "storageClassName": "fast",
                "capacity": { "storage": "1Gi" },
                "claimRef": { "namespace": "ns", "name": "data", "uid": "u-1" },
                "hostPath": { "path": "/srv/volumes/pvc-u-1" },
            },
            "status": { "phase": "Bound" },
        }))
        .expect("a PV");
        let class = serde_json::from_value(json!({
            "metadata": { "name": "fast" },
            "provisioner": US,
            "allowVolumeExpansion": true,
            "parameters": { "module": "hostpath" },
        }))
        .expect("a class");
        Case {
            claim,
            volume: Some(volume),
            class: Some(class),
            now: Instant::now(),
            retry: RetryRecord::default(),
            told: false,
            finished: false,
            module: Lookup::NotLooked,
            marked: false,
            answer: None,
            volume_saved: false,
        }
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            claim: &self.claim,
            volume: self.volume.as_ref(),
            class: self.class.as_ref(),
            rules: Rules {
                provisioner_name: US,
            },
            now: self.now,
            retry: self.retry.clone(),
            told: self.told,
            finished: self.finished,
            module: self.module,
            marked: self.marked,
            answer: self.answer,
            volume_saved: self.volume_saved,
        }
    }

    fn request(&mut self, size: &str) {
        let spec = self.claim.spec.as_mut().unwrap();
        let requests = spec.resources.as_mut().unwrap().requests.as_mut().unwrap();
        requests.insert("storage".into(), Quantity(size.into()));
    }

    fn volume_size(&mut self, size: &str) {
        let spec = self.volume.as_mut().unwrap().spec.as_mut().unwrap();
        spec.capacity
            .as_mut()
            .unwrap()
            .insert("storage".into(), Quantity(size.into()));
    }

    fn status(&mut self, status: serde_json::Value) {
        let mut current = serde_json::to_value(self.claim.status.take()).unwrap();
        merge(&mut current, status);
        self.claim.status = serde_json::from_value(current).unwrap();
    }

    /// The module resolved, able to expand, the claim marked in progress.
    fn asking(&mut self) {
        self.module = Lookup::Found(Module::Expands);
        self.marked = true;
    }
}

/// Deep-merges `extra` into `target` (objects merge, anything else replaces).
fn merge(target: &mut serde_json::Value, extra: serde_json::Value) {
    match (target, extra) {
        (serde_json::Value::Object(target), serde_json::Value::Object(extra)) => {
            for (key, value) in extra {
                merge(target.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (target, extra) => *target = extra,
    }
}

type Row = (&'static str, fn(&mut Case), Step);

fn in_progress_for_2gi() -> serde_json::Value {
    json!({
        "conditions": [{ "type": "Resizing", "status": "True" }],
        "allocatedResources": { "storage": "2Gi" },
        "allocatedResourceStatuses": { "storage": "ControllerResizeInProgress" },
    })
}

fn rows() -> Vec<Row> {
    vec![
        (
            "a claim not Bound is left alone",
            |c| c.status(json!({ "phase": "Pending" })),
            Step::LeaveAlone,
        ),
        (
            "a claim being deleted is left alone",
            |c| {
                c.claim.metadata.deletion_timestamp =
                    Some(Time(k8s_openapi::jiff::Timestamp::now()))
            },
            Step::LeaveAlone,
        ),
        (
            "a claim whose PV is not in the cache is left alone",
            |c| c.volume = None,
            Step::LeaveAlone,
        ),
        (
            "another provisioner's PV is left alone",
            |c| {
                c.volume
                    .as_mut()
                    .unwrap()
                    .metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(names::ANN_PROVISIONED_BY.into(), "other".into());
            },
            Step::LeaveAlone,
        ),
        (
            "a PV bound to another claim (by UID) is left alone",
            |c| {
                let spec = c.volume.as_mut().unwrap().spec.as_mut().unwrap();
                spec.claim_ref.as_mut().unwrap().uid = Some("u-2".into());
            },
            Step::LeaveAlone,
        ),
        (
            "a claim without a status capacity yet is left alone",
            |c| c.claim.status.as_mut().unwrap().capacity = None,
            Step::LeaveAlone,
        ),
        (
            "a size that is not a quantity",
            |c| c.volume_size("lots"),
            Step::Unreadable,
        ),
        (
            "a claim asking for its capacity is settled",
            |c| c.request("1Gi"),
            Step::Settled,
        ),
        (
            "a claim asking for less than its capacity is settled (the PV is larger)",
            |c| {
                c.status(json!({ "capacity": { "storage": "4Gi" } }));
                c.volume_size("4Gi");
            },
            Step::Settled,
        ),
        (
            "a request back at the capacity after an infeasible expansion: the marks go",
            |c| {
                c.request("1Gi");
                c.status(json!({
                    "conditions": [{ "type": "ControllerResizeError", "status": "True" }],
                    "allocatedResources": { "storage": "8Gi" },
                    "allocatedResourceStatuses": { "storage": "ControllerResizeInfeasible" },
                }));
            },
            Step::ClearMarks,
        ),
        (
            "finished by this process, the cache still showing it in progress: not again",
            |c| {
                c.status(in_progress_for_2gi());
                c.volume_size("2Gi");
                c.finished = true;
            },
            Step::AlreadyDone,
        ),
        (
            "finished by this process, and the cache shows it: settled",
            |c| {
                c.status(json!({ "capacity": { "storage": "2Gi" } }));
                c.finished = true;
            },
            Step::Settled,
        ),
        (
            "held for a back-off while the request is unchanged",
            |c| {
                c.retry.held = Some((fingerprint(2 * GI), c.now + Duration::from_secs(30)));
            },
            Step::WaitHeld(Duration::from_secs(30)),
        ),
        (
            "a hold that expired goes",
            |c| c.retry.held = Some((fingerprint(2 * GI), c.now)),
            Step::DropHold,
        ),
        (
            "a hold of another request goes",
            |c| {
                c.retry.held = Some((fingerprint(3 * GI), c.now + Duration::from_secs(30)));
            },
            Step::DropHold,
        ),
        (
            "given up on, and the request changed since: forgiven",
            |c| c.retry.given_up = Some(fingerprint(3 * GI)),
            Step::Forgive,
        ),
        (
            "infeasible for another request: forgiven at once",
            |c| c.retry.infeasible_under = Some(fingerprint(3 * GI).to_string()),
            Step::Forgive,
        ),
        (
            "infeasible for this request and held: waits the slow interval",
            |c| {
                c.retry.infeasible_under = Some(fingerprint(2 * GI).to_string());
                c.retry.held = Some((fingerprint(2 * GI), c.now + Duration::from_secs(1000)));
            },
            Step::WaitHeld(Duration::from_secs(1000)),
        ),
        (
            "the PV is already as large as asked (a crash before the claim's status): finish",
            |c| c.volume_size("2Gi"),
            Step::Finish,
        ),
        (
            "the claim asks for less than the PV is: a shrink, told",
            |c| c.volume_size("4Gi"),
            Step::Shrink { tell: true },
        ),
        (
            "a PV larger than asked while this request is in progress (the module gave more, then a crash): finish",
            |c| {
                c.volume_size("4Gi");
                c.status(in_progress_for_2gi());
            },
            Step::Finish,
        ),
        (
            "a shrink told already is not told again",
            |c| {
                c.volume_size("4Gi");
                c.told = true;
            },
            Step::Shrink { tell: false },
        ),
        ("the class is gone", |c| c.class = None, Step::ClassMissing),
        (
            "the class does not allow expansion",
            |c| c.class.as_mut().unwrap().allow_volume_expansion = None,
            Step::NotAllowed { tell: true },
        ),
        (
            "the class does not allow expansion, told already",
            |c| {
                c.class.as_mut().unwrap().allow_volume_expansion = Some(false);
                c.told = true;
            },
            Step::NotAllowed { tell: false },
        ),
        ("the module is resolved", |_| {}, Step::ResolveModule),
        (
            "the module is still loading",
            |c| c.module = Lookup::Found(Module::Loading),
            Step::ModuleLoading,
        ),
        (
            "the module is missing",
            |c| c.module = Lookup::Found(Module::Missing),
            Step::ModuleMissing,
        ),
        (
            "the module cannot expand: told once",
            |c| c.module = Lookup::Found(Module::CannotExpand),
            Step::CannotExpand { tell: true },
        ),
        (
            "the module cannot expand, told already: quiet",
            |c| {
                c.module = Lookup::Found(Module::CannotExpand);
                c.told = true;
            },
            Step::CannotExpand { tell: false },
        ),
        (
            "the claim is marked in progress first",
            |c| c.module = Lookup::Found(Module::Expands),
            Step::MarkInProgress,
        ),
        (
            "marked in progress for another size: marked again",
            |c| {
                c.module = Lookup::Found(Module::Expands);
                c.status(in_progress_for_2gi());
                c.request("3Gi");
            },
            Step::MarkInProgress,
        ),
        (
            "already in progress for this size (an in-background retry): asked at once",
            |c| {
                c.module = Lookup::Found(Module::Expands);
                c.status(in_progress_for_2gi());
            },
            Step::Expand,
        ),
        ("marked: the module is asked", |c| c.asking(), Step::Expand),
        (
            "expanded: the PV's capacity is saved",
            |c| {
                c.asking();
                c.answer = Some(Answer::Expanded(2 * GI));
            },
            Step::SaveCapacity,
        ),
        (
            "expanded to more than asked: saved too",
            |c| {
                c.asking();
                c.answer = Some(Answer::Expanded(3 * GI));
            },
            Step::SaveCapacity,
        ),
        (
            "saved: the claim's status is finished",
            |c| {
                c.asking();
                c.answer = Some(Answer::Expanded(3 * GI));
                c.volume_saved = true;
            },
            Step::Finish,
        ),
        (
            "answered less than asked: a failure",
            |c| {
                c.asking();
                c.answer = Some(Answer::Expanded(GI));
            },
            Step::Failed { mark: true },
        ),
        (
            "the module fails",
            |c| {
                c.asking();
                c.answer = Some(Answer::Failed);
            },
            Step::Failed { mark: true },
        ),
        (
            "the call fails (trap, timeout): retried, the claim not marked",
            |c| {
                c.asking();
                c.answer = Some(Answer::CallFailed(CallFailure::Failed));
            },
            Step::Failed { mark: false },
        ),
        (
            "the module is busy",
            |c| {
                c.asking();
                c.answer = Some(Answer::CallFailed(CallFailure::Busy));
            },
            Step::Busy,
        ),
        (
            "the pool is full",
            |c| {
                c.asking();
                c.answer = Some(Answer::CallFailed(CallFailure::PoolFull));
            },
            Step::PoolFull,
        ),
        (
            "infeasible",
            |c| {
                c.asking();
                c.answer = Some(Answer::Infeasible);
            },
            Step::Infeasible,
        ),
        (
            "in the background",
            |c| {
                c.asking();
                c.answer = Some(Answer::InBackground);
            },
            Step::InBackground,
        ),
    ]
}

#[test]
fn the_decision_table() {
    let mut failures = Vec::new();
    for (case, change, expected) in rows() {
        let mut c = Case::new();
        change(&mut c);
        let step = decide(&c.snapshot());
        if step != expected {
            failures.push(format!("{case}: decided {step:?}, expected {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn steps_that_learn_are_followed_by_another_decision() {
    for step in [
        Step::Forgive,
        Step::DropHold,
        Step::ResolveModule,
        Step::MarkInProgress,
        Step::Expand,
        Step::SaveCapacity,
    ] {
        assert!(step.learns(), "{step:?}");
    }
    for step in [Step::Finish, Step::Infeasible, Step::Shrink { tell: true }] {
        assert!(!step.learns(), "{step:?}");
    }
}
