//! The examples each command's `--help` ends with (and its man page shows
//! under EXAMPLES). Each `dlqctl ...` line is a whole command that parses
//! (`super::tests::every_command_has_examples_that_parse`); `#` lines say what
//! the next one does.

/// `dlqctl`.
pub const DLQCTL: &str = "\
Examples:
  # Declare the example topology, then run a handler program per message
  dlqctl provision topology/orders.yaml
  dlqctl work topology/orders.yaml --queue orders -- topology/demo-handler.sh

  # What is in the DLQ, grouped by reason and error
  dlqctl dlq summary topology/orders.yaml --queue orders

  # A command's manual page
  dlqctl man dlq replay | man -l -";

/// `dlqctl validate`.
pub const VALIDATE: &str = "\
Examples:
  # Every problem of the file, as FILE:LINE:COL: message (exit 2)
  dlqctl validate topology/orders.yaml";

/// `dlqctl provision`.
pub const PROVISION: &str = "\
Examples:
  # What would be declared, without a broker
  dlqctl provision topology/orders.yaml --dry-run

  # Declare it: each exchange and queue created or unchanged
  dlqctl provision topology/orders.yaml

  # Compare with the broker, changing nothing (exit 3 on a difference)
  dlqctl provision topology/orders.yaml --check

  # The same in CI, as GitHub Actions annotations
  dlqctl provision topology/orders.yaml --check --format github

  # Against the nodes of a cluster
  dlqctl provision topology/orders.yaml --url amqp://user:pass@rabbit-1,amqp://user:pass@rabbit-2";

/// `dlqctl work`.
pub const WORK: &str = "\
Examples:
  # A program per message, four at a time (exit 0 success, 65 permanent)
  dlqctl work topology/orders.yaml --queue orders --concurrency 4 -- topology/demo-handler.sh

  # POST each message to an HTTP endpoint
  dlqctl work topology/orders.yaml --queue orders --http http://127.0.0.1:8080/orders

  # One long-running Python process, fed messages as JSON lines
  dlqctl work topology/orders.yaml --queue orders --jsonl --concurrency 8 -- python3 examples/handlers/handler.py

  # As a service: metrics, /healthz and /readyz, wait up to 5m for the broker
  dlqctl work topology/orders.yaml --queue orders --metrics-addr 127.0.0.1:9090 --wait-for-broker 5m -- topology/demo-handler.sh";

/// `dlqctl status`.
pub const STATUS: &str = "\
Examples:
  # Every queue's depth and consumers
  dlqctl status topology/orders.yaml

  # Exit 3 when a DLQ holds more than 100 messages (for a cron job)
  dlqctl status topology/orders.yaml --max-dlq 100

  # As JSON
  dlqctl status topology/orders.yaml --json";

/// `dlqctl doctor`.
pub const DOCTOR: &str = "\
Examples:
  # The checklist for every pipeline
  dlqctl doctor topology/orders.yaml

  # One pipeline, against the handler timeout its workers use
  dlqctl doctor topology/orders.yaml --queue orders --handler-timeout 30s

  # Read the timeout from a running worker, and annotate a CI run
  dlqctl doctor topology/orders.yaml --metrics-url http://127.0.0.1:9090/metrics --format github";

/// `dlqctl drill`.
pub const DRILL: &str = "\
Examples:
  # Walk a marked message through every tier to the DLQ (a worker must run)
  dlqctl drill topology/orders.yaml --queue orders

  # Also see the worker count it, and allow 2 minutes
  dlqctl drill topology/orders.yaml --queue orders --metrics-url http://127.0.0.1:9090/metrics --timeout 2m";

/// `dlqctl dlq`.
pub const DLQ: &str = "\
Examples:
  # Triage: the groups, a few messages, then replay a group with a canary
  dlqctl dlq summary topology/orders.yaml --queue orders
  dlqctl dlq peek topology/orders.yaml --queue orders --limit 5
  dlqctl dlq replay topology/orders.yaml --queue orders --group 3f2a9c01bd --canary 10";

