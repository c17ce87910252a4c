//! The binary's side of the secrets (`dlqctl::secrets`): the ones the
//! command line and the environment hold are registered before anything
//! is printed, standard error is written through a scrubbing writer (the
//! log, the dependencies' own lines included, errors, usage errors), a
//! panic's message is scrubbed too, and a password given as an argument
//! is named in a warning (other users read it in `/proc/PID/cmdline`).

use std::ffi::OsString;
use std::io::Write;

use dlqctl::core::values::redact;

/// Options whose value may be a URL with a password, or a token: given
/// as arguments, `ps` shows them to every user of the machine.
const SECRET_FLAGS: [&str; 6] = [
    "--url",
    "--management-url",
    "--idempotency-store",
    "--http",
    "--metrics-url",
    "--auth-token",
];

/// The option whose whole value is a secret.
const TOKEN_FLAG: &str = "--auth-token";

/// Each option's value given as an argument: (option, value), for
/// `--opt VALUE` and `--opt=VALUE`, up to `--`.
fn flag_values(args: &[String]) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == "--" {
            break;
        }
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (a.as_str(), args.get(i + 1).map(String::as_str)),
        };
        if let (Some(known), Some(v)) = (SECRET_FLAGS.iter().find(|f| **f == flag), value) {
            out.push((*known, v));
        }
    }
    out
}

/// Registers the secrets of the arguments (any word holding a URL, an
/// `--auth-token`'s value) and of dlqctl's variables, before anything
/// could print them.
pub fn register(args: &[OsString], env: &dyn Fn(&str) -> Option<String>) {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    for word in args.iter().filter(|w| w.contains(':')) {
        register_list(word);
    }
    for (flag, value) in flag_values(&args) {
        if flag == TOKEN_FLAG {
            dlqctl::secrets::register(value);
        }
    }
    for var in dlqctl::secrets::SECRET_VARS {
        if let Some(value) = env(var) {
            if var == "DLQCTL_AUTH_TOKEN" {
                dlqctl::secrets::register(&value);
            } else {
                register_list(&value);
            }
        }
    }
}

/// A URL, or a comma-separated list of them, as clap splits it.
fn register_list(text: &str) {
    dlqctl::secrets::register_url(text);
    for part in text.split(',') {
        dlqctl::secrets::register_url(part);
    }
}

/// The options given as arguments with a password in them (RabbitMQ's
/// public `guest` aside).
pub fn passwords_on_command_line(args: &[OsString]) -> Vec<&'static str> {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut flags: Vec<&'static str> = Vec::new();
    for (flag, value) in flag_values(&args) {
        let secret = if flag == TOKEN_FLAG {
            !value.is_empty()
        } else {
            value
                .split(',')
                .flat_map(redact::passwords)
                .any(|p| !dlqctl::secrets::is_public(p))
        };
        if let Some(known) = SECRET_FLAGS.iter().find(|f| **f == flag) {
            if secret && !flags.contains(known) {
                flags.push(known);
            }
        }
    }
    flags
}

/// The warning for passwords given as arguments, if there are any.
pub fn warn_command_line(args: &[OsString]) {
    let flags = passwords_on_command_line(args);
    if !flags.is_empty() {
        tracing::warn!(
            options = %flags.join(", "),
            "a password was given on the command line, where other users of this machine \
             can read it (ps, /proc/PID/cmdline); give it in the environment instead \
             (AMQP_URL, DLQCTL_MANAGEMENT_URL, DLQCTL_AUTH_TOKEN, a store's env:NAME) or \
             from a file the service manager reads (systemd's EnvironmentFile=)"
        );
    }
}

/// Standard error, every write scrubbed of the known secrets. The log's
/// formatter writes a whole line at once, so a secret is never split
/// between two writes.
pub struct ScrubbedStderr;

impl Write for ScrubbedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match std::str::from_utf8(buf) {
            Ok(text) => err.write_all(dlqctl::secrets::scrub(text).as_bytes())?,
            Err(_) => err.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// What a panic prints, as the standard hook words it (thread, place,
/// message, and the backtrace when `RUST_BACKTRACE` asks for one).
pub fn panic_text(thread: &str, info: &str, backtrace: Option<String>) -> String {
    match backtrace {
        Some(trace) => format!("thread '{thread}' {info}\nstack backtrace:\n{trace}"),
        None => format!(
            "thread '{thread}' {info}\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"
        ),
    }
}

/// A panic hook that prints as the standard one does, scrubbed.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let trace = std::backtrace::Backtrace::capture();
        let trace = (trace.status() == std::backtrace::BacktraceStatus::Captured)
            .then(|| trace.to_string());
        crate::output::stderr_line(&panic_text(name, &info.to_string(), trace));
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_password_given_as_an_argument_is_named() {
        let given = args(&[
            "work",
            "t.yaml",
            "--url",
            "amqp://u:pw1@h,amqp://guest:guest@h2",
            "--management-url=http://guest:guest@h",
            "--idempotency-store",
            "redis://h/0?password=pw2",
            "--auth-token",
            "tok",
            "--",
            "--http",
            "http://u:pw3@h",
        ]);
        assert_eq!(
            passwords_on_command_line(&given),
            ["--url", "--idempotency-store", "--auth-token"]
        );
        assert!(passwords_on_command_line(&args(&["status", "--url", "amqp://h"])).is_empty());
    }

    #[test]
    fn arguments_and_variables_register_their_secrets() {
        let env = |name: &str| match name {
            "AMQP_URL" => Some("amqp://u:eNvPw-1@h1,amqp://u:eNvPw-2@h2".to_string()),
            "DLQCTL_AUTH_TOKEN" => Some("eNv-t0ken".to_string()),
            _ => None,
        };
        let given = args(&[
            "serve",
            "--auth-token=aRg-t0ken",
            "--url",
            "amqp://u:aRgPw-3@h",
        ]);
        register(&given, &env);
        let text = "eNvPw-1 eNvPw-2 eNv-t0ken aRg-t0ken aRgPw-3";
        assert_eq!(dlqctl::secrets::scrub(text), "*** *** *** *** ***");
    }

    #[test]
    fn a_panic_reads_as_the_standard_hook_would_write_it() {
        let text = panic_text("main", "panicked at src/x.rs:1:2:\nboom", None);
        assert!(text.starts_with("thread 'main' panicked at src/x.rs:1:2:\nboom\nnote:"));
        let text = panic_text("w", "panicked at a:1:1:\nx", Some("0: f".into()));
        assert!(text.ends_with("stack backtrace:\n0: f"), "{text}");
    }
}
