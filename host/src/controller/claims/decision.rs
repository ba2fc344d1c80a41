//! The claim controller's whole decision table, as one pure function over a snapshot:
//! [`decide`] reads what the controller knows of a claim ([`Snapshot`]) and names the
//! next [`Step`]; the controller performs it ([`super::act`]) and, for a step that
//! learns something (a lookup, a guest call, a write whose result matters), decides
//! again with what it learned. The act side holds no decision.
//!
//! The table is the Go library's (sig-storage-lib-external-provisioner: whose claim,
//! bound, class, selected node, the plugin's answers) plus the host's own: provisioning
//! before the binder's announcement, the intent recorded before the module is called
//! (journal, else finalizer) and kept or released after its answer, the module's share
//! of the workers, publishing or discarding the answer, cleaning up after a claim
//! deleted mid-flight, the class's verdict (a class its module's `validate-class`
//! rejects fails its claims at once, without `provision`), and the retry state (given
//! up, held for a back-off, infeasible under a class version, rejected under a class
//! version and module version).
//!
//! A held claim waits while what the decision reads of it is unchanged: its
//! [`fingerprint`] covers the claim's spec, labels and annotations but not the
//! provisioner announcement (whether a claim is ours is decided from it, and the answer
//! is the same before and after the binder writes it, or after the host writes it with
//! its finalizer), nor finalizers or status (kube-controller-manager's and the host's
//! own bookkeeping). An update of those alone leaves the claim's back-off alone.
//!
//! No Kubernetes client, no async runtime, no sandbox here: plain data in, a step out.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use wasm_provisioner_rules::claim::ClaimView;
use wasm_provisioner_rules::decide::{self, ProvisionDecision, SkipProvision};
use wasm_provisioner_rules::names;
use wasm_provisioner_rules::types::{Capability, PluginInfo};

/// A fact the controller looks up only when the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<T> {
    /// Not looked up yet in this reconcile.
    NotLooked,
    Found(T),
    /// Looked up: not there.
    Missing,
}

impl<T> Lookup<T> {
    pub fn as_ref(&self) -> Lookup<&T> {
        match self {
            Lookup::NotLooked => Lookup::NotLooked,
            Lookup::Found(found) => Lookup::Found(found),
            Lookup::Missing => Lookup::Missing,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Lookup<U> {
        match self {
            Lookup::NotLooked => Lookup::NotLooked,
            Lookup::Found(found) => Lookup::Found(f(found)),
            Lookup::Missing => Lookup::Missing,
        }
    }

    /// What was found, if anything.
    pub fn found(self) -> Option<T> {
        match self {
            Lookup::Found(found) => Some(found),
            Lookup::NotLooked | Lookup::Missing => None,
        }
    }
}

impl<T, E> Lookup<Result<T, E>> {
    /// What was found and is usable, if anything.
    pub fn usable(&self) -> Option<&T> {
        match self {
            Lookup::Found(Ok(found)) => Some(found),
            _ => None,
        }
    }
}

/// The retry state of the claim's queue key, as [`super::super::retry::Retries`] holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryRecord {
    /// Given up on, with the claim's fingerprint then.
    pub given_up: Option<u64>,
    /// Waiting out a delay: the claim's fingerprint then, and until when.
    pub held: Option<(u64, Instant)>,
    /// The last answer was infeasible, under this version of the class.
    pub infeasible_under: Option<String>,
    /// The class was rejected (or could not be validated) under this version of the
    /// class and this version (sha256) of its module.
    pub rejected_under: Option<(String, String)>,
}

/// The class's module's verdict on the class (`validate-class`, asked once per class
/// version and module version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassVerdict {
    Valid,
    /// The module rejected the class.
    Rejected,
    /// The validation call failed (trapped, timed out): the class cannot be vouched for.
    Failed,
    /// The call could not start (the module busy, the pool full): asked again soon.
    NotNow,
}

