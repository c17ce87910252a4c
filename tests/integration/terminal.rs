//! A message cannot drive the operator's terminal or forge output lines:
//! the text output of `dlq peek` and `dlq summary` shows every control
//! character of a message id, reason, source queue or error as a visible
//! escape.

use crate::support::dlq::{dead, dlq, Fixture};
use crate::support::worker::{s, table};
use lapin::types::AMQPValue;

/// ESC sequences that retitle and clear a terminal, BEL, a newline that
/// would start a forged line, NUL and DEL, and a C1 CSI.
const HOSTILE: &str = "x\u{1b}]0;owned\u{7}\u{1b}[2J\nFORGED line\r\u{0}\u{7f}\u{9b}31m";

fn hostile_message() -> (Vec<u8>, lapin::BasicProperties) {
    let props = dead(&format!("id-{HOSTILE}"), HOSTILE, HOSTILE, "t");
    let mut headers = props.headers().clone().unwrap_or_default();
    for (k, v) in table(&[
        ("dlqctl-source-queue", s(HOSTILE)),
        ("dlqctl-original-exchange", s(HOSTILE)),
        ("dlqctl-original-routing-key", s(HOSTILE)),
    ])
    .inner()
    {
        headers.insert(k.clone(), v.clone());
    }
    headers.insert(
        "dlqctl-reason".into(),
        AMQPValue::LongString(HOSTILE.into()),
    );
    (b"body".to_vec(), props.with_headers(headers))
}

#[track_caller]
fn assert_inert(what: &str, text: &str, lines: usize) {
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{what}: a raw control character in {text:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "{what}: a forged line in:\n{text}"
    );
    assert_eq!(text.lines().count(), lines, "{what}:\n{text}");
    assert!(text.contains("\\u001b]0;owned\\u0007"), "{what}: {text}");
}

#[tokio::test]
async fn peek_and_summary_escape_control_characters_of_a_message() {
    let f = Fixture::new(3, |_| {}, vec![hostile_message()]).await;
    // peek: the headline, two lines of facts, the last error, one attempt,
    // the body; summary: the headline and one group of two lines.
    for (verb, lines) in [("peek", 6), ("summary", 3)] {
        let run = dlq(verb, &f.file, &f.pipe.name, &[]).await;
        run.assert_code(0);
        assert_inert(verb, &run.stdout, lines);
    }
}
