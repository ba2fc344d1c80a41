//! The decision table, one row per case: a snapshot (a claim ready to be provisioned,
//! changed by the row) and the step the decision must name.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

const US: &str = "p.example.com";
const UID: &str = "0b6e3d4e-1111-4c3a-9d7e-000000000001";
/// The sha256 of the module version in service.
const SHA: &str = "5e5e";

/// A snapshot's owned parts, and its facts.
struct Case {
    claim: PersistentVolumeClaim,
    cached_class: Option<StorageClass>,
    live_class: Lookup<StorageClass>,
    info: PluginInfo,
    module: Lookup<ModuleKind>,
    module_sha256: Option<String>,
    verdict: Lookup<ClassVerdict>,
    gone: bool,
    provision_before_binder: bool,
    now: Instant,
    journaled: bool,
    static_volume_may_bind: bool,
    retry: RetryRecord,
    published: bool,
    share: Share,
    node: Lookup<()>,
    should_provision: Option<Result<bool, CallFailure>>,
    journal: JournalHold,
    recorded: Recorded,
    answer: Option<Answer>,
    publishing: Publishing,
    deleted: Option<bool>,
    live_volume_is_the_claims: Lookup<bool>,
}

#[derive(Clone, Copy)]
enum ModuleKind {
    Loaded,
    Loading,
    Unavailable,
}

fn claim() -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "data", "namespace": "ns", "uid": UID,
            "annotations": { names::ANN_STORAGE_PROVISIONER: US },
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "fast",
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .expect("a claim")
}

fn class(provisioner: &str) -> StorageClass {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "fast", "resourceVersion": "7" },
        "provisioner": provisioner,
        "parameters": { "module": "echo" },
    }))
    .expect("a class")
}

impl Case {
    /// A claim announced to us, of an existing class of ours whose module is loaded, at
    /// the start of a reconcile.
    fn new() -> Self {
        Case {
            claim: claim(),
            cached_class: Some(class(US)),
            live_class: Lookup::NotLooked,
            info: PluginInfo {
                name: "echo".into(),
                version: "1".into(),
                supports_block: false,
                data_source_kinds: Vec::new(),
                capabilities: vec![],
            },
            module: Lookup::NotLooked,
            module_sha256: Some(SHA.into()),
            verdict: Lookup::NotLooked,
            gone: false,
            provision_before_binder: true,
            now: Instant::now(),
            journaled: false,
            static_volume_may_bind: false,
            retry: RetryRecord::default(),
            published: false,
            share: Share::NotTried,
            node: Lookup::NotLooked,
            should_provision: None,
            journal: JournalHold::NotTaken,
            recorded: Recorded::Nowhere,
            answer: None,
            publishing: Publishing::Unchecked,
            deleted: None,
            live_volume_is_the_claims: Lookup::NotLooked,
        }
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            claim: &self.claim,
            gone: self.gone,
            rules: Rules {
                provisioner_name: US,
                provision_before_binder: self.provision_before_binder,
            },
            now: self.now,
            journaled: self.journaled,
            static_volume_may_bind: self.static_volume_may_bind,
            retry: self.retry.clone(),
            cached_class: self.cached_class.as_ref(),
            live_class: self.live_class.as_ref(),
            published: self.published,
            module: self.module.map(|kind| match kind {
                ModuleKind::Loaded => Module::Loaded(&self.info),
                ModuleKind::Loading => Module::Loading,
                ModuleKind::Unavailable => Module::Unavailable,
            }),
            module_sha256: self.module_sha256.as_deref(),
            verdict: self.verdict,
            share: self.share,
            node: self.node,
            should_provision: self.should_provision,
            journal: self.journal,
            recorded: self.recorded,
            answer: self.answer,
            publishing: self.publishing,
            deleted: self.deleted,
            live_volume_is_the_claims: self.live_volume_is_the_claims,
        }
    }

    fn annotate(&mut self, key: &str, value: &str) {
        self.claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
    }

    fn unannounce(&mut self) {
        if let Some(annotations) = self.claim.metadata.annotations.as_mut() {
            annotations.remove(names::ANN_STORAGE_PROVISIONER);
        }
    }

    fn finalize(&mut self) {
        self.claim
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(names::FINALIZER_CLAIM_PROVISIONING.into());
    }

    fn delete(&mut self) {
        self.claim.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    }

    fn bind(&mut self, volume: &str, phase: &str) {
        if let Some(spec) = self.claim.spec.as_mut() {
            spec.volume_name = Some(volume.into());
        }
        self.claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
    }

    /// Held for a minute from now, as the claim is.
    fn hold(&mut self) {
        self.retry.held = Some((fingerprint(&self.claim), self.now + Duration::from_secs(60)));
    }

    fn wait_for_first_consumer(&mut self) {
        if let Some(class) = self.cached_class.as_mut() {
            class.volume_binding_mode = Some(names::BINDING_WAIT_FOR_FIRST_CONSUMER.into());
        }
    }

    /// Through the rules: the module loaded, a worker of its share held.
    fn admitted(&mut self) {
        self.module = Lookup::Found(ModuleKind::Loaded);
        self.share = Share::Entered;
    }

    /// A module that validates classes (contract 0.2's `validate-class`), admitted.
    fn validating(&mut self) {
        self.info.capabilities = vec![Capability::ValidateClass];
        self.admitted();
    }

    /// Rejected under class version 7 and module version [`SHA`], held the slow
    /// interval.
    fn held_rejected(&mut self) {
        self.retry.rejected_under = Some(("7".into(), SHA.into()));
        self.hold();
    }

    /// Asked `should-provision`: yes.
    fn agreed(&mut self) {
        self.admitted();
        self.should_provision = Some(Ok(true));
    }

    /// The intent in the journal: the module may be asked.
    fn recorded(&mut self) {
        self.agreed();
        self.journal = JournalHold::Taken;
        self.recorded = Recorded::InJournal;
    }

    /// The module answered a volume.
    fn answered_volume(&mut self) {
        self.recorded();
        self.answer = Some(Answer::Volume);
    }

    /// Being deleted with its intent in the journal: a cleanup, its entry held.
    fn cleaning_up(&mut self) {
        self.delete();
        self.journaled = true;
        self.journal = JournalHold::Taken;
    }

    /// A cleanup that found no PV of the claim's and resolved the module.
    fn cleanup_asking(&mut self) {
        self.cleaning_up();
        self.live_volume_is_the_claims = Lookup::Missing;
        self.module = Lookup::Found(ModuleKind::Loaded);
    }
}

