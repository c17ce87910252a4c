//! The command line, in one place.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// `dlqctl --version`: the crate's version, and the git commit it was
/// built from when it was built from a git checkout (see `build.rs`).
pub const VERSION: &str = env!("DLQCTL_VERSION");

pub mod examples;

/// Delayed retries and a dead-letter queue for RabbitMQ consumers.
#[derive(Debug, Parser)]
#[command(name = "dlqctl", version = VERSION, about, long_about = None, after_help = examples::DLQCTL)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Log line format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What `provision` prints.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// One JSON document.
    Json,
    /// GitHub Actions workflow commands (annotations), then a summary line.
    Github,
}

impl ProvisionArgs {
    /// The output format: `--format`, or `--json` (its older spelling).
    /// Both given with different values is bad usage.
    pub fn output_format(&self) -> Result<OutputFormat, dlqctl::Error> {
        match (self.format, self.json) {
            (None, false) => Ok(OutputFormat::Text),
            (None, true) | (Some(OutputFormat::Json), _) => Ok(OutputFormat::Json),
            (Some(f), false) => Ok(f),
            (Some(f), true) => Err(dlqctl::Error::Usage(format!(
                "--json means --format json, which disagrees with --format {}: give one of them",
                f.to_possible_value()
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_default()
            ))),
        }
    }
}

/// The help heading of the broker connection options, shown apart from a
/// command's own options.
pub const CONNECTION: &str = "Connection";

/// Broker connection options, alike for every command that connects
/// (`work` adds how it fails over: `WorkArgs`).
#[derive(Debug, Args, Clone)]
pub struct Connection {
    /// Broker URL (amqp:// or amqps://). Repeat it, or give a
    /// comma-separated list, for the nodes of a cluster: the first that
    /// answers is used.
    #[arg(long, env = "AMQP_URL", default_value = dlqctl::amqp::connection::DEFAULT_URL, hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub url: Vec<String>,
    /// A PEM file of CA certificates to trust for amqps:// (and an https://
    /// management API), besides the system's: for a private CA.
    #[arg(long, env = "DLQCTL_TLS_CA", value_name = "FILE", help_heading = CONNECTION)]
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate (with --tls-key), for brokers that verify
    /// clients; with `?auth_mechanism=external` in the URL it is the login.
    #[arg(
        long,
        env = "DLQCTL_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key",
        help_heading = CONNECTION
    )]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (not encrypted).
    #[arg(
        long,
        env = "DLQCTL_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert",
        help_heading = CONNECTION
    )]
    pub tls_key: Option<PathBuf>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a topology file offline; exit 2 listing every problem.
    #[command(after_help = examples::VALIDATE)]
    Validate {
        /// The topology file.
        file: PathBuf,
    },
    /// Declare everything a topology file describes (idempotent).
    #[command(after_help = examples::PROVISION)]
    Provision(ProvisionArgs),
    /// Consume a pipeline's main queue and run a handler per message.
    #[command(after_help = examples::WORK)]
    Work(Box<WorkArgs>),
    /// Depth and consumers of every queue; exit 3 on a missing object or
    /// a DLQ over --max-dlq.
    #[command(after_help = examples::STATUS)]
    Status(StatusArgs),
    /// A pass/warn/fail checklist of what the broker will do differently
    /// from the topology (policies, limits, health, permissions); changes
    /// nothing; exit 3 on any fail.
    #[command(after_help = examples::DOCTOR)]
    Doctor(Box<DoctorArgs>),
    /// A fire drill on a live pipeline: a marked message walks every tier
    /// to the DLQ and is replayed (needs a running `dlqctl work`); exit 3
    /// naming the step that did not hold.
    #[command(after_help = examples::DRILL)]
    Drill(Box<DrillArgs>),
    /// Operate on a pipeline's dead-letter queue.
    #[command(subcommand, after_help = examples::DLQ)]
    Dlq(Box<DlqCommand>),
    /// A web page for DLQ triage: overview, groups, messages, and replay,
    /// export and purge as jobs with live progress.
    #[command(after_help = examples::SERVE)]
    Serve(Box<ServeArgs>),
    /// Print a shell completion script, e.g.
    /// `dlqctl completions bash > /etc/bash_completion.d/dlqctl`.
    #[command(after_help = examples::COMPLETIONS)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff), e.g. `dlqctl man | man -l -`, or
    /// `dlqctl man dlq replay` for a subcommand's own page; or write every
    /// page into a folder with --out.
    #[command(after_help = examples::MAN)]
    Man {
        /// The subcommand whose page to print (`work`, `dlq replay`, ...);
        /// none for the page of dlqctl itself.
        command: Vec<String>,
        /// Write the page of dlqctl and of every subcommand into DIR
        /// (`dlqctl.1`, `dlqctl-dlq-replay.1`, ...), replacing pages of the
        /// same name, and list the files written.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        out: Option<PathBuf>,
    },
}

