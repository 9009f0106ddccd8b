//! The workspace's file tools: `read_file`, `write_file`, `edit_file`,
//! `list_files`, `glob`, `grep`. Every path is confined to the workspace
//! before the sandbox is touched.

use bytes::Bytes;

use super::schema::{
    Done, EditFile, FileContent, GlobFiles, GrepFiles, ListFiles, Listing, ListingEntry, Matches,
    ReadFile, WriteFile,
};
use super::{Invocation, ToolError, Toolbox, lossy};
use crate::sandbox::{WORKSPACE, files};

/// `path` within the workspace (relative paths start there).
fn confine(path: &str) -> Result<String, ToolError> {
    Ok(files::confine(path, WORKSPACE)?)
}

pub async fn read_file(
    tools: &Toolbox,
    call: &Invocation,
    args: ReadFile,
) -> Result<FileContent, ToolError> {
    let path = confine(&args.path)?;
    let lease = tools.lease(&call.place).await?;
    let expect = args.expect.as_deref();
    let (bytes, truncated) = files::read_expecting(lease.sandbox.as_ref(), &path, expect).await?;
    Ok(FileContent {
        path,
        content: lossy(bytes),
        truncated,
    })
}

pub async fn write_file(
    tools: &Toolbox,
    call: &Invocation,
    args: WriteFile,
) -> Result<Done, ToolError> {
    let path = confine(&args.path)?;
    let lease = tools.lease(&call.place).await?;
    let (count, expect) = (args.content.len(), args.expect.as_deref());
    let data = Bytes::from(args.content);
    files::write_expecting(lease.sandbox.as_ref(), &path, data, expect).await?;
    Ok(Done { path, count })
}

pub async fn edit_file(
    tools: &Toolbox,
    call: &Invocation,
    args: EditFile,
) -> Result<Done, ToolError> {
    let path = confine(&args.path)?;
    let lease = tools.lease(&call.place).await?;
    let count = files::edit(
        lease.sandbox.as_ref(),
        &path,
        &args.old_string,
        &args.new_string,
        args.replace_all,
        args.expect.as_deref(),
    )
    .await?;
    Ok(Done { path, count })
}

pub async fn list_files(
    tools: &Toolbox,
    call: &Invocation,
    args: ListFiles,
) -> Result<Listing, ToolError> {
    let path = confine(args.path.as_deref().unwrap_or(WORKSPACE))?;
    let lease = tools.lease(&call.place).await?;
    let depth = args.depth.unwrap_or(1);
    let (entries, truncated) =
        files::list(lease.sandbox.as_ref(), &path, depth, tools.max_entries).await?;
    Ok(Listing {
        path,
        entries: entries
            .into_iter()
            .map(|e| ListingEntry {
                path: e.path,
                kind: e.kind.into(),
                size: e.size,
            })
            .collect(),
        truncated,
    })
}

pub async fn glob(
    tools: &Toolbox,
    call: &Invocation,
    args: GlobFiles,
) -> Result<Matches, ToolError> {
    let path = confine(args.path.as_deref().unwrap_or(WORKSPACE))?;
    let lease = tools.lease(&call.place).await?;
    let (matches, truncated) = files::glob(
        lease.sandbox.as_ref(),
        &path,
        &args.pattern,
        tools.max_entries,
    )
    .await?;
    Ok(Matches {
        path,
        matches,
        truncated,
    })
}

pub async fn grep(
    tools: &Toolbox,
    call: &Invocation,
    args: GrepFiles,
) -> Result<Matches, ToolError> {
    let path = confine(args.path.as_deref().unwrap_or(WORKSPACE))?;
    let lease = tools.lease(&call.place).await?;
    let (text, truncated) = files::grep(
        lease.sandbox.as_ref(),
        &path,
        &args.pattern,
        args.include.as_deref(),
        args.ignore_case,
        tools.max_output_bytes,
    )
    .await?;
    Ok(Matches {
        path,
        matches: text.lines().map(str::to_string).collect(),
        truncated,
    })
}
