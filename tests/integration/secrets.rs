//! Passwords never appear in output, whatever they contain and however
//! the URL reaches dlqctl (`--url`, `AMQP_URL`, `--management-url`).

use crate::support::{amqp_url_with, unique_prefix, Dlqctl, Scratch};

/// Passwords with every URL delimiter, percent signs, and very short ones.
const PASSWORDS: [&str; 9] = [
    "S3c/retPW",
    "p@ssw0rd",
    "pa:ss:wd",
    "50%offpw",
    "pw#frag1",
    "q?x=1&y",
    "/@:%#",
    "x",
    "ab",
];

/// `dlqctl ARGS` with only `env` of the broker's variables: each test says
/// how the URL reaches dlqctl.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Dlqctl::new(args[0])
        .args(&args[1..])
        .env_remove("AMQP_URL")
        .env_remove("DLQCTL_MANAGEMENT_URL");
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let out = cmd.into_std().output().expect("run dlqctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The password does not appear: as a whole where it is long enough to
/// search for, and never between the user's `:` and the `@`.
#[track_caller]
fn assert_hidden(pw: &str, what: &str, text: &str) {
    if pw.len() >= 3 {
        assert!(!text.contains(pw), "{what}: password {pw:?} shown:\n{text}");
    }
    assert!(
        !text.contains(&format!("guest:{pw}")),
        "{what}: password {pw:?} shown:\n{text}"
    );
}

/// A topology of one pipeline, `PREFIXorders` with a fresh prefix: the
/// file and the prefix.
fn topology(dir: &Scratch) -> (std::path::PathBuf, String) {
    let p = unique_prefix();
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {p}orders\n"),
    );
    (file, p)
}

/// The arguments of `dlqctl work FILE --queue QUEUE --url URL
/// --wait-for-broker 0s -- true`: it gives up at once instead of waiting
/// for the broker.
fn work_at_once<'a>(file: &'a str, queue: &'a str, url: &'a str) -> Vec<&'a str> {
    vec![
        "work",
        file,
        "--queue",
        queue,
        "--url",
        url,
        "--wait-for-broker",
        "0s",
        "--",
        "true",
    ]
}

