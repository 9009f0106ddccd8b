//! The server's side of `conclave-exec`, the resident exec helper a
//! docker sandbox runs as its main process and a warm local sandbox in its
//! namespaces (its protocol is documented in `src/bin/conclave-exec.rs`).
//!
//! An exec is then one line written on a channel that is already open,
//! and its output comes back as lines on the same one, told apart by the
//! run's id. Each backend opens the channel its own way (docker's attach
//! stream, a local sandbox's pipes) and hands it to [`Agent::new`].
//!
//! Layout: `client`: [`Agent`] and [`exec`], one run from request to
//! status; `replies`: the reader that routes replies to their runs and
//! holds the sandbox's side of the stream to bounded memory and CPU.

mod client;
mod replies;

pub use self::client::{Agent, exec, takes};
pub use self::replies::{Output, Pacing};

/// The helper, compiled by `build.rs` as a static binary.
pub static HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/conclave-exec"));

/// Warns that runs of `sandbox` are not sealed off from its helper's
/// channel, where the helper answered `landlock` 0.
pub fn warn_unsealed(sandbox: &str, landlock: u32) {
    if landlock == 0 {
        tracing::warn!(
            %sandbox,
            "no Landlock for the exec helper's runs: processes in this sandbox can \
             write to its channel (forge command output) and read the server's requests"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_is_embedded_and_static() {
        // A 64-bit ELF executable with no program interpreter (PT_INTERP),
        // so any image can run it whatever its C library.
        assert_eq!(&HELPER[..5], b"\x7fELF\x02");
        let u16_at = |at: usize| usize::from(u16::from_le_bytes([HELPER[at], HELPER[at + 1]]));
        let offset = u64::from_le_bytes(HELPER[0x20..0x28].try_into().unwrap()) as usize;
        let (size, count) = (u16_at(0x36), u16_at(0x38));
        assert!(count > 0);
        for header in 0..count {
            let at = offset + header * size;
            let kind = u32::from_le_bytes(HELPER[at..at + 4].try_into().unwrap());
            assert_ne!(kind, 3, "the helper asks for a dynamic loader");
        }
    }
}
