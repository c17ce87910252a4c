//! Pinning the broker and the bench to CPUs of their own.

/// A split of the machine's CPUs between the broker and this process (with
/// every process it starts): the broker on the first CPU, the rest here,
/// as when the client runs on a host of its own. Made with `taskset -a`
/// (util-linux) on every thread of both; the broker's own mask comes back
/// when this is dropped (also on a panic).
pub struct Pinned {
    broker: u32,
    mask: String,
}

impl Pinned {
    /// Pins, or says why not.
    pub fn split(broker: u32) -> Result<Pinned, String> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            return Err(format!("{cpus} CPU: nothing to split"));
        }
        let out = std::process::Command::new("taskset")
            .args(["-p", &broker.to_string()])
            .output()
            .map_err(|e| format!("taskset: {e}"))?;
        let mask = String::from_utf8_lossy(&out.stdout)
            .rsplit(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        if !out.status.success() || mask.is_empty() {
            return Err(format!(
                "taskset -p {broker}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let set = |pid: u32, cpus: &str| {
            std::process::Command::new("taskset")
                .args(["-a", "-c", "-p", cpus, &pid.to_string()])
                .output()
                .map_err(|e| format!("taskset: {e}"))
                .and_then(|o| {
                    o.status.success().then_some(()).ok_or_else(|| {
                        format!("taskset -p {pid}: {}", String::from_utf8_lossy(&o.stderr))
                    })
                })
        };
        set(broker, "0")?;
        let pinned = Pinned { broker, mask };
        set(std::process::id(), &format!("1-{}", cpus - 1))?;
        Ok(pinned)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = std::process::Command::new("taskset")
            .args(["-a", "-p", &self.mask, &self.broker.to_string()])
            .output();
    }
}