/// `dlqctl serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The topology file.
    pub file: PathBuf,
    /// Address to listen on. Anything but loopback needs --auth-token.
    #[arg(long, default_value = "127.0.0.1:8088", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// Hide and refuse every action (replay, export, purge, cancel).
    #[arg(long)]
    pub read_only: bool,
    /// A token every request must carry (`Authorization: Bearer TOKEN`, or
    /// the login form's cookie). Prefer the environment variable: a flag
    /// shows in `ps`.
    #[arg(
        long,
        env = "DLQCTL_AUTH_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub auth_token: Option<String>,
    /// Colour a DLQ holding more than N messages (ready + unacked) as a
    /// warning.
    #[arg(long, value_name = "N")]
    pub warn_dlq: Option<u64>,
    /// Colour a DLQ holding more than N messages as an alert (as `status
    /// --max-dlq` exits 3).
    #[arg(long, value_name = "N")]
    pub max_dlq: Option<u64>,
    /// How often the overview's chart samples every DLQ.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = dlqctl::core::values::duration::parse_cli_duration)]
    pub sample_every: std::time::Duration,
    /// A host name (besides 127.0.0.1, ::1 and localhost) the page answers
    /// to without a token, as a reverse proxy or an SSH tunnel names it.
    /// Repeatable.
    #[arg(long, value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// A worker's metrics page (`dlqctl work --metrics-addr`; repeatable,
    /// one per worker): the overview then shows each pipeline's circuit
    /// breaker (a paused one makes the pipeline a warning) and every worker
    /// that is not ready.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Vec<String>,
    /// Kept messages each DLQ read holds unacked at most (as the DLQ
    /// commands' --window).
    #[arg(long, value_name = "N", default_value_t = dlqctl::ops::dlq::DEFAULT_WINDOW, value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub window: u32,
    /// Management API for unacked counts and `messages_dlx` [default: the
    /// AMQP host, port 15672]. Repeatable, one per --url, in the same order.
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `dlqctl dlq ...`.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Show messages from the head of a pipeline's DLQ; changes nothing.
    #[command(after_help = examples::PEEK)]
    Peek(PeekArgs),
    /// Group a pipeline's DLQ by reason and error fingerprint; changes nothing.
    #[command(after_help = examples::SUMMARY)]
    Summary(SummaryArgs),
    /// Write a pipeline's DLQ as JSON Lines; with --remove, archive it.
    #[command(after_help = examples::EXPORT)]
    Export(ExportArgs),
    /// Move a snapshot of a pipeline's DLQ (or an export file) back to its
    /// main queue.
    #[command(after_help = examples::REPLAY)]
    Replay(ReplayArgs),
    /// Run the pipeline's automatic redrive policy once, now (exit 0: moved
    /// or nothing eligible; 3: the canary failed or the health probe said
    /// unhealthy).
    #[command(after_help = examples::REDRIVE)]
    Redrive(RedriveArgs),
    /// Remove messages from a pipeline's DLQ, with no copy (needs --yes).
    #[command(after_help = examples::PURGE)]
    Purge(PurgeArgs),
}

