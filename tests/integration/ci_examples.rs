//! The CI examples in `docs/ci/` read as YAML (with serde-saphyr, as the
//! topology files are) and have the structure their comments promise: a
//! check on pull / merge requests against a RabbitMQ service (validate,
//! provision on the fresh broker, then `--check`), and a provision on the
//! default branch. No broker needed.

use crate::support::{read_yaml as read, strings};
use serde_json::Value;

/// The index of the first command containing every one of `parts`, and
/// none of `absent`.
fn position(commands: &[&str], parts: &[&str], absent: &[&str]) -> Option<usize> {
    commands
        .iter()
        .position(|c| parts.iter().all(|p| c.contains(p)) && !absent.iter().any(|a| c.contains(a)))
}

/// Asserts that `commands` validate, then provision without `--check`,
/// then run `dlqctl provision --check --format FORMAT`, in that order.
#[track_caller]
fn assert_validate_provision_check(commands: &[&str], format: &str) {
    let validate = position(commands, &["dlqctl validate"], &[]).expect("validate");
    let provision = position(commands, &["dlqctl provision"], &["--check"]).expect("provision");
    let check = ["dlqctl provision", "--check", &format!("--format {format}")];
    let checked = position(commands, &check, &[])
        .unwrap_or_else(|| panic!("provision --check --format {format}"));
    assert!(validate < provision && provision < checked, "{commands:?}");
}

/// The topology the example names exists in this repository.
fn assert_topology_exists(v: &Value) {
    let topology = v["TOPOLOGY"].as_str().expect("TOPOLOGY is set");
    let full = format!("{}/{topology}", env!("CARGO_MANIFEST_DIR"));
    assert!(std::path::Path::new(&full).is_file(), "{full}");
}

#[test]
fn github_actions_example_checks_pull_requests_and_provisions_main() {
    let w = read("docs/ci/github-actions.yml");
    let on = &w["on"];
    assert!(on.get("pull_request").is_some(), "on: {on}");
    assert_eq!(strings(&on["push"]["branches"]), vec!["main"], "on: {on}");
    assert_topology_exists(&w["env"]);

    let jobs = w["jobs"].as_object().expect("jobs");
    let runs = |job: &Value| -> Vec<String> {
        job["steps"]
            .as_array()
            .unwrap_or_else(|| panic!("a job without steps: {job}"))
            .iter()
            .filter_map(|s| s["run"].as_str().map(str::to_string))
            .collect()
    };
    for (name, job) in jobs {
        let steps = runs(job);
        assert!(
            steps.iter().any(|r| r.contains("cargo install --locked")),
            "job {name} does not install dlqctl"
        );
    }

    // The self-contained pull-request check: a RabbitMQ service, then
    // validate, provision on it, and --check --format github, in order.
    let check = jobs
        .values()
        .find(|j| j.get("services").is_some())
        .expect("a job with a service container");
    assert!(
        check["if"].as_str().unwrap_or("").contains("pull_request"),
        "{check}"
    );
    let service = check["services"]
        .as_object()
        .and_then(|s| s.values().next())
        .expect("a service");
    assert_eq!(service["image"], "rabbitmq:4.0-management");
    let steps = runs(check);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    assert_validate_provision_check(&steps, "github");

    // On push: provision, no check.
    let deploy = jobs
        .values()
        .find(|j| j["if"].as_str().unwrap_or("").contains("'push'"))
        .expect("a job on push");
    let steps = runs(deploy);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    assert!(
        position(&steps, &["dlqctl provision"], &["--check"]).is_some(),
        "{steps:?}"
    );
}

