//! CPU accounting for the benches that show where a run's time goes: a
//! process's CPU time from `/proc`, the local broker's process, the load.

use std::time::Duration;

/// The user + system CPU time in a `getrusage`/`wait4` record.
pub fn rusage_cpu(u: &libc::rusage) -> Duration {
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time (user + system) of this process (`RUSAGE_SELF`) or of the
/// children it has waited for (`RUSAGE_CHILDREN`).
pub fn rusage(who: libc::c_int) -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    rusage_cpu(&u)
}

/// The broker's process when the AMQP URL `raw_url` names this machine
/// (127.0.0.1 or localhost) and its listener is found (see
/// [`listener_pid`]).
pub fn local_broker_pid(raw_url: &str) -> Option<u32> {
    let url = dlqctl::BrokerUrl::parse(raw_url).ok()?;
    if !matches!(url.host(), "127.0.0.1" | "localhost") {
        return None;
    }
    let port = url.endpoint().rsplit(':').next()?.parse().ok()?;
    listener_pid(port)
}

/// CPU time (user + system) of a process, from `/proc/PID/stat`.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After `(comm) `: field 3 (state) onwards; utime and stime are the
    // 14th and 15th fields of the line.
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(Duration::from_secs_f64(ticks / hz))
}

/// The process listening on 127.0.0.1 or 0.0.0.0 at `port` (the broker,
/// when it runs on this machine and this user may read its `/proc`).
pub fn listener_pid(port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
        (local_port == port && *f.get(3)? == "0A").then(|| f.get(9).map(|s| s.to_string()))?
    })?;
    let wanted = format!("socket:[{inode}]");
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = proc_dir.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_dir.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

/// The load averages (1, 5, 15 minutes), as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