/// `dlqctl dlq peek`.
pub const PEEK: &str = "\
Examples:
  # The first 5 messages of the DLQ
  dlqctl dlq peek topology/orders.yaml --queue orders --limit 5

  # Only those that failed for good in the handler, every field as JSON
  dlqctl dlq peek topology/orders.yaml --queue orders --filter-reason permanent --json

  # Only those whose last error mentions a timeout
  dlqctl dlq peek topology/orders.yaml --queue orders --filter-error timeout";

/// `dlqctl dlq summary`.
pub const SUMMARY: &str = "\
Examples:
  # The DLQ grouped by reason and error fingerprint, with each group's ID
  dlqctl dlq summary topology/orders.yaml --queue orders

  # Only what was dead-lettered over a day ago, as JSON
  dlqctl dlq summary topology/orders.yaml --queue orders --older-than 1d --json";

/// `dlqctl dlq export`.
pub const EXPORT: &str = "\
Examples:
  # A copy of the DLQ as JSON Lines; the messages stay
  dlqctl dlq export topology/orders.yaml --queue orders --output dlq.jsonl

  # Archive what is over a week old: removed once written and fsynced
  dlqctl dlq export topology/orders.yaml --queue orders --older-than 7d --output archive.jsonl --remove";

/// `dlqctl dlq replay`.
pub const REPLAY: &str = "\
Examples:
  # How many would move, moving nothing
  dlqctl dlq replay topology/orders.yaml --queue orders --dry-run

  # One group: 10 first, stop (exit 3) if over half of them fail again
  dlqctl dlq replay topology/orders.yaml --queue orders --group 3f2a9c01bd --canary 10 --rate 50

  # The messages of an export file
  dlqctl dlq replay topology/orders.yaml --queue orders --from-file dlq.jsonl";

/// `dlqctl dlq redrive`.
pub const REDRIVE: &str = "\
Examples:
  # One run of the pipeline's redrive policy, now (the file's dead_letter.redrive)
  dlqctl dlq redrive topology/redrive.yaml --queue payments";

/// `dlqctl dlq purge`.
pub const PURGE: &str = "\
Examples:
  # How many would go (exit 2, nothing removed)
  dlqctl dlq purge topology/orders.yaml --queue orders --older-than 30d

  # Remove them, with no copy (export --remove archives instead)
  dlqctl dlq purge topology/orders.yaml --queue orders --older-than 30d --yes";

/// `dlqctl serve`.
pub const SERVE: &str = "\
Examples:
  # The page on http://127.0.0.1:8088 (loopback: no token needed)
  dlqctl serve topology/orders.yaml

  # Read-only, with colours for DLQs over 10 and 100 messages
  dlqctl serve topology/orders.yaml --read-only --warn-dlq 10 --max-dlq 100

  # On every address, behind a token (from DLQCTL_AUTH_TOKEN, not in ps)
  DLQCTL_AUTH_TOKEN=s3cret dlqctl serve topology/orders.yaml --listen 0.0.0.0:8088";

/// `dlqctl completions`.
pub const COMPLETIONS: &str = "\
Examples:
  # Bash, for every user (or source it from ~/.bashrc)
  dlqctl completions bash > /etc/bash_completion.d/dlqctl

  # Zsh, into a folder of your $fpath
  dlqctl completions zsh > ~/.zfunc/_dlqctl";

/// `dlqctl man`.
pub const MAN: &str = "\
Examples:
  # Read the page of dlqctl, and of one subcommand
  dlqctl man | man -l -
  dlqctl man dlq replay | man -l -

  # Install every page (dlqctl.1, dlqctl-work.1, dlqctl-dlq-replay.1, ...)
  dlqctl man --out /usr/local/share/man/man1";