/// What every DLQ command names: the topology, the pipeline, the broker.
#[derive(Debug, Args)]
#[command(mut_arg("tls_ca", |a| a.help(AMQP_ONLY_TLS_CA_HELP)))]
pub struct DlqTarget {
    /// The topology file.
    pub file: PathBuf,
    /// The pipeline (its main queue's name).
    #[arg(long)]
    pub queue: String,
    /// When another DLQ command holds this DLQ, wait for it instead of
    /// exiting 1 with "busy".
    #[arg(long)]
    pub wait: bool,
    /// Off a terminal, write a plain `progress:` line on standard error
    /// every 2 s (on a terminal a bar shows anyway). Without it a command
    /// run from cron or CI prints no progress.
    #[arg(long)]
    pub progress: bool,
    /// Kept messages held unacked at most; past it, each kept message is
    /// rotated (a confirmed copy to the DLQ's tail, then the ack). Lower it
    /// below the broker's consumer_timeout pace or its max unacked.
    #[arg(long, value_name = "N", default_value_t = dlqctl::ops::dlq::DEFAULT_WINDOW, value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub window: u32,
    #[command(flatten)]
    pub connection: Connection,
}

/// The help heading of the selectors.
pub const SELECTORS: &str = "Selectors (all given must match)";

/// The selectors, alike for peek, summary, export, replay and purge. All
/// given must match.
#[derive(Debug, Args, Default)]
pub struct Selectors {
    /// Only the messages of this summary group.
    #[arg(long, value_name = "ID", help_heading = SELECTORS)]
    pub group: Option<String>,
    /// Only this message id (repeatable: any of them). An id that is not
    /// UTF-8: `base64:` and the base64 of its bytes.
    #[arg(long = "message-id", value_name = "ID", help_heading = SELECTORS)]
    pub message_ids: Vec<String>,
    /// Only this reason (permanent, exhausted, too_large, key_conflict, or
    /// the broker's rejected, expired, maxlen, delivery_limit).
    #[arg(long, value_name = "REASON", value_parser = clap::builder::PossibleValuesParser::new(dlqctl::core::dlq::select::REASONS), help_heading = SELECTORS)]
    pub filter_reason: Option<String>,
    /// Only messages whose header K is V (repeatable: all of them).
    #[arg(long, value_name = "K=V", value_parser = dlqctl::core::dlq::select::parse_header_filter, help_heading = SELECTORS)]
    pub filter_header: Vec<(String, String)>,
    /// Only messages whose last error contains TEXT.
    #[arg(long, value_name = "TEXT", help_heading = SELECTORS)]
    pub filter_error: Option<String>,
    /// Only messages dead-lettered longer ago than D (e.g. 7d, 12h).
    #[arg(long, value_name = "D", value_parser = dlqctl::core::values::duration::parse_cli_duration, help_heading = SELECTORS)]
    pub older_than: Option<std::time::Duration>,
}

impl Selectors {
    /// The library's selector.
    pub fn selector(&self) -> dlqctl::core::dlq::select::Selector {
        dlqctl::core::dlq::select::Selector {
            group: self.group.clone(),
            message_ids: self.message_ids.clone(),
            reason: self.filter_reason.clone(),
            headers: self.filter_header.clone(),
            error: self.filter_error.clone(),
            older_than_ms: self.older_than.map(|d| d.as_millis() as u64),
        }
    }
}

