//! The tmpfs mounts the server makes on the host for sandboxes: a local
//! sandbox's `/workspace` and `/tmp`, and the tmpfs under a layered
//! workspace's upper layer (`crate::sandbox::layers::cow`), each sized to
//! hold a disk limit.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Mounts a tmpfs on `dir` with `options` (`mode=…,size=…` as mount(8)
/// takes them), unless one is there already (a sandbox reopened after a
/// server restart keeps its files).
pub(crate) fn mount_tmpfs(dir: &Path, options: &str) -> io::Result<()> {
    let parent = dir.parent().unwrap_or(dir);
    if fs::metadata(dir)?.dev() != fs::metadata(parent)?.dev() {
        return Ok(());
    }
    let target = CString::new(dir.as_os_str().as_bytes())?;
    let options = CString::new(options)?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes free on the file system holding `path`.
pub(crate) fn free_bytes(path: &Path) -> io::Result<u64> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Sets the size of the tmpfs mounted at `dir` (a remount).
pub(crate) fn resize_tmpfs(dir: &Path, bytes: u64) -> io::Result<()> {
    let target = CString::new(dir.as_os_str().as_bytes())?;
    let options = CString::new(format!("size={bytes}"))?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