type Row = (&'static str, fn(&mut Case), Step);

fn skip(reason: SkipProvision, warn: bool, retry: bool) -> Step {
    Step::Skip {
        reason,
        warn,
        retry,
    }
}

fn rows() -> Vec<Row> {
    vec![
        // Whose claim.
        (
            "another provisioner's claim is left alone",
            |c| c.annotate(names::ANN_STORAGE_PROVISIONER, "other.example.com"),
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim waits for the binder when --provision-before-binder is off",
            |c| {
                c.unannounce();
                c.provision_before_binder = false;
            },
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim of an uncached class waits for the binder",
            |c| {
                c.unannounce();
                c.cached_class = None;
            },
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim of another provisioner's class is left alone",
            |c| {
                c.unannounce();
                c.cached_class = Some(class("other.example.com"));
            },
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim an existing PV may be bound to waits for the binder",
            |c| {
                c.unannounce();
                c.static_volume_may_bind = true;
            },
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim with a selector waits for the binder",
            |c| {
                c.unannounce();
                c.claim.spec.as_mut().unwrap().selector = Some(Default::default());
            },
            Step::LeaveAlone,
        ),
        (
            "an unannounced claim of our class is taken before the binder",
            |c| c.unannounce(),
            Step::ResolveModule,
        ),
        (
            "an unannounced claim whose provisioning started (journaled) is ours",
            |c| {
                c.unannounce();
                c.provision_before_binder = false;
                c.journaled = true;
            },
            Step::ResolveModule,
        ),
        (
            "the beta announcement counts",
            |c| {
                c.unannounce();
                c.annotate(names::ANN_BETA_STORAGE_PROVISIONER, US);
                c.provision_before_binder = false;
            },
            Step::ResolveModule,
        ),
        (
            "a claim announced to another provisioner whose intent is in our journal is ours",
            |c| {
                c.annotate(names::ANN_STORAGE_PROVISIONER, "other.example.com");
                c.journaled = true;
                c.delete();
            },
            Step::HoldJournal,
        ),
        // Deleted.
        (
            "a deleted claim with nothing under way is forgotten",
            |c| c.delete(),
            Step::ForgetDeleted,
        ),
        (
            "a deleted claim whose intent is in the journal is cleaned up",
            |c| {
                c.delete();
                c.journaled = true;
            },
            Step::HoldJournal,
        ),
        (
            "a deleted claim whose intent is on it is cleaned up",
            |c| {
                c.delete();
                c.finalize();
            },
            Step::HoldJournal,
        ),
        (
            "another provisioner's deleted claim with the finalizer is left alone",
            |c| {
                c.delete();
                c.finalize();
                c.annotate(names::ANN_STORAGE_PROVISIONER, "other.example.com");
            },
            Step::LeaveAlone,
        ),
        // Bound.
        (
            "bound to its PV, the binder not done: wait for its status write",
            |c| c.bind(&format!("pvc-{UID}"), "Pending"),
            Step::AwaitBinder,
        ),
        (
            "bound to its PV: the intent goes",
            |c| c.bind(&format!("pvc-{UID}"), "Bound"),
            Step::ReleaseBound,
        ),
        (
            "bound to another PV: the intent goes",
            |c| c.bind("static-1", "Pending"),
            Step::ReleaseBound,
        ),
        // Retry state.
        (
            "given up on and edited since: forgiven",
            |c| c.retry.given_up = Some(1),
            Step::Forgive,
        ),
        (
            "given up on and unchanged: waits out its hold",
            |c| {
                c.retry.given_up = Some(fingerprint(&c.claim));
                c.hold();
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "its class is not cached: read it",
            |c| c.cached_class = None,
            Step::LookUpClass,
        ),
        (
            "infeasible under another class version: forgiven",
            |c| {
                c.retry.infeasible_under = Some("6".into());
                c.hold();
            },
            Step::Forgive,
        ),
        (
            "infeasible under this class version: waits the slow interval",
            |c| {
                c.retry.infeasible_under = Some("7".into());
                c.hold();
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held and unchanged: waits",
            |c| c.hold(),
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held, then the binder's announcement (GA) arrives: still waits",
            |c| {
                c.unannounce();
                c.hold();
                c.annotate(names::ANN_STORAGE_PROVISIONER, US);
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held, then the beta announcement arrives: still waits",
            |c| {
                c.hold();
                c.annotate(names::ANN_BETA_STORAGE_PROVISIONER, US);
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held, then our own finalizer write echoes: still waits",
            |c| {
                c.hold();
                c.finalize();
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held, then its status changes: still waits",
            |c| {
                c.hold();
                c.claim.status = Some(PersistentVolumeClaimStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                });
            },
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "held, then the user edits a label: the hold goes",
            |c| {
                c.hold();
                c.claim.metadata.labels = Some([("tier".to_string(), "gold".to_string())].into());
            },
            Step::DropHold,
        ),
        (
            "held, then the user edits an annotation: the hold goes",
            |c| {
                c.hold();
                c.annotate("example.com/size-hint", "large");
            },
            Step::DropHold,
        ),
        (
            "held, then the scheduler selects another node: the hold goes",
            |c| {
                c.hold();
                c.annotate(names::ANN_SELECTED_NODE, "n2");
            },
            Step::DropHold,
        ),
        (
            "a hold that expired goes",
            |c| {
                c.hold();
                c.now += Duration::from_secs(61);
            },
            Step::DropHold,
        ),
        // Published, module, rules.
        (
            "its PV exists: done",
            |c| c.published = true,
            Step::AlreadyPublished,
        ),
        (
            "the module is not resolved yet",
            |_| {},
            Step::ResolveModule,
        ),
        (
            "the module is still loading: waits without a failed attempt",
            |c| c.module = Lookup::Found(ModuleKind::Loading),
            Step::ModuleLoading,
        ),
        (
            "no module to ask",
            |c| c.module = Lookup::Found(ModuleKind::Unavailable),
            Step::ModuleUnavailable,
        ),
        (
            "its class is missing: a Warning and a retry",
            |c| {
                c.cached_class = None;
                c.live_class = Lookup::Missing;
            },
            skip(
                SkipProvision::ClassMissing {
                    class: Some("fast".into()),
                },
                true,
                true,
            ),
        ),
        (
            "its class read from the API counts",
            |c| {
                c.live_class = Lookup::Found(c.cached_class.take().unwrap());
                c.module = Lookup::Found(ModuleKind::Loaded);
            },
            Step::EnterShare,
        ),
        (
            "its class is another provisioner's: no Event, no retry",
            |c| c.cached_class = Some(class("other.example.com")),
            skip(
                SkipProvision::ClassNotOurs {
                    class: "fast".into(),
                    provisioner: "other.example.com".into(),
                },
                false,
                false,
            ),
        ),
        (
            "WaitForFirstConsumer without a node: waits for the scheduler",
            |c| {
                c.wait_for_first_consumer();
                c.module = Lookup::Found(ModuleKind::Loaded);
            },
            skip(
                SkipProvision::WaitingForNode {
                    class: "fast".into(),
                },
                false,
                false,
            ),
        ),
        (
            "block the module cannot make: a Warning, no retry",
            |c| {
                c.claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
                c.module = Lookup::Found(ModuleKind::Loaded);
            },
            skip(
                SkipProvision::BlockUnsupported {
                    plugin: "echo".into(),
                },
                true,
                false,
            ),
        ),
        // The module's share, the selected node.
        (
            "a worker of the module's share is taken",
            |c| c.module = Lookup::Found(ModuleKind::Loaded),
            Step::EnterShare,
        ),
        (
            "the module holds its whole share: waits in its queue",
            |c| {
                c.module = Lookup::Found(ModuleKind::Loaded);
                c.share = Share::Full;
            },
            Step::WaitForShare,
        ),
        // The class's verdict (a module with validate-class).
        (
            "a module that validates classes: its verdict is looked up, once a worker is held",
            |c| c.validating(),
            Step::ValidateClass,
        ),
        (
            "a module without validate-class (a 0.1 module): no verdict, on to the node",
            |c| {
                c.admitted();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
            },
            Step::LookUpNode,
        ),
        (
            "a class the module accepts: on to the node",
            |c| {
                c.validating();
                c.verdict = Lookup::Found(ClassVerdict::Valid);
                c.annotate(names::ANN_SELECTED_NODE, "n1");
            },
            Step::LookUpNode,
        ),
        (
            "a class the module accepts: on to should-provision",
            |c| {
                c.validating();
                c.verdict = Lookup::Found(ClassVerdict::Valid);
            },
            Step::AskShouldProvision {
                node_vanished: false,
            },
        ),
        (
            "a class the module rejects: the claim fails at once, provision is not called",
            |c| {
                c.validating();
                c.verdict = Lookup::Found(ClassVerdict::Rejected);
            },
            Step::ClassRejected,
        ),
        (
            "a class the module could not validate (trap, timeout): the claim fails at once",
            |c| {
                c.validating();
                c.verdict = Lookup::Found(ClassVerdict::Failed);
            },
            Step::ClassRejected,
        ),
        (
            "a rejected class is told before its claim's selected node is looked up",
            |c| {
                c.validating();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
                c.verdict = Lookup::Found(ClassVerdict::Rejected);
            },
            Step::ClassRejected,
        ),
        (
            "a verdict that could not be asked now (the module busy): retried soon",
            |c| {
                c.validating();
                c.verdict = Lookup::Found(ClassVerdict::NotNow);
            },
            Step::ClassUnchecked,
        ),
        (
            "a rejected class with a provision under way (intent recorded): the module is asked",
            |c| {
                c.validating();
                c.finalize();
                c.verdict = Lookup::Found(ClassVerdict::Rejected);
            },
            Step::AskShouldProvision {
                node_vanished: false,
            },
        ),
        (
            "rejected under this class version and module version: waits the slow interval",
            |c| c.held_rejected(),
            Step::WaitHeld(Duration::from_secs(60)),
        ),
        (
            "rejected, then the class changed (recreated): forgiven at once",
            |c| {
                c.held_rejected();
                c.cached_class.as_mut().unwrap().metadata.resource_version = Some("8".into());
            },
            Step::Forgive,
        ),
        (
            "rejected, then a new module version is in service: forgiven at once",
            |c| {
                c.held_rejected();
                c.module_sha256 = Some("6f6f".into());
            },
            Step::Forgive,
        ),
        (
            "rejected, then the module left service: forgiven (and told it is missing)",
            |c| {
                c.held_rejected();
                c.module_sha256 = None;
            },
            Step::Forgive,
        ),
        (
            "a selected node not looked up yet",
            |c| {
                c.admitted();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
            },
            Step::LookUpNode,
        ),
        (
            "its selected node is gone, nothing under way: rescheduled",
            |c| {
                c.admitted();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
                c.node = Lookup::Missing;
            },
            Step::Reschedule,
        ),
        (
            "its selected node is gone while provisioning is under way: the module is asked",
            |c| {
                c.admitted();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
                c.node = Lookup::Missing;
                c.finalize();
            },
            Step::AskShouldProvision {
                node_vanished: true,
            },
        ),
        (
            "its selected node exists: the module is asked",
            |c| {
                c.admitted();
                c.annotate(names::ANN_SELECTED_NODE, "n1");
                c.node = Lookup::Found(());
            },
            Step::AskShouldProvision {
                node_vanished: false,
            },
        ),
        // should-provision.
        (
            "no node selected: the module is asked",
            |c| c.admitted(),
            Step::AskShouldProvision {
                node_vanished: false,
            },
        ),
        (
            "should-provision says no",
            |c| {
                c.admitted();
                c.should_provision = Some(Ok(false));
            },
            Step::Declined,
        ),
        (
            "should-provision finds the module busy",
            |c| {
                c.admitted();
                c.should_provision = Some(Err(CallFailure::Busy));
            },
            Step::Busy {
                clear_journal: false,
            },
        ),
        (
            "should-provision finds the pool full",
            |c| {
                c.admitted();
                c.should_provision = Some(Err(CallFailure::PoolFull));
            },
            Step::PoolFull {
                clear_journal: false,
            },
        ),
        (
            "should-provision fails",
            |c| {
                c.admitted();
                c.should_provision = Some(Err(CallFailure::Failed));
            },
            Step::ShouldProvisionFailed,
        ),
        // The intent.
        (
            "should-provision says yes: provisioning begins",
            |c| c.agreed(),
            Step::BeginProvisioning,
        ),
        (
            "the journal entry is held elsewhere",
            |c| {
                c.agreed();
                c.journal = JournalHold::Refused;
            },
            Step::JournalBusy,
        ),
        (
            "the intent goes in the journal first",
            |c| {
                c.agreed();
                c.journal = JournalHold::Taken;
            },
            Step::RecordInJournal,
        ),
        (
            "too large for the journal: the intent goes on the claim",
            |c| {
                c.agreed();
                c.journal = JournalHold::Taken;
                c.recorded = Recorded::TooLargeForJournal;
            },
            Step::RecordOnClaim,
        ),
        (
            "the claim went while its finalizer was added: not provisioned",
            |c| {
                c.agreed();
                c.journal = JournalHold::Taken;
                c.recorded = Recorded::ClaimGone;
            },
            Step::ClaimGone,
        ),
        (
            "the intent is on the claim already: the module is asked",
            |c| {
                c.agreed();
                c.journal = JournalHold::Taken;
                c.finalize();
            },
            Step::Provision,
        ),
        (
            "the intent is in the journal: the module is asked",
            |c| c.recorded(),
            Step::Provision,
        ),
        // The module's answer.
        (
            "ignored",
            |c| {
                c.recorded();
                c.answer = Some(Answer::Ignored);
            },
            Step::Ignored,
        ),
        (
            "failed",
            |c| {
                c.recorded();
                c.answer = Some(Answer::Failed);
            },
            Step::ModuleFailed,
        ),
        (
            "in background",
            |c| {
                c.recorded();
                c.answer = Some(Answer::InBackground);
            },
            Step::InBackground,
        ),
        (
            "reschedule",
            |c| {
                c.recorded();
                c.answer = Some(Answer::Reschedule);
            },
            Step::ModuleReschedules,
        ),
        (
            "infeasible",
            |c| {
                c.recorded();
                c.answer = Some(Answer::Infeasible);
            },
            Step::Infeasible,
        ),
        (
            "provision finds the module busy: the intent goes",
            |c| {
                c.recorded();
                c.answer = Some(Answer::CallFailed(CallFailure::Busy));
            },
            Step::Busy {
                clear_journal: true,
            },
        ),
        (
            "provision finds the pool full: the intent goes",
            |c| {
                c.recorded();
                c.answer = Some(Answer::CallFailed(CallFailure::PoolFull));
            },
            Step::PoolFull {
                clear_journal: true,
            },
        ),
        (
            "provision fails in the sandbox: the intent stays",
            |c| {
                c.recorded();
                c.answer = Some(Answer::CallFailed(CallFailure::Failed));
            },
            Step::ProvisionCallFailed,
        ),
        // Publishing.
        (
            "a volume: checked first",
            |c| c.answered_volume(),
            Step::CheckVolume,
        ),
        (
            "a volume that cannot be published is discarded",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Unpublishable;
            },
            Step::Discard(DiscardOf::Answer),
        ),
        (
            "the unpublishable volume was deleted",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Unpublishable;
                c.deleted = Some(true);
            },
            Step::Discarded,
        ),
        (
            "deleting the unpublishable volume failed",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Unpublishable;
                c.deleted = Some(false);
            },
            Step::DiscardFailed,
        ),
        (
            "a publishable volume is saved",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Publishable;
            },
            Step::SaveVolume,
        ),
        (
            "saved: published",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Saved;
            },
            Step::Published,
        ),
        (
            "a PV of its name is not the claim's",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::Conflict;
            },
            Step::SaveConflict,
        ),
        (
            "not saved: the volume is discarded as its PV says",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::NotSaved;
            },
            Step::Discard(DiscardOf::Volume),
        ),
        (
            "not saved, and discarded",
            |c| {
                c.answered_volume();
                c.publishing = Publishing::NotSaved;
                c.deleted = Some(true);
            },
            Step::Discarded,
        ),
        // Cleanup of a deleted claim (and of a claim gone, from the journal).
        (
            "cleanup: the journal entry is held elsewhere",
            |c| {
                c.cleaning_up();
                c.journal = JournalHold::Refused;
            },
            Step::JournalBusy,
        ),
        (
            "cleanup: its PV is read from the API",
            |c| c.cleaning_up(),
            Step::ReadVolume,
        ),
        (
            "cleanup: its PV exists and owns the volume",
            |c| {
                c.cleaning_up();
                c.live_volume_is_the_claims = Lookup::Found(true);
            },
            Step::CleanupPublished,
        ),
        (
            "cleanup: its class is gone: the claim is told",
            |c| {
                c.cleaning_up();
                c.live_volume_is_the_claims = Lookup::Found(false);
                c.cached_class = None;
            },
            Step::CleanupClassGone { tell: true },
        ),
        (
            "cleanup of a claim gone from the API: its class is gone, nobody to tell",
            |c| {
                c.gone = true;
                c.journaled = true;
                c.journal = JournalHold::Taken;
                c.live_volume_is_the_claims = Lookup::Missing;
                c.cached_class = None;
            },
            Step::CleanupClassGone { tell: false },
        ),
        (
            "cleanup: the module is resolved",
            |c| {
                c.cleaning_up();
                c.live_volume_is_the_claims = Lookup::Missing;
            },
            Step::ResolveModule,
        ),
        (
            "cleanup: the module is still loading",
            |c| {
                c.cleaning_up();
                c.live_volume_is_the_claims = Lookup::Missing;
                c.module = Lookup::Found(ModuleKind::Loading);
            },
            Step::ModuleLoading,
        ),
        (
            "cleanup: no module to ask",
            |c| {
                c.cleaning_up();
                c.live_volume_is_the_claims = Lookup::Missing;
                c.module = Lookup::Found(ModuleKind::Unavailable);
            },
            Step::CleanupModuleUnavailable,
        ),
        (
            "cleanup: the module is asked again",
            |c| c.cleanup_asking(),
            Step::AskAgain,
        ),
        (
            "cleanup: its volume is deleted",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::Volume);
            },
            Step::DeleteAgain,
        ),
        (
            "cleanup: deleted",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::Volume);
                c.deleted = Some(true);
            },
            Step::CleanedUp,
        ),
        (
            "cleanup: the delete failed",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::Volume);
                c.deleted = Some(false);
            },
            Step::CleanupFailed,
        ),
        (
            "cleanup: still in background",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::InBackground);
            },
            Step::StillInBackground,
        ),
        (
            "cleanup: the module answers that nothing is left",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::Failed);
            },
            Step::NothingLeft,
        ),
        (
            "cleanup: the call fails",
            |c| {
                c.cleanup_asking();
                c.answer = Some(Answer::CallFailed(CallFailure::Failed));
            },
            Step::CleanupFailed,
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
fn the_steps_that_learn_are_followed_by_another_decision() {
    for step in [
        Step::LookUpClass,
        Step::ValidateClass,
        Step::Provision,
        Step::Discard(DiscardOf::Volume),
    ] {
        assert!(step.learns(), "{step:?}");
    }
    for step in [
        Step::LeaveAlone,
        Step::WaitHeld(Duration::ZERO),
        Step::ClassRejected,
        Step::ClassUnchecked,
        Step::Published,
    ] {
        assert!(!step.learns(), "{step:?}");
    }
}

#[test]
fn a_claim_gone_from_the_api_is_only_cleaned_up() {
    let mut c = Case::new();
    c.gone = true;
    c.journaled = true;
    c.annotate(names::ANN_STORAGE_PROVISIONER, "other.example.com");
    assert_eq!(decide(&c.snapshot()), Step::HoldJournal);
}