/// `dlqctl dlq summary`.
#[derive(Debug, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    #[command(flatten)]
    pub select: Selectors,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl dlq peek`.
#[derive(Debug, Args)]
pub struct PeekArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    #[command(flatten)]
    pub select: Selectors,
    /// Messages to show, from the head (at most 10000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub limit: u16,
    /// Print JSON (every field, the body in full) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl dlq export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    #[command(flatten)]
    pub select: Selectors,
    /// Write to this file instead of standard output. An existing file is
    /// refused unless --append is given.
    #[arg(long, short = 'o', value_name = "F")]
    pub output: Option<PathBuf>,
    /// Append to an existing --output file.
    #[arg(long, requires = "output")]
    pub append: bool,
    /// Archive: remove each exported message from the DLQ once its line is
    /// written and the file fsynced. Needs --output naming a regular file.
    #[arg(long)]
    pub remove: bool,
    /// Export at most N messages.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Print the report as JSON on standard error's place: standard output
    /// when --output is given.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl dlq replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    #[command(flatten)]
    pub select: Selectors,
    /// Replay at most N messages (canaries included).
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// At most R messages per second.
    #[arg(long, value_name = "R", value_parser = dlqctl::core::dlq::rate::parse_rate)]
    pub rate: Option<f64>,
    /// Send the copies to this existing queue instead of the pipeline's
    /// main queue. A retry queue or a DLQ needs --force.
    #[arg(long, value_name = "QUEUE")]
    pub to: Option<String>,
    /// Allow --to to name a retry queue or a DLQ.
    #[arg(long, requires = "to")]
    pub force: bool,
    /// Replay the messages of an export file instead of the DLQ.
    #[arg(long, value_name = "F.jsonl", conflicts_with_all = ["canary", "wait"])]
    pub from_file: Option<PathBuf>,
    /// Count what would move; publish and remove nothing. With
    /// `idempotency`, also count how many of them are marked handled (a
    /// replay acks those without running them; see --rerun).
    #[arg(long)]
    pub dry_run: bool,
    /// Run messages already handled again, once (pipelines with
    /// `idempotency`): each copy's key gets this replay's id.
    #[arg(long)]
    pub rerun: bool,
    /// Replay N first, wait, and stop (exit 3) if more than half of them
    /// came back to the DLQ.
    #[arg(long, value_name = "N", value_parser = canary_count)]
    pub canary: Option<u64>,
    /// How long the canary waits [default: the pipeline's summed retry
    /// delays + 30s].
    #[arg(long, value_name = "D", requires = "canary", value_parser = canary_wait)]
    pub canary_wait: Option<std::time::Duration>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl dlq redrive`.
