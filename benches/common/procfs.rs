//! CPU time and context switches from Linux's `/proc`, shared by the
//! benchmarks that measure server processes beside the machine.
#![allow(dead_code)]

use std::fmt::Display;
use std::time::Duration;

/// Linux reports `/proc` CPU times in USER_HZ, 100 on x86 and arm.
const USER_HZ: u64 = 100;

/// User plus system CPU time of a process (`self` or a pid), threads that
/// have exited included: fields 14 and 15 of `/proc/PID/stat`.
pub fn cpu_time(pid: impl Display) -> Result<Duration, String> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The fields after the parenthesised command name start at field 3.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let mut ticks = 0;
    for field in after_name.split_whitespace().skip(11).take(2) {
        ticks += field.parse::<u64>().map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// The context switches of a process's threads, voluntary (waiting for
/// something: a wake-up follows) and not, from each thread's
/// `/proc/PID/task/TID/status`; (0, 0) for a process that is gone.
pub fn switches(pid: impl Display) -> (u64, u64) {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let mut counts = (0, 0);
    for thread in threads.flatten() {
        let status = std::fs::read_to_string(thread.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            let count = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|n| n.trim().parse::<u64>().ok())
            };
            if let Some(n) = count("voluntary_ctxt_switches:") {
                counts.0 += n;
            } else if let Some(n) = count("nonvoluntary_ctxt_switches:") {
                counts.1 += n;
            }
        }
    }
    counts
}

/// The whole machine's busy and total ticks over every core, from the
/// first line of `/proc/stat` (idle and iowait are its fields 4 and 5):
/// other work on the machine shows here.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let first_line = stat.lines().next().unwrap_or_default();
    let ticks: Vec<u64> = first_line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle: u64 = ticks.get(3..5).map_or(0, |idle| idle.iter().sum());
    (total - idle, total)
}
