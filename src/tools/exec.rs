//! `execute_code`, `execute_shell`, and the runs `execute_shell` starts in
//! the background.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::background::{RunList, RunView};
use super::output::{Progress, Reporter};
use super::schema::{ExecResult, ExecuteCode, ExecuteShell};
use super::{Invocation, ToolError, Toolbox, lossy};
use crate::agent::tools::STATUS_STREAM;
use crate::sandbox::proxy::Follow;
use crate::sandbox::secrets::Scrubber;
use crate::sandbox::{ExecRequest, WORKSPACE, exec_collect};
use crate::telemetry::spans;

/// Runs Python from stdin as a notebook cell (the last expression's value
/// is printed); with `--repair`, after the repairs it names.
const PYTHON_CELL: &str = include_str!("cell.py");

/// Runs a program (Python as a notebook cell, or a shell script) to its end.
pub async fn execute_code(
    tools: &Toolbox,
    call: &Invocation,
    args: ExecuteCode,
) -> Result<ExecResult, ToolError> {
    let interpreter = match args.language.as_deref().unwrap_or("python") {
        "python" | "python3" | "py" => "python3",
        "bash" => "bash",
        "sh" | "shell" => "sh",
        other => {
            return Err(ToolError(format!(
                "language '{other}' is not supported; use python, bash or sh"
            )));
        }
    };
    let mut command = match interpreter {
        "python3" => vec!["python3".into(), "-c".into(), PYTHON_CELL.into()],
        shell => vec![shell.to_string(), "-".to_string()],
    };
    if args.repair && interpreter == "python3" {
        command.push("--repair".into());
    }
    run(
        tools,
        call,
        command,
        Some(Bytes::from(args.code)),
        args.timeout,
    )
    .await
}

/// Runs a shell command line to its end, or starts it in the background.
pub async fn execute_shell(
    tools: &Toolbox,
    call: &Invocation,
    args: ExecuteShell,
) -> Result<ExecResult, ToolError> {
    let command = vec!["/bin/sh".into(), "-c".into(), args.command.clone()];
    if !args.background {
        return run(tools, call, command, None, args.timeout).await;
    }
    let timeout = tools.timeout(Some(args.timeout.unwrap_or(tools.max_timeout_s())))?;
    let lease = tools.lease(&call.place).await?;
    let request = ExecRequest {
        command,
        stdin: None,
        timeout,
        workdir: WORKSPACE.into(),
        env: call.place.env().clone(),
    };
    let run = tools
        .background
        .start(call.place.runs_key(), args.command, lease, request)
        .map_err(ToolError)?;
    Ok(ExecResult {
        status: run.status,
        stdout: String::new(),
        stderr: String::new(),
        exit_code: None,
        duration_ms: 0,
        truncated: false,
        background_id: Some(run.id),
    })
}

/// The background runs of the call's sandbox.
pub async fn list_background(tools: &Toolbox, call: &Invocation) -> Result<RunList, ToolError> {
    // Only a caller that may use the sandbox sees its runs.
    tools.lease(&call.place).await?;
    let mut list = tools.background.list(&call.place.runs_key());
    for run in &mut list.runs {
        scrub_view(call, run);
    }
    Ok(list)
}

/// A run's output tails start where its first bytes were let go, maybe
/// inside a secret.
fn scrub_view(call: &Invocation, run: &mut RunView) {
    let scrubber = call.place.scrubber();
    run.stdout_tail = scrubber.scrub_edges(&run.stdout_tail, true, false);
    run.stderr_tail = scrubber.scrub_edges(&run.stderr_tail, true, false);
}

/// Kills a background run of the call's sandbox, its process tree with it.
pub async fn kill_background(
    tools: &Toolbox,
    call: &Invocation,
    id: &str,
) -> Result<RunView, ToolError> {
    tools.lease(&call.place).await?;
    tools
        .background
        .kill(&call.place.runs_key(), id)
        .await
        .map(|mut run| {
            scrub_view(call, &mut run);
            run
        })
        .ok_or_else(|| ToolError(format!("no background run '{id}'")))
}

/// Runs `command` in the call's sandbox, in the workspace, reporting its
/// output as it comes to whoever follows the call.
async fn run(
    tools: &Toolbox,
    call: &Invocation,
    command: Vec<String>,
    stdin: Option<Bytes>,
    timeout: Option<u64>,
) -> Result<ExecResult, ToolError> {
    let timeout = tools.timeout(timeout.or(call.place.timeout_s))?;
    let lease = tools.lease(&call.place).await?;
    let request = ExecRequest {
        command,
        stdin: stdin.map(Into::into),
        timeout,
        workdir: WORKSPACE.into(),
        env: call.place.env().clone(),
    };
    let scrubber = call.place.scrubber();
    let reporter = call
        .output
        .clone()
        .map(|to| Reporter::start(to, scrubber.clone()));
    // Refusals of the sandbox's egress proxy while the command runs.
    let refusals = match (&call.output, tools.sandboxes.proxy()) {
        (Some(to), Some(proxy)) if call.place.spec().egress.is_some() => Some(tell_refusals(
            proxy.follow(lease.sandbox.id()),
            to.clone(),
            scrubber.clone(),
        )),
        _ => None,
    };
    let session = call.place.session_id().map(|id| id.to_string());
    let span = spans::exec(
        tools.sandboxes.backend_name(),
        lease.sandbox.id(),
        session.as_deref(),
        &call
            .trace
            .as_ref()
            .map_or(spans::Parent::Current, spans::Parent::Json),
    );
    let collected = span
        .within(exec_collect(
            lease.sandbox.as_ref(),
            request,
            tools.max_output_bytes,
            call.cancel.clone(),
            |chunk| {
                if let Some(reporter) = &reporter {
                    reporter.take(chunk);
                }
            },
        ))
        .await;
    let ended = collected.as_ref().ok();
    spans::exec_ended(&span, ended.map(|(s, _)| (s.exit_code, s.timed_out)));
    if let Some(reporter) = reporter {
        reporter.finish().await;
    }
    if let Some((done, task)) = refusals {
        done.cancel();
        let _ = task.await;
    }
    let (status, out) = collected?;
    let state = if status.timed_out {
        "timeout"
    } else if status.exit_code == Some(0) {
        "success"
    } else {
        "error"
    };
    // Output cut at the limit may end in a piece of a secret.
    let clean = |bytes| scrubber.scrub_edges(&lossy(bytes), false, out.truncated);
    Ok(ExecResult {
        status: state.into(),
        stdout: clean(out.stdout),
        stderr: clean(out.stderr),
        exit_code: status.exit_code,
        duration_ms: status.duration.as_millis() as u64,
        truncated: out.truncated,
        background_id: None,
    })
}

/// Tells `to` each refusal of a followed sandbox's egress proxy as a
/// status note, until the token is cancelled (then what is queued).
fn tell_refusals(
    mut follow: Follow,
    to: Arc<dyn Progress>,
    scrubber: Scrubber,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let done = CancellationToken::new();
    let stop = done.clone();
    let task = tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                received = follow.refusals.recv() => match received {
                    Ok(message) => message,
                    Err(RecvError::Lagged(n)) => format!("egress proxy: {n} more refusals not shown"),
                    Err(RecvError::Closed) => return,
                },
                () = stop.cancelled() => break,
            };
            let _ = to.report(STATUS_STREAM, scrubber.scrub(&message), 0).await;
        }
        while let Ok(message) = follow.refusals.try_recv() {
            let _ = to.report(STATUS_STREAM, scrubber.scrub(&message), 0).await;
        }
    });
    (done, task)
}