#[derive(Debug, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl dlq purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub target: DlqTarget,
    #[command(flatten)]
    pub select: Selectors,
    /// Really remove. Without it: exit 2, saying how many would go.
    #[arg(long)]
    pub yes: bool,
    /// Remove at most N messages.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `dlqctl status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The topology file.
    pub file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Exit 3 when any DLQ holds more than N messages (ready + unacked).
    #[arg(long, value_name = "N")]
    pub max_dlq: Option<u64>,
    /// A worker's metrics page (`http://HOST:PORT/metrics` of its
    /// --metrics-addr), to show its circuit breaker's state and readiness.
    /// Repeatable, one per worker: duplicates and deferrals are summed
    /// over them, and a paused breaker on any page is shown.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Vec<String>,
    /// Management API for unacked counts and `messages_dlx` [default: the
    /// AMQP host, port 15672]. Repeatable, one per --url, in the same order.
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `dlqctl doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The topology file.
    pub file: PathBuf,
    /// Only this pipeline (its main queue's name).
    #[arg(long)]
    pub queue: Option<String>,
    /// Output format. `github`: each fail as an `::error` and each warning
    /// as a `::warning` annotation on the line of its pipeline.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// The workers' --handler-timeout, to compare with the broker's
    /// consumer timeout.
    #[arg(long, value_name = "D", conflicts_with = "metrics_url", value_parser = dlqctl::core::values::duration::parse_cli_timeout)]
    pub handler_timeout: Option<std::time::Duration>,
    /// A worker's metrics page (`http://HOST:PORT/metrics` of its
    /// --metrics-addr), to read its handler timeout from.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Fail when a DLQ holds more than N messages (ready + unacked).
    #[arg(long, value_name = "N")]
    pub max_dlq: Option<u64>,
    /// When a queue holds messages for its DLX (`messages_dlx`), how long
    /// to wait before looking again: held over both looks is a fail.
    #[arg(long, value_name = "D", default_value = "6s", value_parser = dlqctl::core::values::duration::parse_cli_duration)]
    pub sample_gap: std::time::Duration,
    /// Management API for policies, statistics and permissions [default:
    /// the AMQP host, port 15672]. Repeatable, one per --url, in the same
    /// order.
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `dlqctl drill`.
#[derive(Debug, Args)]
pub struct DrillArgs {
    /// The topology file.
    pub file: PathBuf,
    /// The pipeline (its main queue's name).
    #[arg(long)]
    pub queue: String,
    /// How long the message may take from its publish to the DLQ (checked
    /// at the deadline: arriving later is a failure).
    #[arg(long, value_name = "D", default_value = "60s", value_parser = dlqctl::core::values::duration::parse_cli_timeout)]
    pub timeout: std::time::Duration,
    /// A worker's metrics page, to see its dead-letter counter go up.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Output format. `github`: the step that failed as an `::error`
    /// annotation on the pipeline's line.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// Management API, to name the step that broke [default: the AMQP
    /// host, port 15672].
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `dlqctl provision`.
#[derive(Debug, Args)]
pub struct ProvisionArgs {
    /// The topology file.
    pub file: PathBuf,
    /// Print the plan (every object, name, type, arguments); contact no broker.
    #[arg(long, conflicts_with = "check")]
    pub dry_run: bool,
    /// Change nothing; exit 3 listing every missing object and difference.
    #[arg(long)]
    pub check: bool,
    /// Output format. `github`: each finding as a GitHub Actions annotation
    /// (`::error file=FILE,line=L,...`) on the line of its pipeline; the
    /// plan of --dry-run then prints as text. [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<OutputFormat>,
    /// Same as --format json.
    #[arg(long)]
    pub json: bool,
    /// Management API for checking bindings [default: the AMQP host, port
    /// 15672]. Repeatable, one per --url, in the same order.
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    /// Declarations in flight at once, each on its own channel.
    #[arg(long, default_value_t = dlqctl::ops::provision::DEFAULT_PARALLELISM as u16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallelism: u16,
    #[command(flatten)]
    pub connection: Connection,
}

/// How `work` uses several `--url`s.
const WORK_URL_HELP: &str = "Broker URL (amqp:// or amqps://). Repeat it, or give a \
comma-separated list, for the nodes of a cluster: they are tried in order, and the worker \
moves to the next when its connection is lost.";

/// `--tls-ca` of the commands that speak AMQP only (no management API).
const AMQP_ONLY_TLS_CA_HELP: &str =
    "A PEM file of CA certificates to trust for amqps://, besides the system's: for a private CA.";

/// `dlqctl work`.
#[derive(Debug, Args)]
#[command(mut_arg("url", |a| a.help(WORK_URL_HELP)))]
pub struct WorkArgs {
    /// The topology file.
    pub file: PathBuf,
    /// The pipeline (its main queue's name).
    #[arg(long)]
    pub queue: String,
    /// Unacked deliveries the broker may push to this worker [default: the
    /// concurrency]. More than the concurrency leaves deliveries waiting
    /// unstarted; every reconnect or shutdown returns them, and on a quorum
    /// queue each return counts toward `x-delivery-limit`.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: Option<u16>,
    /// Handler runs at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub concurrency: u16,
    /// A handler run longer than this is killed and counts as transient
    /// (above 0). With --jsonl: how long a message waits for its answer.
    /// It must stay under the queue's consumer timeout (times
    /// ⌈prefetch / concurrency⌉), else `work` refuses to start.
    #[arg(long, default_value = "30s", value_parser = dlqctl::core::values::duration::parse_cli_timeout)]
    pub handler_timeout: std::time::Duration,
    /// How to dead-letter.
    /// `republish`: a copy with the final diagnosis to the DLX, then ack;
    /// `nack`: basic.nack(requeue=false), the broker's DLX moves it (no
    /// final error recorded).
    #[arg(long, default_value = "republish", value_parser = dead_letter_mode)]
    pub dead_letter: dlqctl::worker::DeadLetterMode,
    /// At shutdown, how long in-flight handlers may take before their
    /// messages are left to return to the queue (a second SIGINT or
    /// SIGTERM ends it at once).
    #[arg(long, default_value = "30s", value_parser = dlqctl::core::values::duration::parse_cli_duration)]
    pub grace: std::time::Duration,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9090),
    /// with /healthz (alive) and /readyz (consuming, and settles not all failing
    /// for 30 s).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// At start, keep trying to reach the broker this long before giving
    /// up with exit 1 (`0s`: fail at once). A refused login or a topology
    /// that is not provisioned still fails at once.
    #[arg(long, default_value = "60s", value_parser = dlqctl::core::values::duration::parse_cli_duration)]
    pub wait_for_broker: std::time::Duration,
    /// POST each message to this URL instead of running a command.
    #[arg(long, conflicts_with_all = ["command", "jsonl"])]
    pub http: Option<String>,
    /// Keep COMMAND running and hand it messages as JSON lines on stdin;
    /// it answers outcomes on stdout (docs/worker.md, "The JSON-lines protocol").
    #[arg(long, requires = "command")]
    pub jsonl: bool,
    /// With --jsonl: how many copies of COMMAND run. The --concurrency
    /// messages in flight are spread over them.
    #[arg(long, default_value_t = 1, requires = "jsonl", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub processes: u16,
    /// With --jsonl: how long a process may take to answer the hello line
    /// with its ready line.
    #[arg(long, default_value = "60s", requires = "jsonl", value_parser = dlqctl::core::values::duration::parse_cli_timeout)]
    pub handler_start_timeout: std::time::Duration,
    /// Do not run the pipeline's automatic redrive policy
    /// (`dead_letter.redrive`) in this worker.
    #[arg(long)]
    pub no_redrive: bool,
    /// The idempotency store for this run, over the pipeline's
    /// `idempotency.store` (sqlite:PATH, redis://…, rediss://…, env:NAME).
    /// Its leases are not shared with workers using the pipeline's store.
    #[arg(long, value_name = "URL", value_parser = parse_store)]
    pub idempotency_store: Option<dlqctl::core::idempotency::StoreSpec>,
    /// Let the handler inherit this variable of dlqctl's after all
    /// (repeatable). Handler processes do not get AMQP_URL,
    /// DLQCTL_MANAGEMENT_URL, DLQCTL_AUTH_TOKEN or the variable a store's
    /// `env:NAME` names: dlqctl's secrets are not the handler's.
    #[arg(long, value_name = "NAME")]
    pub pass_env: Vec<String>,