/// The class's module, as the runtime has it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Module<'a> {
    /// In service (the version the class pins, if it pins one).
    Loaded(&'a PluginInfo),
    /// Its first version is still compiling.
    Loading,
    /// Missing, refused, not the pinned version, or the class names none.
    Unavailable,
}

/// The module's share of the claim workers ([`super::super::shares`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    NotTried,
    /// This reconcile holds one of the module's workers.
    Entered,
    /// The module holds its whole share: the claim waits in its queue.
    Full,
}

/// A guest call that did not run to an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFailure {
    /// The module runs its `maxConcurrentCalls` already: nothing started.
    Busy,
    /// The host's instance pool is full: nothing started.
    PoolFull,
    /// Trapped, timed out, stuck, ...: the backend may hold half a volume.
    Failed,
}

/// The module's answer to `provision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Volume,
    Ignored,
    Failed,
    InBackground,
    Reschedule,
    Infeasible,
    CallFailed(CallFailure),
}

/// Whether the claim's journal entry is this reconcile's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalHold {
    NotTaken,
    Taken,
    /// The sweep, or another attempt, is at the claim's entry.
    Refused,
}

/// Where this attempt recorded the intent to provision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Nowhere,
    InJournal,
    /// Too large for the journal: it goes on the claim instead.
    TooLargeForJournal,
    OnClaim,
    /// The claim is gone or being deleted: no finalizer could be added.
    ClaimGone,
}

/// What became of the module's volume once it was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publishing {
    /// Not checked yet.
    Unchecked,
    /// Invalid as a PV, or a source its grants do not allow.
    Unpublishable,
    /// A valid PV, not saved yet.
    Publishable,
    Saved,
    /// A PV of the name exists that is not this claim's live volume.
    Conflict,
    /// Not saved after every try.
    NotSaved,
}

/// The settings the decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub provisioner_name: &'a str,
    /// `--provision-before-binder`.
    pub provision_before_binder: bool,
}

/// What the controller knows of a claim when it decides.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    /// The claim as this reconcile last saw it (fresh after a write of ours).
    pub claim: &'a PersistentVolumeClaim,
    /// The claim is gone from the API: this is the journal's copy, cleaned up by the
    /// journal's sweep.
    pub gone: bool,
    pub rules: Rules<'a>,
    pub now: Instant,
    /// The provisioning journal holds an intent for the claim.
    pub journaled: bool,
    /// An existing PV may be the claim's (the binder's to bind).
    pub static_volume_may_bind: bool,
    pub retry: RetryRecord,
    /// The claim's class as the cache has it.
    pub cached_class: Option<&'a StorageClass>,
    /// The claim's class read from the API after a cache miss.
    pub live_class: Lookup<&'a StorageClass>,
    /// The claim's PV exists: the cache shows it as this claim's, or this process just
    /// created it.
    pub published: bool,
    pub module: Lookup<Module<'a>>,
    /// The sha256 of the version of the class's module in service when the reconcile
    /// started (a claim rejected under another version is forgiven).
    pub module_sha256: Option<&'a str>,
    /// The module's verdict on the class, once asked (only of a module that validates).
    pub verdict: Lookup<ClassVerdict>,
    pub share: Share,
    /// The selected node: in the cache, else read from the API.
    pub node: Lookup<()>,
    /// The module's `should-provision` answer.
    pub should_provision: Option<Result<bool, CallFailure>>,
    pub journal: JournalHold,
    pub recorded: Recorded,
    /// The module's `provision` answer (in a cleanup, the answer asked again).
    pub answer: Option<Answer>,
    pub publishing: Publishing,
    /// The module's `delete` of a volume made but not published (or, in a cleanup, of
    /// the volume asked again): whether it succeeded.
    pub deleted: Option<bool>,
    /// In a cleanup: the PV of the claim's name, read from the API, is this claim's.
    pub live_volume_is_the_claims: Lookup<bool>,
}

