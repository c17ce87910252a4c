//! What the benches that start their own runtime share: the `--bench`
//! gate, the runtime, and their numeric settings.

use std::future::Future;
use std::str::FromStr;

/// Runs `run` on a multi-thread runtime when `cargo bench` runs this
/// binary (it passes `--bench`). `cargo test --all-targets` and nextest
/// (`--list ...`) run bench binaries as tests too: then nothing is run and
/// this returns `None`.
pub fn bench_main<F: Future>(run: F) -> Option<F::Output> {
    if !std::env::args().any(|a| a == "--bench") {
        return None;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    Some(runtime.block_on(run))
}

/// The number in environment variable `name`, or `default` when it is
/// unset or not a number.
pub fn env_number<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
