//! Compiles the docker sandbox's exec helper (`src/bin/conclave-exec.rs`)
//! as a static binary that the server embeds and sends into each container
//! (see `src/sandbox/docker/agent.rs`). It uses std only, so rustc alone
//! builds it; static linking makes it run in any Linux image, whatever its
//! C library.
//!
//! It also generates the gRPC service of `proto/` with protox, a protobuf
//! compiler in Rust, so a build needs no `protoc` installed.

// A build script reports what cargo failed to give it by panicking.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/bin/conclave-exec.rs";

fn main() {
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-changed=proto");
    let descriptors = protox::compile(["proto/bus.proto", "proto/orchestrator.proto"], ["proto"])
        .unwrap_or_else(|err| panic!("proto/: {err}"));
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)
        .unwrap_or_else(|err| panic!("generating the gRPC code: {err}"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let binary = out.join("conclave-exec");
    let status = Command::new(&rustc)
        .args([
            "--edition",
            "2024",
            "--crate-type",
            "bin",
            "--crate-name",
            "conclave_exec",
        ])
        .args([
            "-C",
            "opt-level=s",
            "-C",
            "panic=abort",
            "-C",
            "strip=symbols",
        ])
        .args(["-C", "target-feature=+crt-static", "--target", &target])
        .arg("-o")
        .arg(&binary)
        .arg(SOURCE)
        .status()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", rustc.to_string_lossy()));
    assert!(
        status.success(),
        "compiling {SOURCE} as a static binary failed"
    );
}