/// Which delete request discards a volume that was made but not published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscardOf {
    /// The module's answer as it gave it (it could not even become a PV).
    Answer,
    /// The PV that could not be saved.
    Volume,
}

/// The next thing to do about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    // Steps that learn something; the controller decides again after each.
    /// The class is not in the cache: read it from the API (our class watch may lag the
    /// binder's, which announced the claim).
    LookUpClass,
    /// The claim changed since it was given up on, or its class since an infeasible
    /// answer: its failures are forgotten and it starts over.
    Forgive,
    /// A hold that no longer applies (expired, or the claim changed since) goes.
    DropHold,
    /// Resolve the class's module (honouring `moduleSHA256`).
    ResolveModule,
    /// Take one of the module's workers.
    EnterShare,
    /// Get the module's verdict on the class (known, or asked once for all its claims).
    ValidateClass,
    /// The selected node is not in the cache: read it from the API before it counts as
    /// gone (rescheduling is not undone).
    LookUpNode,
    /// Ask the module's `should-provision`; `node_vanished`: with the name of a node
    /// that is gone, because a provision is under way.
    AskShouldProvision { node_vanished: bool },
    /// Provisioning starts (counted in flight, a storm on): take the claim's journal
    /// entry, so the sweep leaves it alone.
    BeginProvisioning,
    /// In a cleanup: take the claim's journal entry, so the sweep leaves it alone.
    HoldJournal,
    /// Persist the intent in the journal before the backend is touched.
    RecordInJournal,
    /// Persist the intent on the claim (our finalizer): the slow path.
    RecordOnClaim,
    /// Tell the claim it is being provisioned, and ask the module.
    Provision,
    /// Turn the module's volume into a PV, checked against its volume grants.
    CheckVolume,
    /// Create the PV.
    SaveVolume,
    /// Delete, through the module, the volume that was made but cannot be published.
    Discard(DiscardOf),
    /// In a cleanup: read the claim's PV from the API.
    ReadVolume,
    /// In a cleanup: ask the module for the claim's volume once more.
    AskAgain,
    /// In a cleanup: delete the volume the module answered.
    DeleteAgain,

    // Steps that end the reconcile.
    /// Not this provisioner's claim (or not yet: neither announced nor taken before the
    /// binder).
    LeaveAlone,
    /// Being deleted with nothing of ours under way: forget it.
    ForgetDeleted,
    /// Bound to its PV, the binder not done with it yet: its status write comes next.
    AwaitBinder,
    /// Bound: whatever was started is published; the intent goes.
    ReleaseBound,
    /// Waiting out a back-off (or an ignored answer) while unchanged.
    WaitHeld(Duration),
    /// Its PV exists: provisioning is done (the binder binds it next).
    AlreadyPublished,
    /// The module is still loading: no failed attempt, no Event.
    ModuleLoading,
    /// No module to ask: a Warning Event, and a retry.
    ModuleUnavailable,
    /// A rule says no: a Warning Event when only a person can fix it (`warn`), a retry
    /// with back-off when it may heal on its own (`retry`).
    Skip {
        reason: SkipProvision,
        warn: bool,
        retry: bool,
    },
    /// The module holds its whole share of the workers.
    WaitForShare,
    /// The class's module rejects the class (or could not validate it): a Warning Event
    /// with its message, a failed attempt, retried slowly (at once when the class or the
    /// module's version changes); `provision` is not called.
    ClassRejected,
    /// The verdict could not be asked now (the module busy): retried soon, no Event.
    ClassUnchecked,
    /// The selected node is gone and nothing is under way: a Warning Event, the
    /// selected-node annotations go so the scheduler picks again.
    Reschedule,
    /// `should-provision` said no.
    Declined,
    /// The module was busy: nothing started; retried soon. `clear_journal`: an intent
    /// recorded for the call goes.
    Busy { clear_journal: bool },
    /// The instance pool was full: a Warning Event; retried soon.
    PoolFull { clear_journal: bool },
    /// `should-provision` failed: a failed attempt (nothing was made).
    ShouldProvisionFailed,
    /// The journal entry is held elsewhere: retried soon.
    JournalBusy,
    /// The claim went (or is going) while its intent was being recorded.
    ClaimGone,
    /// The provision call failed in the sandbox: the backend may hold half a volume,
    /// so the intent stays (on the claim); a failed attempt.
    ProvisionCallFailed,
    /// "Not mine": no Warning, no retry; nothing was made.
    Ignored,
    /// The module failed: a failed attempt; nothing left in the backend.
    ModuleFailed,
    /// The module works in the background: a failed attempt; the intent stays.
    InBackground,
    /// The selected node cannot host it: a failed attempt; the scheduler picks again.
    ModuleReschedules,
    /// Cannot succeed as asked: a failed attempt, retried slowly (at once when the
    /// class changes).
    Infeasible,
    /// The PV is saved: Events, metrics; the journal entry goes.
    Published,
    /// A PV of its name is not this claim's: that PV's deletion owns the backend
    /// volume; the intent stays, a failed attempt.
    SaveConflict,
    /// The unpublishable volume was deleted: a failed attempt, nothing left.
    Discarded,
    /// Deleting it failed too: the intent stays (on the claim), ProvisioningCleanupFailed.
    DiscardFailed,
    /// In a cleanup: the claim's PV exists, and owns the backend volume.
    CleanupPublished,
    /// In a cleanup: the class is gone, so the module cannot be asked; retried, with a
    /// Warning Event on a claim still in the API (`tell`).
    CleanupClassGone { tell: bool },
    /// In a cleanup: no module to ask (a Warning Event, as when provisioning).
    CleanupModuleUnavailable,
    /// In a cleanup: the module's volume was deleted; the intent goes.
    CleanedUp,
    /// In a cleanup: the module answered that nothing is left.
    NothingLeft,
    /// In a cleanup: the module still works in the background.
    StillInBackground,
    /// In a cleanup: a call or the delete failed; retried.
    CleanupFailed,
}