    /// With idempotency, --http or --jsonl: how long a message's key stays
    /// leased "in doubt" after a timeout whose outcome is unknown (the
    /// request or the process may still be working on it), waiting for the
    /// late answer; no other run of the key starts meanwhile. Also how
    /// long a key stays leased after this worker is killed mid-run.
    #[arg(long, default_value = "10m", value_parser = dlqctl::core::values::duration::parse_cli_timeout)]
    pub in_doubt: std::time::Duration,
    /// Management API, to read the main queue's consumer timeout at start
    /// and every minute [default: the AMQP host, port 15672]. Repeatable,
    /// one per --url, in the same order. When it does not answer, the
    /// worker warns and starts.
    #[arg(long, env = "DLQCTL_MANAGEMENT_URL", hide_env_values = true, value_delimiter = ',', help_heading = CONNECTION)]
    pub management_url: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
    /// The handler program and its arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

fn dead_letter_mode(s: &str) -> Result<dlqctl::worker::DeadLetterMode, String> {
    dlqctl::worker::DeadLetterMode::from_name(s).ok_or_else(|| {
        format!(
            "`{s}` is not a dead-letter mode; use one of: {}",
            dlqctl::worker::DeadLetterMode::NAMES.join(", ")
        )
    })
}

/// `--canary`: a whole number of messages, 1 or more; `1.0` is said as
/// such.
fn canary_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("give 1 or more messages (leave --canary out for no canary)".into()),
        Ok(n) => Ok(n),
        Err(_) => match s.trim().parse::<f64>() {
            Ok(f) if f.fract() == 0.0 && (1.0..1e15).contains(&f) => Err(format!(
                "a whole number of messages: write {}, not {s}",
                f as u64
            )),
            _ => Err(format!("`{s}` is not a number of messages (1 or more)")),
        },
    }
}

