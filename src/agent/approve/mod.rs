//! Whether a call the model asked for runs: the session's permissions and
//! its API key's decide, and a call they ask about waits for a decision
//! (from the hook, else from a person) while its turn's limit runs.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::deps::TurnDeps;
use super::hook::{DEFAULT_HOOK_TIMEOUT_MS, HookCall};
use super::options::AgentOptions;
use super::tools::ToolContext;
use crate::config::AgentConfig;
use crate::model::{ToolCall, ToolSpec};
use crate::permission::{
    DEFAULT_APPROVAL_TIMEOUT_S, Mode, Permissions, Policy, PolicyCall, Rule, Verdict,
};
use crate::protocol::{Approval, EventKind};
use crate::session::approvals::{Decided, Pending, Remember};
use crate::session::{OnBehalfOf, Session};
use crate::store::StoreError;
use paths::{path_argument, resolve};

/// Where relative paths start when the session names no working directory.
mod paths;

pub use paths::EXPECT_PATH;
pub(super) use paths::hide_denied;

const WORKSPACE: &str = "/workspace";
/// How long a decision that claimed a call as its wait ended may take to
/// arrive.
const CLAIMED_GRACE: Duration = Duration::from_secs(5);

/// A turn's permissions: the session's (or the server's default) and its
/// API key's.
pub struct Gate {
    session: Policy,
    key: Option<Policy>,
    timeout: Duration,
    /// The session's hook: asked about what the session's policy asks.
    hook: Option<(String, Duration)>,
    /// The API key's hook: asked about what the key's policy asks, which
    /// neither the session's hook nor a remembered rule may answer.
    key_hook: Option<(String, Duration)>,
    /// Whether external MCP servers' `readOnlyHint`s count.
    trust_hints: bool,
    /// Where relative paths start.
    pub(super) working_dir: String,
    /// The deliberation or pipeline the turn works for.
    on_behalf_of: Option<OnBehalfOf>,
}

/// A policy that was validated when it was stored; one that no longer
/// parses asks about every call rather than letting them run.
fn compiled(permissions: &Permissions, whose: &'static str) -> Policy {
    Policy::compile(permissions, "permissions")
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "a stored permission policy does not parse; every call asks");
            Policy::compile(
                &Permissions {
                    mode: Some(Mode::Ask),
                    ..Permissions::default()
                },
                "permissions",
            )
            .unwrap_or_default()
        })
        .of(whose)
}

impl Gate {
    pub fn new(config: &AgentConfig, options: &AgentOptions, owner: Option<&str>) -> Gate {
        let own = options
            .permissions
            .clone()
            .unwrap_or_else(|| config.permissions.default_policy());
        let key = owner.and_then(|owner| {
            config
                .permissions
                .keys
                .iter()
                .find(|(key, _)| crate::config::key_owner(key) == owner)
                .map(|(_, policy)| policy)
        });
        let seconds = own
            .approval_timeout_s
            .or(config.permissions.approval_timeout_s)
            .unwrap_or(DEFAULT_APPROVAL_TIMEOUT_S);
        let hook_timeout = own
            .hook_timeout_ms
            .or(config.permissions.hook_timeout_ms)
            .unwrap_or(DEFAULT_HOOK_TIMEOUT_MS);
        let key_hook = key.and_then(|key| {
            let timeout = key.hook_timeout_ms.unwrap_or(DEFAULT_HOOK_TIMEOUT_MS);
            key.hook_url
                .clone()
                .map(|url| (url, Duration::from_millis(timeout)))
        });
        let trust_hints = own.trust_read_only_hints != Some(false)
            && key.is_none_or(|key| key.trust_read_only_hints != Some(false));
        Gate {
            session: compiled(&own, "the session's"),
            key: key.map(|key| compiled(key, "the API key's")),
            timeout: Duration::from_secs(seconds),
            hook: own
                .hook_url
                .clone()
                .map(|url| (url, Duration::from_millis(hook_timeout))),
            key_hook,
            trust_hints,
            working_dir: options
                .working_dir
                .clone()
                .unwrap_or_else(|| WORKSPACE.into()),
            on_behalf_of: None,
        }
    }

    /// The same gate for a turn run for another session (a deliberation
    /// agent's, a pipeline node's): its waiting calls name that session
    /// and the agent.
    pub fn on_behalf_of(mut self, parent: Option<OnBehalfOf>) -> Gate {
        self.on_behalf_of = parent;
        self
    }

    /// Whether nothing that changes state may run (the model is told).
    pub fn plans(&self) -> bool {
        self.session.mode == Mode::Plan || self.key.as_ref().is_some_and(|k| k.mode == Mode::Plan)
    }