impl Step {
    /// Whether the controller decides again after performing this step.
    pub fn learns(&self) -> bool {
        matches!(
            self,
            Step::LookUpClass
                | Step::Forgive
                | Step::DropHold
                | Step::ResolveModule
                | Step::EnterShare
                | Step::ValidateClass
                | Step::LookUpNode
                | Step::AskShouldProvision { .. }
                | Step::BeginProvisioning
                | Step::HoldJournal
                | Step::RecordInJournal
                | Step::RecordOnClaim
                | Step::Provision
                | Step::CheckVolume
                | Step::SaveVolume
                | Step::Discard(_)
                | Step::ReadVolume
                | Step::AskAgain
                | Step::DeleteAgain
        )
    }
}

/// What the decision reads of a claim, hashed: its spec, labels and annotations, without
/// the provisioner announcement (GA and beta). A held or given-up claim waits while this
/// is unchanged; an edit of the claim starts it over at once.
pub fn fingerprint(claim: &PersistentVolumeClaim) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(&claim.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    claim.metadata.labels.hash(&mut hasher);
    let annotations = claim
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(key, _)| {
            ![
                names::ANN_STORAGE_PROVISIONER,
                names::ANN_BETA_STORAGE_PROVISIONER,
            ]
            .contains(&key.as_str())
        });
    for annotation in annotations {
        annotation.hash(&mut hasher);
    }
    hasher.finish()
}

/// The next step for the claim of `snapshot`.
pub fn decide(s: &Snapshot) -> Step {
    if s.gone {
        return cleanup(s);
    }
    whose(s)
        .or_else(|| deleting(s))
        .or_else(|| bound(s))
        .or_else(|| retries(s))
        .or_else(|| published(s))
        .or_else(|| rules(s))
        .or_else(|| verdict(s))
        .or_else(|| node(s))
        .or_else(|| should_provision(s))
        .unwrap_or_else(|| provisioning(s))
}

