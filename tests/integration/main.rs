//! Integration tests: one binary, a module per area (STYLE.md). They need a
//! running RabbitMQ with the management plugin; see `helpers`.

mod alerts;
mod bad_input;
mod broker_versions;
mod chaos_support;
mod ci_examples;
mod cli_io;
mod cluster;
mod dlq;
mod dlq_ops;
mod dlq_support;
mod example;
mod failover;
mod helpers;
mod jsonl;
mod permissions;
mod poison;
mod policy_support;
mod provision;
mod relay;
mod secrets;
mod serve;
mod serve_browser;
mod serve_support;
mod status;
mod terminal;
mod tls;
mod worker;
mod worker_chaos;
mod worker_support;