    /// What the permissions say about a call: the session's, made
    /// stricter by the key's (a plain check, no await).
    fn verdict(&self, call: &ToolCall, read_only: bool) -> Verdict {
        self.verdicts(call, read_only).0
    }

    /// The stricter verdict, and whether the key's policy asks about the
    /// call (then only the key's hook or a person may answer it).
    fn verdicts(&self, call: &ToolCall, read_only: bool) -> (Verdict, bool) {
        let view = self.call_view(call, read_only);
        let own = self.session.verdict(&view);
        match &self.key {
            Some(key) => {
                let floor = key.verdict(&view);
                let key_asks = matches!(floor, Verdict::Ask(_));
                (own.stricter(floor), key_asks)
            }
            None => (own, false),
        }
    }

    /// Whether `call` only reads: every offered tool of its name says so
    /// (a name is one tool: external servers cannot take a built-in's
    /// namespace), and an external server's hint counts only where the
    /// policies trust hints.
    fn read_only(&self, call: &ToolCall, tools: &[ToolSpec]) -> bool {
        let mut named = tools.iter().filter(|t| t.name == call.name).peekable();
        let declared = named.peek().is_some() && named.all(|t| t.read_only);
        declared
            && (self.trust_hints || crate::agent::READ_ONLY_TOOLS.contains(&call.name.as_str()))
    }

    fn call_view<'a>(&'a self, call: &'a ToolCall, read_only: bool) -> PolicyCall<'a> {
        PolicyCall {
            tool: &call.name,
            input: &call.arguments,
            read_only,
            working_dir: &self.working_dir,
            resolved: call.arguments.get(EXPECT_PATH).and_then(Value::as_str),
        }
    }

    /// Whether a rule of either policy reads `tool`'s input: then a file
    /// tool's path is resolved in the sandbox before the check.
    /// `Glob` and `Grep` are resolved under `Read`'s rules too: what they
    /// find is filtered by them ([`paths::hide_denied`]).
    pub(super) fn reads_paths(&self, tool: &str) -> bool {
        let reads = |tool: &str| {
            self.session.reads_input_of(tool)
                || self.key.as_ref().is_some_and(|k| k.reads_input_of(tool))
        };
        path_argument(tool).is_some()
            && (reads(tool) || (matches!(tool, "Glob" | "Grep") && reads("Read")))
    }

    /// Whether a deny rule of either policy covers `path` for `tool` or for
    /// `Read` (what `Glob` and `Grep` leave out of what they found).
    pub(super) fn hides(&self, tool: &str, path: &str) -> bool {
        let policies = std::iter::once(&self.session).chain(self.key.as_ref());
        let read = serde_json::json!({"file_path": path});
        let found = serde_json::json!({"path": path});
        policies.into_iter().any(|policy| {
            [("Read", &read), (tool, &found)]
                .into_iter()
                .any(|(tool, input)| {
                    policy
                        .denying_rule(&PolicyCall {
                            tool,
                            input,
                            read_only: true,
                            working_dir: &self.working_dir,
                            resolved: None,
                        })
                        .is_some()
                })
        })
    }

    /// `call` with a decision's edited `input`, once it fits the tool's
    /// schema and no deny rule matches it (a person's approval answers an
    /// ask, never a deny).
    fn edited(
        &self,
        call: &ToolCall,
        input: Value,
        schema: &Value,
        read_only: bool,
    ) -> Result<ToolCall, EditRefused> {
        let checked = super::coerce::coerce(input, schema, false)
            .map_err(|e| EditRefused::Unfit(format!("{}: {e}", call.name)))?;
        let edited = ToolCall {
            arguments: checked.arguments,
            ..call.clone()
        };
        match self.verdict(&edited, read_only) {
            Verdict::Deny(reason) => Err(EditRefused::Denied(reason)),
            _ => Ok(edited),
        }
    }
}

/// Why an edited input cannot run.
enum EditRefused {
    /// It does not fit the tool's schema.
    Unfit(String),
    /// A deny rule (or `plan`) refuses it.
    Denied(String),
}

impl EditRefused {
    fn into_message(self) -> String {
        match self {
            EditRefused::Unfit(e) | EditRefused::Denied(e) => e,
        }
    }
}

/// What becomes of a call.
pub(super) enum Gated {
    Run(ToolCall),
    /// It does not run; the model reads why.
    Refused(String),
}