/// Whether the claim's intent to provision is recorded: in the journal or on the claim.
fn intent_recorded(s: &Snapshot) -> bool {
    s.journaled || ClaimView(s.claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING)
}

/// The claim's class: the cache's, else the API's.
fn class<'a>(s: &Snapshot<'a>) -> Option<&'a StorageClass> {
    match (s.cached_class, s.live_class) {
        (Some(class), _) | (None, Lookup::Found(class)) => Some(class),
        _ => None,
    }
}

fn class_is_ours(s: &Snapshot, class: &StorageClass) -> bool {
    class.provisioner == s.rules.provisioner_name
}

/// Not announced to us, but ours all the same: its provisioning started already (its
/// intent is in our journal), or it is taken before the binder's announcement
/// (`--provision-before-binder`: announced to nobody, no volume and no selector named,
/// its class as cached ours, and no existing PV that may be its).
fn taken_before_binder(s: &Snapshot) -> bool {
    if s.journaled {
        return true;
    }
    if ClaimView(s.claim).provisioner().is_some() {
        return false;
    }
    let spec = s.claim.spec.as_ref();
    let names_volume_or_selector = spec.is_some_and(|spec| {
        spec.selector.is_some() || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
    });
    s.rules.provision_before_binder
        && !names_volume_or_selector
        && s.cached_class.is_some_and(|c| class_is_ours(s, c))
        && !s.static_volume_may_bind
}

fn announced(s: &Snapshot) -> bool {
    ClaimView(s.claim).provisioner() == Some(s.rules.provisioner_name)
}

/// Another provisioner's claim (every host uses the same claim finalizer, so another
/// instance's claims, even being deleted, are not ours), or one not announced yet.
fn whose(s: &Snapshot) -> Option<Step> {
    (!announced(s) && !taken_before_binder(s)).then_some(Step::LeaveAlone)
}

fn deleting(s: &Snapshot) -> Option<Step> {
    if !ClaimView(s.claim).is_deleting() {
        return None;
    }
    Some(if intent_recorded(s) {
        cleanup(s)
    } else {
        Step::ForgetDeleted
    })
}

/// Bound or being bound: whatever was started is published; our finalizer can go once
/// the binder is done with the claim (its status write is the last of a bind; an edit
/// of ours before it would conflict with the binder's update).
fn bound(s: &Snapshot) -> Option<Step> {
    let view = ClaimView(s.claim);
    let volume = view.bound_volume()?;
    if Some(volume) == view.volume_name().as_deref() && !view.binding_settled() {
        return Some(Step::AwaitBinder);
    }
    Some(Step::ReleaseBound)
}

/// Forgiveness and holds: a claim changed since it was given up on, or whose class
/// changed since its infeasible answer, starts over; a claim held and unchanged waits.
fn retries(s: &Snapshot) -> Option<Step> {
    let print = fingerprint(s.claim);
    if s.retry.given_up.is_some_and(|at| at != print) {
        return Some(Step::Forgive);
    }
    if s.cached_class.is_none()
        && s.live_class == Lookup::NotLooked
        && ClaimView(s.claim).class_name().is_some()
    {
        return Some(Step::LookUpClass);
    }
    if let (Some(class), Some(under)) = (class(s), &s.retry.infeasible_under)
        && class
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
            != under
    {
        return Some(Step::Forgive);
    }
    if let (Some(class), Some((class_version, module_sha256))) = (class(s), &s.retry.rejected_under)
        && (class
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
            != class_version
            || s.module_sha256 != Some(module_sha256.as_str()))
    {
        return Some(Step::Forgive);
    }
    let (at, until) = s.retry.held?;
    if at == print && until > s.now {
        return Some(Step::WaitHeld(until - s.now));
    }
    Some(Step::DropHold)
}