#[test]
fn passwords_with_url_delimiters_never_appear_in_errors() {
    let dir = Scratch::new();
    let (file, p) = topology(&dir);
    let file = file.to_str().expect("utf-8 path");
    for pw in PASSWORDS {
        // Port 1: nothing listens, so every command fails after reading the URL.
        let url = format!("amqp://guest:{pw}@127.0.0.1:1/%2f");
        let (code, text) = run(&["provision", file, "--url", &url], &[]);
        assert!(
            matches!(code, Some(1 | 2)),
            "--url {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "provision --url", &text);

        let (code, text) = run(&["provision", file], &[("AMQP_URL", &url)]);
        assert!(
            matches!(code, Some(1 | 2)),
            "AMQP_URL {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "provision with AMQP_URL", &text);

        let queue = format!("{p}orders");
        let (code, text) = run(&work_at_once(file, &queue, &url), &[]);
        assert!(
            matches!(code, Some(1 | 2)),
            "work {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "work --url", &text);

        let mgmt = format!("http://guest:{pw}@127.0.0.1:1");
        let (_, text) = run(
            &["provision", file, "--check", "--management-url", &mgmt],
            &[],
        );
        assert_hidden(pw, "provision --check --management-url", &text);
    }
}

/// Connection mistakes get a hint that names them, not "is RabbitMQ
/// running?": TLS spoken to the plain port, and a frame_max the broker
/// refuses. The broker under test answers on its plain port for both.
#[test]
fn tls_to_a_plain_port_and_a_refused_frame_max_are_named() {
    let dir = Scratch::new();
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {}x\n", unique_prefix()),
    );
    let f = file.to_str().unwrap();
    for (url, wanted) in [
        (
            amqp_url_with("amqps", "guest", "guest", "%2f", ""),
            "the port may speak plain AMQP",
        ),
        (
            amqp_url_with("amqp", "guest", "guest", "%2f", "frame_max=512"),
            "frame_max",
        ),
    ] {
        let (code, text) = run(&["provision", f, "--url", &url], &[]);
        assert_eq!(code, Some(1), "{url}: {text}");
        assert!(text.contains(wanted), "{url}: no `{wanted}` in {text}");
        assert!(!text.contains("is RabbitMQ running"), "{url}: {text}");
    }
}

/// Every form a password could take in a log line: as it is, as lapin's
/// byte list of the SASL PLAIN response (`[0, 103, 117, ...]`), as hex,
/// and in base64 (of itself, of `user:password` as Basic auth sends it,
/// and of the SASL response).
fn password_forms(user: &str, pw: &str) -> Vec<String> {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let list = |s: &[u8]| {
        s.iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sasl = format!("\0{user}\0{pw}");
    let hex: String = pw.bytes().map(|b| format!("{b:02x}")).collect();
    vec![
        pw.to_string(),
        list(pw.as_bytes()),
        hex.clone(),
        hex.to_uppercase(),
        b64(pw.as_bytes()).trim_end_matches('=').to_string(),
        b64(format!("{user}:{pw}").as_bytes())
            .trim_end_matches('=')
            .to_string(),
        b64(sasl.as_bytes()).trim_end_matches('=').to_string(),
    ]
}

/// With `RUST_LOG=trace` lapin logs the `connection.start-ok` frame, whose
/// SASL response is the user and password as a byte list. That record
/// never reaches the log, in text or JSON, from a one-shot command or the
/// worker, and the logs are still there (trace records of the handshake).
#[test]
fn credentials_never_reach_a_trace_log() {
    let dir = Scratch::new();
    let (file, p) = topology(&dir);
    let file = file.to_str().expect("utf-8 path");
    // A password no other text contains; the broker refuses it (guest's
    // password is guest), after dlqctl has sent it.
    let pw = "Zq8Wv3Kx9PmRt7Ly";
    let with_password = |url: String| {
        let mut url = reqwest::Url::parse(&url).expect("a URL");
        url.set_username("guest").expect("a user");
        url.set_password(Some(pw)).expect("a password");
        url.to_string()
    };
    let url = with_password(crate::support::amqp_url());
    let mgmt = with_password(crate::support::management_url());
    let queue = format!("{p}orders");
    for filter in [
        "trace",
        "lapin=trace,amq_protocol=trace,reqwest=trace,hyper=trace",
    ] {
        for format in ["text", "json"] {
            for args in [
                vec!["status", file, "--url", &url, "--management-url", &mgmt],
                work_at_once(file, &queue, &url),
            ] {
                let mut all = args.clone();
                all.extend(["--log-format", format]);
                let (code, text) = run(&all, &[("RUST_LOG", filter)]);
                assert!(
                    matches!(code, Some(1 | 2)),
                    "{all:?}: exit {code:?}\n{text}"
                );
                assert!(
                    text.contains("TRACE") || text.contains("\"TRACE\""),
                    "{all:?} {filter}: no trace records at all:\n{text}"
                );
                for form in password_forms("guest", pw) {
                    assert!(
                        !text.contains(&form),
                        "{all:?} RUST_LOG={filter}: the password as {form:?} is in the log:\n{text}"
                    );
                }
            }
        }
    }
}

/// A password no other text holds: the test searches for it in every
/// form.
const PW: &str = "Jx7Qd2Rv9Ws4Ty6U";

/// Every form the password could be written in: as it is, percent-encoded
/// (either case), JSON-escaped (the same for these letters), and in
/// base64 (standard and URL-safe) at each alignment inside a longer text.
fn searched_forms(pw: &str) -> Vec<String> {
    use base64::Engine as _;
    let mut forms = vec![
        pw.to_string(),
        pw.bytes().map(|b| format!("%{b:02X}")).collect(),
        pw.bytes().map(|b| format!("%{b:02x}")).collect(),
        serde_json::to_string(pw).expect("json")[1..pw.len() + 1].to_string(),
    ];
    for engine in [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for skip in 0..3 {
            let rest = &pw.as_bytes()[skip..];
            forms.push(engine.encode(&rest[..rest.len() - rest.len() % 3]));
        }
    }
    forms
}

/// The store URLs, every shape a password takes (`{}` is the password).
const STORE_SHAPES: [&str; 9] = [
    "redis://:{}@127.0.0.1:1/0",
    "redis://127.0.0.1:1/0?db=0&password={}",
    "redis://{}@127.0.0.1:1/0",
    "redis://:se/{}@127.0.0.1:1/0",
    "redis://u:p@{}:x@127.0.0.1:1/0",
    "redis://:%41{}@127.0.0.1:1/0",
    "redis://:{}@[::1]:1/0",
    "redis+unix:///nonexistent/redis.sock?password={}",
    "memcached://:{}@host",
];

/// The management API's URLs (nothing answers on port 1).
const MANAGEMENT_SHAPES: [&str; 6] = [
    "http://guest:{}@127.0.0.1:1",
    "http://:se/{}@127.0.0.1:1",
    "http://{}@127.0.0.1:1",
    "http://guest:p@{}:x@[::1]:1",
    "http://guest:%41{}@127.0.0.1:1",
    "http://127.0.0.1:1/?token={}",
];

/// The broker's URLs (nothing answers on port 1; the last does not parse).
const AMQP_SHAPES: [&str; 6] = [
    "amqp://guest:{}@127.0.0.1:1/%2f",
    "amqp://{}@127.0.0.1:1/%2f",
    "amqp://guest:se/{}@127.0.0.1:1/%2f",
    "amqp://guest:{}@[::1]:1/%2f",
    "amqp://guest:%41{}@127.0.0.1:1/%2f",
    "amqp://guest:{}@127.0.0.1:notaport/%2f",
];

/// One run of the binary: what it is, its arguments and environment.
struct Case {
    what: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Case {
    fn new(what: String, args: &[&str], env: &[(&str, &str)]) -> Case {
        Case {
            what,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// Runs `case` (for 20 s at most: a worker that keeps waiting is killed),
/// and returns its exit code and everything it printed.
fn run_case(case: &Case) -> (Option<i32>, String) {
    use std::io::Read as _;
    let mut cmd = Dlqctl::new(&case.args[0])
        .args(&case.args[1..])
        .env_remove("AMQP_URL")
        .env_remove("DLQCTL_MANAGEMENT_URL");
    for (k, v) in &case.env {
        cmd = cmd.env(k, v);
    }
    let mut child = cmd.into_std().spawn().expect("run dlqctl");
    let mut readers = Vec::new();
    for mut pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        readers.push(std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let code = loop {
        match child.try_wait().expect("wait") {
            Some(status) => break status.code(),
            None if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let text = readers
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.join().unwrap_or_default()).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    (code, text)
}

/// Whether `arg` holds a password: after the user's `:` (the user-info
/// ends at the last `@`), or as a `password` or `token` parameter.
fn has_password(arg: &str) -> bool {
    let userinfo = (arg.split_once("://"))
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .map(|(ui, _)| ui);
    userinfo.is_some_and(|ui| ui.contains(':'))
        || ["password=", "token="].iter().any(|p| arg.contains(p))
}

/// What a case's exit and output must also show: a problem, or none.
type Check = dyn Fn(&Case, Option<i32>, &str) -> Option<String> + Sync;

/// Runs every case, four at a time, and returns the problems: a form of
/// the password in an output, or a check of the case that failed.
fn run_all(cases: Vec<Case>, check: &Check) -> Vec<String> {
    let forms = searched_forms(PW);
    let queue = std::sync::Mutex::new(cases.into_iter());
    let problems = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                // The lock is taken and let go in `next`, not held while a case runs.
                let next = || queue.lock().ok().and_then(|mut q| q.next());
                while let Some(case) = next() {
                    let (code, text) = run_case(&case);
                    let mut found: Vec<String> = (forms.iter())
                        .filter(|f| text.contains(f.as_str()))
                        .map(|f| format!("{}: the password as {f:?} in:\n{text}", case.what))
                        .collect();
                    found.extend(check(&case, code, &text).map(|p| format!("{}: {p}", case.what)));
                    if let Ok(mut p) = problems.lock() {
                        p.extend(found);
                    }
                }
            });
        }
    });
    problems.into_inner().unwrap_or_default()
}

/// Every shape of URL (store, management API, broker) against every
/// output: errors and usage errors in text and JSON, logs at trace level
/// (the dependencies' own lines included), `--json` reports of `status`
/// and `doctor`, `--help` of every command with the variables set. The
/// topology is provisioned on the broker under test, so that `work` and
/// `doctor` get as far as the store.
#[test]
fn no_url_shape_shows_its_password_on_any_output() {
    let cleanup = crate::support::Cleanup::new();
    let dir = Scratch::new();
    let queue = cleanup.name("orders");
    let file = dir.write(
        "t.yaml",
        &format!(
            "version: 1\npipelines:\n  - name: {queue}\n    idempotency:\n      store: env:DLQCTL_TEST_STORE\n"
        ),
    );
    let f = file.to_str().expect("utf-8 path");
    let (amqp, mgmt) = (crate::support::amqp_url(), crate::support::management_url());
    let broker = [
        ("AMQP_URL", amqp.as_str()),
        ("DLQCTL_MANAGEMENT_URL", mgmt.as_str()),
    ];
    let (code, text) = run_case(&Case::new("provision".into(), &["provision", f], &broker));
    assert_eq!(code, Some(0), "provision: {text}");

    let mut cases = Vec::new();
    let work = ["work", f, "--queue", &queue, "--wait-for-broker", "0s"];
    for shape in STORE_SHAPES {
        let url = shape.replace("{}", PW);
        for format in ["text", "json"] {
            let mut args = work.to_vec();
            args.extend([
                "--log-format",
                format,
                "--idempotency-store",
                &url,
                "--",
                "true",
            ]);
            let env = [broker[0], broker[1], ("RUST_LOG", "trace")];
            cases.push(Case::new(
                format!("work --idempotency-store {shape} ({format})"),
                &args,
                &env,
            ));
            let mut args = work.to_vec();
            args.extend(["--log-format", format, "--", "true"]);
            let env = [
                broker[0],
                broker[1],
                ("RUST_LOG", "trace"),
                ("DLQCTL_TEST_STORE", &url),
            ];
            cases.push(Case::new(
                format!("work, store {shape} in env ({format})"),
                &args,
                &env,
            ));
        }
        for format in ["text", "json"] {
            let env = [
                broker[0],
                broker[1],
                ("RUST_LOG", "trace"),
                ("DLQCTL_TEST_STORE", &url),
            ];
            let args = ["doctor", f, "--format", format, "--sample-gap", "0s"];
            cases.push(Case::new(
                format!("doctor, store {shape} ({format})"),
                &args,
                &env,
            ));
        }
    }
    for shape in MANAGEMENT_SHAPES {
        let url = shape.replace("{}", PW);
        let env = [
            broker[0],
            ("DLQCTL_MANAGEMENT_URL", url.as_str()),
            ("RUST_LOG", "trace"),
        ];
        cases.push(Case::new(
            format!("status --json, management {shape}"),
            &["status", f, "--json"],
            &env,
        ));
        let args = [
            "doctor",
            f,
            "--format",
            "json",
            "--sample-gap",
            "0s",
            "--log-format",
            "json",
        ];
        cases.push(Case::new(
            format!("doctor, management {shape}"),
            &args,
            &env,
        ));
        let args = ["status", f, "--management-url", &url];
        cases.push(Case::new(
            format!("status --management-url {shape}"),
            &args,
            &[broker[0]],
        ));
    }
    for shape in AMQP_SHAPES {
        let url = shape.replace("{}", PW);
        let env = [("AMQP_URL", url.as_str()), broker[1], ("RUST_LOG", "trace")];
        cases.push(Case::new(
            format!("status --json, AMQP_URL {shape}"),
            &["status", f, "--json"],
            &env,
        ));
        let mut args = work.to_vec();
        args.extend(["--log-format", "json", "--", "true"]);
        cases.push(Case::new(format!("work, AMQP_URL {shape}"), &args, &env));
        let args = ["provision", f, "--check", "--url", &url];
        cases.push(Case::new(
            format!("provision --check --url {shape}"),
            &args,
            &[broker[1]],
        ));
    }
    let problems = run_all(cases, &|case, code, text| {
        // A user-info without `:` is a user name to the warning (though
        // hidden as a password everywhere).
        let on_command_line = (case.args.iter()).any(|a| a.contains(PW) && has_password(a));
        let warned = text.contains("a password was given on the command line");
        // A usage error comes before the log, so before the warning.
        (on_command_line && code != Some(2) && !warned).then(|| {
            format!("exit {code:?} and no warning about the password given as an argument:\n{text}")
        })
    });
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// `--help` (and `-h`) of every command, with every secret-bearing
/// variable holding a password, and usage errors that repeat the value
/// given (text and JSON).
#[test]
fn help_and_usage_errors_never_show_a_password() {
    let commands: [&[&str]; 17] = [
        &[],
        &["validate"],
        &["provision"],
        &["work"],
        &["status"],
        &["doctor"],
        &["drill"],
        &["serve"],
        &["completions"],
        &["man"],
        &["dlq"],
        &["dlq", "peek"],
        &["dlq", "summary"],
        &["dlq", "export"],
        &["dlq", "replay"],
        &["dlq", "redrive"],
        &["dlq", "purge"],
    ];
    let amqp = format!("amqp://guest:{PW}@127.0.0.1:1/%2f");
    let mgmt = format!("http://guest:{PW}@127.0.0.1:1");
    let env = [
        ("AMQP_URL", amqp.as_str()),
        ("DLQCTL_MANAGEMENT_URL", mgmt.as_str()),
        ("DLQCTL_AUTH_TOKEN", PW),
    ];
    let mut cases = Vec::new();
    for command in commands {
        for help in ["--help", "-h"] {
            let mut args: Vec<&str> = if command.is_empty() {
                vec!["--log-format", "text"]
            } else {
                command.to_vec()
            };
            args.push(help);
            cases.push(Case::new(format!("{command:?} {help}"), &args, &env));
        }
    }
    for shape in STORE_SHAPES {
        let url = shape.replace("{}", PW);
        for format in ["text", "json"] {
            let args = [
                "work",
                "t.yaml",
                "--queue",
                "q",
                "--log-format",
                format,
                "--idempotency-store",
                &url,
                "--bogus",
            ];
            cases.push(Case::new(
                format!("usage error, store {shape} ({format})"),
                &args,
                &[],
            ));
            let args = [
                "work",
                "t.yaml",
                "--queue",
                "q",
                "--log-format",
                format,
                "--idempotency-store",
                &url,
            ];
            cases.push(Case::new(
                format!("no handler, store {shape} ({format})"),
                &args,
                &[],
            ));
        }
    }
    for shape in AMQP_SHAPES {
        let url = shape.replace("{}", PW);
        let args = ["status", "--url", &url, "--max-dlq", "many"];
        cases.push(Case::new(format!("usage error, --url {shape}"), &args, &[]));
        let args = ["serve", "t.yaml", "--auth-token", PW, "--listen", "nowhere"];
        cases.push(Case::new(
            format!("usage error, --auth-token with {shape}"),
            &args,
            &[],
        ));
    }
    let problems = run_all(cases, &|case, code, text| {
        let help = case.args.iter().any(|a| a == "--help" || a == "-h");
        let expected = if help { Some(0) } else { Some(2) };
        (code != expected).then(|| format!("exit {code:?}, not {expected:?}:\n{text}"))
    });
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The web page: its overview, a pipeline's page, its API and its
/// readiness, and what `serve` prints, with a management API and a
/// worker's metrics page given in every shape.
#[tokio::test]
async fn the_web_page_never_shows_a_password() {
    let cleanup = crate::support::Cleanup::new();
    let dir = Scratch::new();
    let queue = cleanup.name("orders");
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {queue}\n"),
    );
    Dlqctl::new("provision")
        .arg(&file)
        .run()
        .await
        .assert_code(0);
    let forms = searched_forms(PW);
    let mut problems = Vec::new();
    // A raw `/` in the password ends the host for a URL parser: serve
    // refuses that URL at start (exit 2), as status and doctor do above.
    for shape in MANAGEMENT_SHAPES.iter().filter(|s| !s.contains("se/")) {
        let mgmt = shape.replace("{}", PW);
        let metrics = format!("http://u:{PW}@127.0.0.1:1/metrics?token={PW}");
        let served = crate::support::serve::Served::start(
            &file,
            &["--management-url", &mgmt, "--metrics-url", &metrics],
        )
        .await;
        let mut text = String::new();
        for path in [
            "/",
            &format!("/pipelines/{queue}"),
            "/api/overview",
            "/readyz",
        ] {
            let answer = served.get(path).await;
            text.push_str(&format!("{path}: {}\n{}\n", answer.status, answer.text));
        }
        text.push_str(&served.output());
        problems.extend(
            (forms.iter())
                .filter(|f| text.contains(f.as_str()))
                .map(|f| format!("serve, management {shape}: the password as {f:?} in:\n{text}")),
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