/// Decides whether `call` (named and checked against its schema) runs,
/// waiting for a decision where the permissions ask for one. A file tool's
/// path is checked where it leads in the sandbox as well as as given, and
/// again once a decision edited it.
pub(super) async fn gate(
    deps: &TurnDeps,
    session: &Arc<Session>,
    gate: &Gate,
    ctx: &ToolContext,
    mut call: ToolCall,
    tools: &[ToolSpec],
    cancel: &CancellationToken,
) -> Result<Gated, StoreError> {
    if let Err(why) = resolve(deps, ctx, gate, &mut call, cancel).await {
        return Ok(Gated::Refused(format!("not run: {why}")));
    }
    let asked = call.arguments.clone();
    let gated = decide(deps, session, gate, call, tools, cancel).await?;
    let Gated::Run(mut call) = gated else {
        return Ok(gated);
    };
    if call.arguments == asked {
        return Ok(Gated::Run(call));
    }
    // An edited input: where its path leads is checked against the deny
    // rules before it runs.
    if let Some(arguments) = call.arguments.as_object_mut() {
        arguments.remove(EXPECT_PATH);
    }
    if let Err(why) = resolve(deps, ctx, gate, &mut call, cancel).await {
        return Ok(Gated::Refused(format!("not run: {why}")));
    }
    let read_only = gate.read_only(&call, tools);
    match gate.verdict(&call, read_only) {
        Verdict::Deny(reason) => Ok(Gated::Refused(format!(
            "not run: the edited input is denied: {reason}"
        ))),
        _ => Ok(Gated::Run(call)),
    }
}

/// The permissions' verdict, then the remembered rules, the hook or a
/// person.
async fn decide(
    deps: &TurnDeps,
    session: &Arc<Session>,
    gate: &Gate,
    call: ToolCall,
    tools: &[ToolSpec],
    cancel: &CancellationToken,
) -> Result<Gated, StoreError> {
    let read_only = gate.read_only(&call, tools);
    let (verdict, key_asks) = gate.verdicts(&call, read_only);
    let reason = match verdict {
        Verdict::Allow => return Ok(Gated::Run(call)),
        Verdict::Deny(reason) => return Ok(Gated::Refused(format!("not run: {reason}"))),
        Verdict::Ask(reason) => reason,
    };
    // A rule a decision remembered answers what the session asks, never
    // what the key's floor asks.
    let remembered = if key_asks {
        Vec::new()
    } else {
        deps.approvals.remembered(session.id).await?
    };
    if !remembered.is_empty() {
        let rules = remembered
            .iter()
            .filter_map(|r| Rule::parse(r).ok())
            .collect();
        if Policy::allowing(rules).allows(&gate.call_view(&call, read_only)) {
            return Ok(Gated::Run(call));
        }
    }
    let hook = if key_asks { &gate.key_hook } else { &gate.hook };
    if let Some((url, timeout)) = hook {
        let asked = HookCall {
            session_id: session.id,
            call_id: &call.id,
            tool: &call.name,
            input: &call.arguments,
            reason: &reason,
        };
        match deps.hooks.consult(url, asked, *timeout).await {
            Ok(Some(decision)) => {
                let decided = Decided {
                    decision,
                    by: "hook".into(),
                };
                return apply(deps, session, gate, call, tools, decided).await;
            }
            Ok(None) => {}
            Err(why) => {
                session.emit(EventKind::Status {
                    message: format!(
                        "The permission hook was not asked about call {}: {why}. The call waits for a decision.",
                        call.id
                    ),
                })?;
            }
        }
    }
    wait(
        deps,
        session,
        gate,
        (call, read_only),
        tools,
        reason,
        cancel,
    )
    .await
}