fn published(s: &Snapshot) -> Option<Step> {
    s.published.then_some(Step::AlreadyPublished)
}

/// The module of a class of ours, then the library's rules (decide.rs).
fn rules(s: &Snapshot) -> Option<Step> {
    let class = class(s);
    let unknown = PluginInfo {
        name: String::new(),
        version: String::new(),
        supports_block: false,
        data_source_kinds: Vec::new(),
        capabilities: Vec::new(),
    };
    let info = match (class.filter(|c| class_is_ours(s, c)), s.module) {
        (None, _) => &unknown,
        (Some(_), Lookup::NotLooked) => return Some(Step::ResolveModule),
        (Some(_), Lookup::Found(Module::Loaded(info))) => info,
        (Some(_), Lookup::Found(Module::Loading)) => return Some(Step::ModuleLoading),
        (Some(_), _) => return Some(Step::ModuleUnavailable),
    };
    let names = [s.rules.provisioner_name];
    match decide::should_provision(s.claim, class, &names, info, !announced(s)) {
        ProvisionDecision::Provision => {}
        ProvisionDecision::Skip(reason) => {
            let (warn, retry) = (reason.event_reason().is_some(), reason.retry());
            return Some(Step::Skip {
                reason,
                warn,
                retry,
            });
        }
    }
    // A worker of the module's share, before any API request or call for the claim.
    match s.share {
        Share::NotTried => Some(Step::EnterShare),
        Share::Full => Some(Step::WaitForShare),
        Share::Entered => None,
    }
}

/// The class's verdict, when its module validates classes: a class it rejects (or could
/// not validate) fails the claim before anything else is asked. A provision under way
/// (its intent recorded) goes on: the module is asked for the volume it started.
fn verdict(s: &Snapshot) -> Option<Step> {
    let Lookup::Found(Module::Loaded(info)) = s.module else {
        return None;
    };
    if !info.capabilities.contains(&Capability::ValidateClass) || intent_recorded(s) {
        return None;
    }
    match s.verdict {
        Lookup::NotLooked => Some(Step::ValidateClass),
        Lookup::Found(ClassVerdict::Valid) => None,
        Lookup::Found(ClassVerdict::Rejected | ClassVerdict::Failed) => Some(Step::ClassRejected),
        Lookup::Found(ClassVerdict::NotNow) | Lookup::Missing => Some(Step::ClassUnchecked),
    }
}

/// WaitForFirstConsumer: the selected node must exist, or the scheduler picks again;
/// unless a provision is under way, when a volume may be in the making on that node:
/// then the module is asked again with the node's name, and only its final answer
/// sends the claim back to the scheduler.
fn node(s: &Snapshot) -> Option<Step> {
    ClaimView(s.claim).selected_node()?;
    match s.node {
        Lookup::NotLooked => Some(Step::LookUpNode),
        Lookup::Found(()) => None,
        Lookup::Missing if intent_recorded(s) => None,
        Lookup::Missing => Some(Step::Reschedule),
    }
}

fn should_provision(s: &Snapshot) -> Option<Step> {
    let node_vanished = s.node == Lookup::Missing;
    match s.should_provision {
        None => Some(Step::AskShouldProvision { node_vanished }),
        Some(Ok(true)) => None,
        Some(Ok(false)) => Some(Step::Declined),
        Some(Err(CallFailure::Busy)) => Some(Step::Busy {
            clear_journal: false,
        }),
        Some(Err(CallFailure::PoolFull)) => Some(Step::PoolFull {
            clear_journal: false,
        }),
        Some(Err(CallFailure::Failed)) => Some(Step::ShouldProvisionFailed),
    }
}

