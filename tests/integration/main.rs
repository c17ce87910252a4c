//! Integration tests: one binary, a module per area (see "The layout" in
//! docs/development.md). They need a running RabbitMQ with the management
//! plugin; what they share (the broker, the binary, handler scripts) is in
//! `support`.

// A test or a benchmark may be as long as its scenario or its table:
// the length rule (clippy::too_many_lines) is for the code they run.
#![allow(clippy::too_many_lines)]

mod alerts;
mod bad_input;
mod breaker;
mod broker_versions;
mod canary;
mod ci_examples;
mod cli_io;
mod cluster;
mod consumer_timeout;
mod deploy;
mod dlq;
mod dlq_ops;
mod dlq_selectors;
mod doctor;
mod example;
mod failover;
mod idempotency;
mod idempotency_contract;
mod idempotency_faults;
mod idempotency_guard;
mod idempotency_in_doubt;
mod idempotency_paths;
mod idempotency_store;
mod jsonl;
mod permissions;
mod poison;
mod provision;
mod readiness;
mod redrive;
mod secrets;
mod serve;
mod serve_browser;
mod service;
mod status;
mod support;
mod terminal;
mod tls;
mod worker;
mod worker_chaos;