/// Stores the call as pending, says so, and waits for a decision, the
/// timeout, or the turn's end.
async fn wait(
    deps: &TurnDeps,
    session: &Arc<Session>,
    gate: &Gate,
    (call, read_only): (ToolCall, bool),
    tools: &[ToolSpec],
    reason: String,
    cancel: &CancellationToken,
) -> Result<Gated, StoreError> {
    let now = Utc::now();
    let expires_at =
        now + chrono::TimeDelta::from_std(gate.timeout).unwrap_or(chrono::TimeDelta::seconds(300));
    let schema = schema_of(&call, tools).clone();
    let pending = Pending {
        session_id: session.id,
        call_id: call.id.clone(),
        tool: call.name.clone(),
        input: call.arguments.clone(),
        reason: reason.clone(),
        requested_at: now,
        expires_at,
        read_only,
        agent_id: gate.on_behalf_of.as_ref().map(|o| o.agent_id.clone()),
        parent_id: gate.on_behalf_of.as_ref().map(|o| o.parent),
        schema,
    };
    let owner = session.owner.as_deref();
    let mut waiting = deps.approvals.request(owner, &pending).await?;
    session.emit(EventKind::ApprovalRequested {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        input: call.arguments.clone(),
        reason,
        expires_at,
    })?;
    let ended = tokio::select! {
        biased;
        decided = &mut waiting.decided => {
            deps.approvals.done(session.id, &call.id);
            return match decided {
                Ok(decided) => apply(deps, session, gate, call, tools, decided).await,
                Err(_) => Ok(Gated::Refused("not run: its decision was lost".into())),
            };
        }
        _ = cancel.cancelled() => "interrupt",
        _ = tokio::time::sleep(gate.timeout) => "timeout",
    };
    let withdrawn = deps.approvals.withdraw(&waiting).await;
    deps.approvals.done(session.id, &call.id);
    if !withdrawn? {
        // A decision claimed the call first: it is on its way.
        if let Ok(Ok(decided)) = tokio::time::timeout(CLAIMED_GRACE, waiting.decided).await
            && ended == "timeout"
        {
            return apply(deps, session, gate, call, tools, decided).await;
        }
    }
    let (message, why) = if ended == "timeout" {
        let seconds = gate.timeout.as_secs();
        (
            format!("no decision within {seconds} s"),
            format!(
                "not run: it needed a person's approval and none came within {seconds} s (approval_timeout_s); \
                 it was denied"
            ),
        )
    } else {
        (
            "the turn was stopped".to_string(),
            "not run: the turn was stopped while the call waited for approval".to_string(),
        )
    };
    session.emit(EventKind::ApprovalDecided {
        call_id: call.id.clone(),
        decision: Approval::Deny,
        by: ended.into(),
        message: Some(message),
        input: None,
        remembered: None,
    })?;
    Ok(Gated::Refused(why))
}

/// Carries out a decision: says it, remembers its rule, runs an edited
/// input once it fits the schema and the deny rules.
async fn apply(
    deps: &TurnDeps,
    session: &Arc<Session>,
    gate: &Gate,
    call: ToolCall,
    tools: &[ToolSpec],
    decided: Decided,
) -> Result<Gated, StoreError> {
    let Decided { decision, by } = decided;
    let allow = decision.decision == Approval::Allow;
    let remembered = match (&decision.remember, allow) {
        (Some(Remember::Session), true) => {
            let rule = decision.rule.clone().unwrap_or_else(|| call.name.clone());
            match Rule::parse(&rule) {
                Ok(_) => {
                    deps.approvals.remember(session.id, &rule).await?;
                    Some(rule)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a remembered rule that does not parse");
                    None
                }
            }
        }
        _ => None,
    };
    session.emit(EventKind::ApprovalDecided {
        call_id: call.id.clone(),
        decision: decision.decision,
        by: by.clone(),
        message: decision.message.clone(),
        input: decision.input.clone(),
        remembered,
    })?;
    if !allow {
        let told = decision
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_else(|| " (no reason given)".into());
        return Ok(Gated::Refused(format!(
            "not run: the call was denied by the {by}{told}"
        )));
    }
    let Some(input) = decision.input else {
        return Ok(Gated::Run(call));
    };
    let read_only = gate.read_only(&call, tools);
    match gate.edited(&call, input, schema_of(&call, tools), read_only) {
        Ok(edited) => Ok(Gated::Run(edited)),
        Err(EditRefused::Unfit(e)) => Ok(Gated::Refused(format!(
            "not run: the input the {by} gave does not fit the tool: {e}"
        ))),
        Err(EditRefused::Denied(reason)) => Ok(Gated::Refused(format!(
            "not run: the input the {by} gave is denied: {reason}"
        ))),
    }
}

/// The input schema of the offered tool a call names.
fn schema_of<'a>(call: &ToolCall, tools: &'a [ToolSpec]) -> &'a Value {
    static NONE: Value = Value::Null;
    tools
        .iter()
        .find(|t| t.name == call.name)
        .map_or(&NONE, |t| &*t.input_schema)
}

/// Checks an edited input before a decision claims its call: it must fit
/// the tool's schema, and no rule may deny it. The error says why not.
pub fn check_edited(
    config: &AgentConfig,
    options: &AgentOptions,
    owner: Option<&str>,
    pending: &Pending,
    input: &serde_json::Value,
) -> Result<(), String> {
    let call = ToolCall {
        id: pending.call_id.clone(),
        name: pending.tool.clone(),
        arguments: pending.input.clone(),
    };
    Gate::new(config, options, owner)
        .edited(&call, input.clone(), &pending.schema, pending.read_only)
        .map(drop)
        .map_err(EditRefused::into_message)
}