/// The intent first (the journal, unless it is on the claim already), the call, then
/// the module's answer.
fn provisioning(s: &Snapshot) -> Step {
    match s.journal {
        JournalHold::NotTaken => return Step::BeginProvisioning,
        JournalHold::Refused => return Step::JournalBusy,
        JournalHold::Taken => {}
    }
    if !ClaimView(s.claim).has_finalizer(names::FINALIZER_CLAIM_PROVISIONING) {
        match s.recorded {
            Recorded::Nowhere => return Step::RecordInJournal,
            Recorded::TooLargeForJournal => return Step::RecordOnClaim,
            Recorded::ClaimGone => return Step::ClaimGone,
            Recorded::InJournal | Recorded::OnClaim => {}
        }
    }
    match s.answer {
        None => Step::Provision,
        Some(Answer::Volume) => publishing(s),
        Some(Answer::Ignored) => Step::Ignored,
        Some(Answer::Failed) => Step::ModuleFailed,
        Some(Answer::InBackground) => Step::InBackground,
        Some(Answer::Reschedule) => Step::ModuleReschedules,
        Some(Answer::Infeasible) => Step::Infeasible,
        Some(Answer::CallFailed(CallFailure::Busy)) => Step::Busy {
            clear_journal: true,
        },
        Some(Answer::CallFailed(CallFailure::PoolFull)) => Step::PoolFull {
            clear_journal: true,
        },
        Some(Answer::CallFailed(CallFailure::Failed)) => Step::ProvisionCallFailed,
    }
}

/// The module answered a volume: publish it, or delete it through the module when it
/// cannot be published (the Go library's choice).
fn publishing(s: &Snapshot) -> Step {
    let discard = |of| match s.deleted {
        None => Step::Discard(of),
        Some(true) => Step::Discarded,
        Some(false) => Step::DiscardFailed,
    };
    match s.publishing {
        Publishing::Unchecked => Step::CheckVolume,
        Publishing::Unpublishable => discard(DiscardOf::Answer),
        Publishing::Publishable => Step::SaveVolume,
        Publishing::Saved => Step::Published,
        Publishing::Conflict => Step::SaveConflict,
        Publishing::NotSaved => discard(DiscardOf::Volume),
    }
}

/// A claim deleted (or gone) while its provisioning was unfinished: unless its PV
/// exists, the module is asked for the volume once more and it is deleted. Never given
/// up on.
fn cleanup(s: &Snapshot) -> Step {
    match s.journal {
        JournalHold::NotTaken => return Step::HoldJournal,
        JournalHold::Refused => return Step::JournalBusy,
        JournalHold::Taken => {}
    }
    match s.live_volume_is_the_claims {
        Lookup::NotLooked => return Step::ReadVolume,
        Lookup::Found(true) => return Step::CleanupPublished,
        Lookup::Found(false) | Lookup::Missing => {}
    }
    // The class as cached: no read for a claim on its way out.
    if s.cached_class.is_none() {
        return Step::CleanupClassGone { tell: !s.gone };
    }
    match s.module {
        Lookup::NotLooked => return Step::ResolveModule,
        Lookup::Found(Module::Loading) => return Step::ModuleLoading,
        Lookup::Found(Module::Unavailable) | Lookup::Missing => {
            return Step::CleanupModuleUnavailable;
        }
        Lookup::Found(Module::Loaded(_)) => {}
    }
    match (s.answer, s.deleted) {
        (None, _) => Step::AskAgain,
        (Some(Answer::Volume), None) => Step::DeleteAgain,
        (Some(Answer::Volume), Some(true)) => Step::CleanedUp,
        (Some(Answer::Volume), Some(false)) => Step::CleanupFailed,
        (Some(Answer::InBackground), _) => Step::StillInBackground,
        (Some(Answer::CallFailed(_)), _) => Step::CleanupFailed,
        (Some(Answer::Ignored | Answer::Failed | Answer::Reschedule | Answer::Infeasible), _) => {
            Step::NothingLeft
        }
    }
}

#[cfg(test)]
mod tests;
