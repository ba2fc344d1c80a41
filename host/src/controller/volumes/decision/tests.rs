//! The volume decision table, one row per case: a snapshot (a released PV of ours with
//! policy Delete and our finalizer, changed by the row) and the step the decision must
//! name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

const US: &str = "p.example.com";

struct Case {
    pv: PersistentVolume,
    protection_finalizer: bool,
    stage: Option<Stage>,
    module: Lookup<Module>,
    share: Share,
    should_delete: Option<Result<bool, CallFailure>>,
    deleted: Option<Deleted>,
    told_in_background: bool,
    finalizer_removed: bool,
    pv_deleted: bool,
}

impl Case {
    fn new() -> Self {
        let pv = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pvc-1", "uid": "u-1",
                "annotations": { names::ANN_PROVISIONED_BY: US, names::ANN_MODULE: "echo" },
                "finalizers": [names::FINALIZER_PV_PROTECTION],
            },
            "spec": {
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "capacity": { "storage": "1Gi" },
            },
            "status": { "phase": "Released" },
        }))
        .expect("a PV");
        Case {
            pv,
            protection_finalizer: true,
            stage: None,
            module: Lookup::NotLooked,
            share: Share::NotTried,
            should_delete: None,
            deleted: None,
            told_in_background: false,
            finalizer_removed: false,
            pv_deleted: false,
        }
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            pv: &self.pv,
            rules: Rules {
                provisioner_name: US,
                protection_finalizer: self.protection_finalizer,
            },
            stage: self.stage,
            module: self.module,
            share: self.share,
            should_delete: self.should_delete,
            deleted: self.deleted,
            told_in_background: self.told_in_background,
            finalizer_removed: self.finalizer_removed,
            pv_deleted: self.pv_deleted,
        }
    }

    fn phase(&mut self, phase: &str) {
        self.pv.status.as_mut().unwrap().phase = Some(phase.into());
    }

    fn policy(&mut self, policy: &str) {
        self.pv
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some(policy.into());
    }

    fn without_finalizer(&mut self) {
        self.pv.metadata.finalizers = None;
    }

    fn deleting(&mut self) {
        self.pv.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    }

    /// The module resolved, a worker held, `should-delete` said yes.
    fn agreed(&mut self) {
        self.module = Lookup::Found(Module::Loaded);
        self.share = Share::Entered;
        self.should_delete = Some(Ok(true));
    }
}