#[test]
fn gitlab_ci_example_checks_merge_requests_and_provisions_the_default_branch() {
    let ci = read("docs/ci/gitlab-ci.yml");
    let top = ci.as_object().expect("a mapping");
    assert_topology_exists(&ci["variables"]);
    let template = &ci[".dlqctl"];
    assert!(
        strings(&template["before_script"])
            .iter()
            .any(|c| c.contains("cargo install --locked")),
        "{template}"
    );
    let jobs: Vec<&Value> = top
        .iter()
        .filter(|(k, v)| !k.starts_with('.') && v.get("script").is_some())
        .map(|(_, v)| v)
        .collect();
    let rule = |job: &Value, needle: &str| {
        job["rules"].as_array().is_some_and(|r| {
            r.iter()
                .any(|r| r["if"].as_str().unwrap_or("").contains(needle))
        })
    };

    let check = jobs
        .iter()
        .find(|j| j.get("services").is_some())
        .expect("a job with services");
    assert!(rule(check, "merge_request_event"), "{check}");
    assert_eq!(check["extends"], ".dlqctl");
    let service = &check["services"][0];
    let image = service["name"].as_str().or(service.as_str());
    assert_eq!(image, Some("rabbitmq:4.0-management"), "{service}");
    let script = strings(&check["script"]);
    assert_validate_provision_check(&script, "text");

    let deploy = jobs
        .iter()
        .find(|j| rule(j, "$CI_DEFAULT_BRANCH"))
        .expect("a job on the default branch");
    let script = strings(&deploy["script"]);
    assert!(
        position(&script, &["dlqctl provision"], &["--check"]).is_some(),
        "{script:?}"
    );
    assert!(deploy.get("services").is_none(), "{deploy}");
}

/// The post-deploy example runs `doctor`, then `drill` on the pipeline it
/// names, against the staging broker's secrets, after the deploy workflow
/// succeeds.
#[test]
fn post_deploy_example_runs_doctor_then_drill_after_a_deploy() {
    let w = read("docs/ci/post-deploy.yml");
    assert!(w["on"].get("workflow_dispatch").is_some(), "{}", w["on"]);
    assert_eq!(
        strings(&w["on"]["workflow_run"]["workflows"]),
        vec!["rabbitmq-topology"],
        "the workflow of docs/ci/github-actions.yml"
    );
    assert_eq!(
        read("docs/ci/github-actions.yml")["name"],
        "rabbitmq-topology"
    );
    assert_topology_exists(&w["env"]);
    let job = &w["jobs"]["prove"];
    assert!(job["env"]["AMQP_URL"]
        .as_str()
        .unwrap_or_default()
        .contains("secrets."));
    let runs: Vec<&str> = job["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect();
    let install = position(&runs, &["cargo install --locked"], &[]).expect("installs dlqctl");
    let doctor = position(&runs, &["dlqctl doctor", "--format github"], &[]).expect("doctor");
    let drill =
        position(&runs, &["dlqctl drill", "--queue", "--format github"], &[]).expect("drill");
    assert!(install < doctor && doctor < drill, "{runs:?}");
}

/// No example names a placeholder repository (`github.com/OWNER/dlqctl`):
/// each takes dlqctl's git URL from a CI variable, and its install step
/// stops with that advice when the variable is unset.
#[test]
fn every_ci_example_installs_from_a_variable_not_a_placeholder() {
    for file in [
        "docs/ci/github-actions.yml",
        "docs/ci/gitlab-ci.yml",
        "docs/ci/post-deploy.yml",
    ] {
        let text = std::fs::read_to_string(crate::support::repo(file)).expect(file);
        assert!(!text.contains("OWNER"), "{file} names a placeholder");
        let installs: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("cargo install") && !l.trim_start().starts_with('#'))
            .collect();
        assert!(!installs.is_empty(), "{file}: no install step");
        for line in installs {
            assert!(
                line.contains("--git \"${DLQCTL_GIT:?set the"),
                "{file}: {line}"
            );
        }
    }
    let w = read("docs/ci/post-deploy.yml");
    assert_eq!(w["env"]["DLQCTL_GIT"], "${{ vars.DLQCTL_GIT }}");
}
