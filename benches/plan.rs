//! `cargo bench --bench plan`: validating and planning big topologies, the
//! pure core alone (no broker). Prints figures; asserts nothing. The goal
//! is under 1 s for 20,000 pipelines (it took 33 s when the plan
//! de-duplicated by scanning).

use dlqctl::core::topology::{parse_topology, plan};
use std::time::Instant;

fn many_pipelines(n: usize) -> String {
    let mut y = String::from("version: 1\npipelines:\n");
    for i in 0..n {
        y += &format!(
            "  - name: p{i}\n    exchange: {{name: shared, type: topic, bindings: [\"k.{i}\"]}}\n"
        );
    }
    y
}

fn many_delays(n: usize) -> String {
    let delays: Vec<String> = (1..=n).map(|d| format!("{d}ms")).collect();
    format!(
        "version: 1\npipelines:\n  - name: many\n    retry:\n      max_attempts: {}\n      delays: [{}]\n",
        n + 1,
        delays.join(", ")
    )
}

fn time(what: &str, yaml: &str) {
    let start = Instant::now();
    let t = parse_topology(yaml, "bench.yaml").expect("a valid topology");
    let parsed = start.elapsed();
    let p = plan(&t);
    let total = start.elapsed();
    println!(
        "{what:<40} {:>8.3} s parse+validate {:>8.3} s plan {:>8.3} s total  ({} objects, {} KiB of YAML)",
        parsed.as_secs_f64(),
        (total - parsed).as_secs_f64(),
        total.as_secs_f64(),
        p.len(),
        yaml.len() / 1024
    );
}

fn main() {
    // `cargo test --all-targets` and nextest run this binary as a test.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    time(
        "20,000 pipelines, one shared exchange",
        &many_pipelines(20_000),
    );
    time("one pipeline with 100,000 delays", &many_delays(100_000));
}