type Row = (&'static str, fn(&mut Case), Step);

fn keep(reason: SkipDelete, forget: bool) -> Step {
    Step::Keep { reason, forget }
}

fn rows() -> Vec<Row> {
    vec![
        (
            "another provisioner's PV is left alone",
            |c| {
                c.pv.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(names::ANN_PROVISIONED_BY.into(), "other".into());
            },
            Step::NotOurs,
        ),
        (
            "a Bound PV of ours without the finalizer gets it",
            |c| {
                c.phase("Bound");
                c.without_finalizer();
            },
            Step::AddFinalizer,
        ),
        (
            "a PV whose policy became Retain loses it",
            |c| {
                c.phase("Bound");
                c.policy("Retain");
            },
            Step::RemoveFinalizer,
        ),
        (
            "with the finalizer turned off, a PV carrying it loses it",
            |c| c.protection_finalizer = false,
            Step::RemoveFinalizer,
        ),
        (
            "a Bound PV is kept, its failures forgotten",
            |c| c.phase("Bound"),
            keep(
                SkipDelete::NotReleased {
                    phase: Some("Bound".into()),
                },
                true,
            ),
        ),
        (
            "a Released PV with policy Retain and no finalizer is kept",
            |c| {
                c.policy("Retain");
                c.without_finalizer();
            },
            keep(
                SkipDelete::NotDeletePolicy {
                    policy: Some("Retain".into()),
                },
                true,
            ),
        ),
        (
            "a PV being deleted without our finalizer waits to go, failures kept",
            |c| {
                c.without_finalizer();
                c.deleting();
            },
            keep(SkipDelete::BeingDeletedWithoutFinalizer, false),
        ),
        (
            "this process finished its cleanup already",
            |c| c.stage = Some(Stage::Finished),
            Step::AlreadyDone,
        ),
        (
            "a Released PV with policy Delete: its module is resolved",
            |_| {},
            Step::ResolveModule,
        ),
        (
            "the module is still loading",
            |c| c.module = Lookup::Found(Module::Loading),
            Step::ModuleLoading,
        ),
        (
            "the module is missing: VolumeFailedDelete, the PV stays",
            |c| c.module = Lookup::Found(Module::Missing),
            Step::ModuleMissing,
        ),
        (
            "a worker of the module's share is taken",
            |c| c.module = Lookup::Found(Module::Loaded),
            Step::EnterShare,
        ),
        (
            "the module holds its whole share",
            |c| {
                c.module = Lookup::Found(Module::Loaded);
                c.share = Share::Full;
            },
            Step::WaitForShare,
        ),
        (
            "should-delete is asked",
            |c| {
                c.module = Lookup::Found(Module::Loaded);
                c.share = Share::Entered;
            },
            Step::AskShouldDelete,
        ),
        (
            "should-delete says no",
            |c| {
                c.agreed();
                c.should_delete = Some(Ok(false));
            },
            Step::Declined,
        ),
        (
            "should-delete finds the module busy",
            |c| {
                c.agreed();
                c.should_delete = Some(Err(CallFailure::Busy));
            },
            Step::Busy,
        ),
        (
            "should-delete finds the pool full",
            |c| {
                c.agreed();
                c.should_delete = Some(Err(CallFailure::PoolFull));
            },
            Step::PoolFull,
        ),
        (
            "should-delete fails",
            |c| {
                c.agreed();
                c.should_delete = Some(Err(CallFailure::Failed));
            },
            Step::DeleteFailed,
        ),
        (
            "should-delete says yes: delete",
            |c| c.agreed(),
            Step::Delete,
        ),
        (
            "deleted",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::Yes);
            },
            Step::BackendDeleted,
        ),
        (
            "the module ignores the delete",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::Ignored);
            },
            Step::Ignored,
        ),
        (
            "the module fails to delete",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::Failed);
            },
            Step::DeleteFailed,
        ),
        (
            "the delete call fails",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::CallFailed(CallFailure::Failed));
            },
            Step::DeleteFailed,
        ),
        (
            "the delete finds the module busy",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::CallFailed(CallFailure::Busy));
            },
            Step::Busy,
        ),
        (
            "the delete finds the pool full",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::CallFailed(CallFailure::PoolFull));
            },
            Step::PoolFull,
        ),
        (
            "in background, the first time: told",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::InBackground);
            },
            Step::InBackground { tell: true },
        ),
        (
            "in background again: not told again",
            |c| {
                c.agreed();
                c.deleted = Some(Deleted::InBackground);
                c.told_in_background = true;
            },
            Step::InBackground { tell: false },
        ),
        (
            "the backend is gone: our finalizer comes off first",
            |c| c.stage = Some(Stage::BackendDeleted),
            Step::LetGo,
        ),
        (
            "then the PV is deleted",
            |c| {
                c.stage = Some(Stage::BackendDeleted);
                c.finalizer_removed = true;
            },
            Step::DeletePv,
        ),
        (
            "then it is finished",
            |c| {
                c.stage = Some(Stage::BackendDeleted);
                c.finalizer_removed = true;
                c.pv_deleted = true;
            },
            Step::Finished,
        ),
        (
            "a PV being deleted already is not deleted again",
            |c| {
                c.stage = Some(Stage::BackendDeleted);
                c.deleting();
                c.finalizer_removed = true;
            },
            Step::Finished,
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