/// `--canary-wait`: a duration of at most 24 h (the DLQ stays locked
/// while the canary waits).
fn canary_wait(s: &str) -> Result<std::time::Duration, String> {
    let d = dlqctl::core::values::duration::parse_cli_duration(s).map_err(|e| e.to_string())?;
    if d > dlqctl::ops::dlq::replay::MAX_CANARY_WAIT {
        return Err(format!(
            "`{s}` is over 24h: the DLQ stays locked while the canary waits; give at most 24h"
        ));
    }
    Ok(d)
}

/// `--idempotency-store`: a store URL, its password never echoed.
fn parse_store(text: &str) -> Result<dlqctl::core::idempotency::StoreSpec, String> {
    dlqctl::core::idempotency::StoreSpec::parse(text)
        .map_err(|e| e.replace("idempotency.store", "--idempotency-store"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The words of a shell command line, as the shell splits them (plain
    /// words, '...' and "..."), up to the first `|`, `>` or `&&`; leading
    /// `NAME=value` assignments are left out.
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut quote: Option<char> = None;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.get_or_insert_with(String::new).push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    word.get_or_insert_with(String::new);
                }
                (None, c) if c.is_whitespace() => words.extend(word.take()),
                (None, c) => word.get_or_insert_with(String::new).push(c),
            }
        }
        assert!(quote.is_none(), "unbalanced quote in {line:?}");
        words.extend(word);
        let end = (words.iter())
            .position(|w| ["|", ">", "&&"].contains(&w.as_str()))
            .unwrap_or(words.len());
        words.truncate(end);
        let start = (words.iter())
            .position(|w| !w.contains('=') || w.starts_with('-'))
            .unwrap_or(words.len());
        words.drain(..start);
        words
    }

    /// Every command of the tree, by its path (`["dlq", "replay"]`), the
    /// root's path empty; clap's own `help` left out.
    fn all_commands(
        cmd: &clap::Command,
        path: Vec<String>,
        out: &mut Vec<(Vec<String>, clap::Command)>,
    ) {
        out.push((path.clone(), cmd.clone()));
        for sub in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            all_commands(sub, p, out);
        }
    }

    /// The subcommand path `m` parsed to.
    fn parsed_path(mut m: &clap::ArgMatches) -> Vec<String> {
        let mut path = Vec::new();
        while let Some((name, sub)) = m.subcommand() {
            path.push(name.to_string());
            m = sub;
        }
        path
    }

    /// Every command, nested ones included, ends its help with examples,
    /// and every example is a command line that parses, as that command:
    /// an option renamed or a value no longer accepted fails here.
    #[test]
    fn every_command_has_examples_that_parse() {
        let mut root = Cli::command();
        root.build();
        let mut commands = Vec::new();
        all_commands(&root, Vec::new(), &mut commands);
        assert!(commands.len() >= 17, "{} commands", commands.len());
        let mut problems = Vec::new();
        for (path, cmd) in &commands {
            let shown = format!("dlqctl {}", path.join(" "));
            let help = cmd
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let Some(body) = help.strip_prefix("Examples:\n") else {
                problems.push(format!(
                    "`{shown}` has no examples (after_help starting \"Examples:\")"
                ));
                continue;
            };
            let lines: Vec<&str> = body
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let commands_shown: Vec<&&str> = lines.iter().filter(|l| !l.starts_with('#')).collect();
            if commands_shown.is_empty() {
                problems.push(format!("`{shown}`: no example command"));
            }
            for (i, line) in lines.iter().enumerate() {
                if line.starts_with('#') {
                    if lines.get(i + 1).is_none_or(|next| next.starts_with('#')) {
                        problems.push(format!(
                            "`{shown}`: the comment {line:?} is followed by no command"
                        ));
                    }
                    continue;
                }
                let argv = shell_words(line);
                if argv.first().map(String::as_str) != Some("dlqctl") {
                    problems.push(format!("`{shown}`: {line:?} does not run dlqctl"));
                    continue;
                }
                match root.clone().try_get_matches_from(&argv) {
                    Err(e) => problems.push(format!("`{shown}`: {line:?} does not parse: {e}")),
                    Ok(m) => {
                        let got = parsed_path(&m);
                        if !got.starts_with(path) {
                            problems.push(format!(
                                "`{shown}`: {line:?} runs `dlqctl {}`, another command",
                                got.join(" ")
                            ));
                        }
                    }
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn shell_words_split_as_the_shell_does() {
        assert_eq!(
            shell_words("A=1 dlqctl x 'a b' \"c\" '' | man -l -"),
            ["dlqctl", "x", "a b", "c", ""]
        );
        assert_eq!(shell_words("dlqctl man > page.1"), ["dlqctl", "man"]);
    }

    /// The connection options are described once, under their own
    /// heading, and only `work` speaks of moving to the next node.
    #[test]
    fn the_connection_options_have_their_heading_and_their_wording() {
        let mut root = Cli::command();
        root.build();
        let mut commands = Vec::new();
        all_commands(&root, Vec::new(), &mut commands);
        let mut connecting = 0;
        for (path, cmd) in &commands {
            let Some(url) = cmd.get_arguments().find(|a| a.get_id() == "url") else {
                continue;
            };
            connecting += 1;
            for a in cmd.get_arguments().filter(|a| {
                ["url", "tls_ca", "tls_cert", "tls_key", "management_url"]
                    .contains(&a.get_id().as_str())
            }) {
                assert_eq!(
                    a.get_help_heading(),
                    Some(CONNECTION),
                    "{path:?} {}",
                    a.get_id()
                );
            }
            let help = url.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert_eq!(
                help.contains("the worker moves to the next"),
                path == &["work"],
                "{path:?}: {help}"
            );
            let ca = (cmd.get_arguments())
                .find(|a| a.get_id() == "tls_ca")
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            let has_api = cmd.get_arguments().any(|a| a.get_id() == "management_url");
            assert_eq!(ca.contains("management"), has_api, "{path:?}: {ca}");
        }
        assert_eq!(connecting, 12, "commands with --url");
    }

    /// `--help` shows no environment variable's value that may hold a
    /// secret: every variable but the TLS file paths is hidden.
    #[test]
    fn help_hides_the_values_of_secret_environment_variables() {
        const SHOWN: [&str; 3] = ["DLQCTL_TLS_CA", "DLQCTL_TLS_CERT", "DLQCTL_TLS_KEY"];
        let mut root = Cli::command();
        root.build();
        let mut commands = Vec::new();
        all_commands(&root, Vec::new(), &mut commands);
        let mut shown = Vec::new();
        for (path, cmd) in &commands {
            for a in cmd.get_arguments() {
                let Some(env) = a.get_env().and_then(|e| e.to_str()) else {
                    continue;
                };
                if !SHOWN.contains(&env) && !a.is_hide_env_values_set() {
                    shown.push(format!("{path:?} --{}: {env}", a.get_id()));
                }
            }
        }
        assert!(
            shown.is_empty(),
            "values shown by --help:\n{}",
            shown.join("\n")
        );
    }

    fn format_of(args: &[&str]) -> Result<OutputFormat, String> {
        let argv = ["dlqctl", "provision", "t.yaml"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Provision(a) => a.output_format().map_err(|e| e.to_string()),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn json_is_an_alias_of_format_json_and_may_not_disagree_with_format() {
        assert_eq!(format_of(&[]), Ok(OutputFormat::Text));
        assert_eq!(format_of(&["--json"]), Ok(OutputFormat::Json));
        assert_eq!(format_of(&["--format", "json"]), Ok(OutputFormat::Json));
        assert_eq!(
            format_of(&["--json", "--format", "json"]),
            Ok(OutputFormat::Json)
        );
        assert_eq!(
            format_of(&["--check", "--format", "github"]),
            Ok(OutputFormat::Github)
        );
        assert_eq!(format_of(&["--format", "text"]), Ok(OutputFormat::Text));
        for other in ["text", "github"] {
            let e = format_of(&["--json", "--format", other]).unwrap_err();
            assert!(e.contains(&format!("--format {other}")), "{e}");
        }
        assert!(format_of(&["--format", "yaml"]).is_err());
    }
}
