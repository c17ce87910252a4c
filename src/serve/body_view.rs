//! How `dlqctl serve` shows a message body: JSON pretty-printed and cut
//! into highlighted tokens, UTF-8 text as it is, anything else as a hex
//! dump. Pure: the page escapes every piece of text it gets from here.

/// The most body bytes shown; the rest is counted, not shown.
pub const MAX_SHOWN: usize = 256 * 1024;

/// The deepest nesting of JSON arrays and objects that is re-indented;
/// a deeper document shows as text. Indenting grows with the depth, so
/// this bound with [`MAX_PRETTY`] keeps the page's memory linear.
pub const MAX_DEPTH: usize = 64;

/// The most bytes a re-indented JSON document may take (its tokens'
/// text); past it the body shows as text.
pub const MAX_PRETTY: usize = 4 * MAX_SHOWN;

/// Why a body that parses as JSON is shown as text instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlainReason {
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Re-indented, it would take more than [`MAX_PRETTY`] bytes.
    TooLarge,
}

impl PlainReason {
    /// A sentence for the page.
    pub fn explain(self) -> String {
        match self {
            PlainReason::TooDeep => format!(
                "JSON nested deeper than {MAX_DEPTH} levels: shown as sent, not re-indented."
            ),
            PlainReason::TooLarge => format!(
                "JSON that would take more than {} KiB re-indented: shown as sent.",
                MAX_PRETTY / 1024
            ),
        }
    }
}

/// What a piece of highlighted JSON is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// An object key, with its quotes.
    Key,
    /// A string value, with its quotes.
    String,
    /// A number.
    Number,
    /// `true`, `false`.
    Bool,
    /// `null`.
    Null,
    /// Braces, brackets, commas, colons and whitespace.
    Punct,
}

/// One piece of highlighted JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Token {
    /// What it is (the CSS class).
    pub kind: TokenKind,
    /// Its text, unescaped for HTML.
    pub text: String,
}

/// One line of a hex dump.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HexLine {
    /// The offset of its first byte.
    pub offset: usize,
    /// Up to 16 bytes as hex pairs, space-separated.
    pub hex: String,
    /// The same bytes as ASCII, `.` for the others.
    pub ascii: String,
}

/// A body, ready to show.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "as", rename_all = "snake_case")]
pub enum BodyView {
    /// Valid JSON, pretty-printed.
    Json {
        /// The tokens, in order.
        tokens: Vec<Token>,
    },
    /// UTF-8 text that is not JSON.
    Text {
        /// The text.
        text: String,
        /// Set when the text is a JSON document past a bound of
        /// re-indenting.
        #[serde(skip_serializing_if = "Option::is_none")]
        plain: Option<PlainReason>,
    },
    /// Bytes that are not UTF-8.
    Hex {
        /// The dump, 16 bytes a line.
        lines: Vec<HexLine>,
    },
    /// Nothing.
    Empty,
}

/// A body as the page shows it, with the bytes past [`MAX_SHOWN`] counted
/// in the second value. A cut JSON document shows as text: what is shown
/// is always what the bytes are.
pub fn view(body: &[u8]) -> (BodyView, usize) {
    if body.is_empty() {
        return (BodyView::Empty, 0);
    }
    let mut shown = &body[..body.len().min(MAX_SHOWN)];
    let text = match std::str::from_utf8(shown) {
        Ok(text) => text,
        // A UTF-8 body cut in the middle of a character: the cut moves
        // back to the character's start.
        Err(e) if e.error_len().is_none() && shown.len() < body.len() => {
            shown = &shown[..e.valid_up_to()];
            std::str::from_utf8(shown).unwrap_or_default()
        }
        Err(_) => {
            return (
                BodyView::Hex { lines: hex(shown) },
                body.len() - shown.len(),
            );
        }
    };
    let hidden = body.len() - shown.len();
    let mut plain = None;
    if hidden == 0 {
        // Parsed first: only a valid document is re-indented. (Ignoring a
        // value has no depth limit in serde_json, and reads in linear
        // time; the depth is bounded while re-indenting.)
        let first = text.trim_start().as_bytes().first();
        if matches!(first, Some(b'{') | Some(b'['))
            && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
        {
            let mut tokens = Vec::new();
            match json_tokens(text.trim(), &mut tokens) {
                Ok(()) => return (BodyView::Json { tokens }, 0),
                Err(reason) => plain = Some(reason),
            }
        }
    }
    (
        BodyView::Text {
            text: text.to_string(),
            plain,
        },
        hidden,
    )
}

/// A hex dump, 16 bytes a line.
pub fn hex(bytes: &[u8]) -> Vec<HexLine> {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(i, chunk)| HexLine {
            offset: i * 16,
            hex: chunk
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" "),
            ascii: chunk
                .iter()
                .map(|&b| {
                    if b.is_ascii_graphic() || b == b' ' {
                        b as char
                    } else {
                        '.'
                    }
                })
                .collect(),
        })
        .collect()
}

fn push(out: &mut Vec<Token>, kind: TokenKind, text: &str) {
    // Runs of punctuation are one token: fewer elements on the page.
    if kind == TokenKind::Punct {
        if let Some(last) = out.last_mut() {
            if last.kind == TokenKind::Punct {
                last.text.push_str(text);
                return;
            }
        }
    }
    out.push(Token {
        kind,
        text: text.to_string(),
    });
}

/// A newline and `level` indents; `level` is at most [`MAX_DEPTH`].
fn indent(level: usize) -> &'static str {
    const SPACES: &str = concat!(
        "\n",
        "                                                                ",
        "                                                                "
    );
    &SPACES[..1 + 2 * level.min(MAX_DEPTH)]
}

/// Pretty-prints a valid JSON document (two spaces an indent, as
/// `serde_json` does) into tokens, from its own text: keys keep their
/// order and numbers and strings their spelling (`17.50` stays `17.50`,
/// `"\u00e9"` stays escaped), so what is shown is what was sent. Stops
/// when the document is nested deeper than [`MAX_DEPTH`] or its tokens
/// would take more than [`MAX_PRETTY`] bytes: time and memory stay linear
/// in the input.
fn json_tokens(text: &str, out: &mut Vec<Token>) -> Result<(), PlainReason> {
    let bytes = text.as_bytes();
    let next_significant = |from: usize| {
        bytes[from..]
            .iter()
            .copied()
            .find(|b| !b.is_ascii_whitespace())
    };
    let mut level = 0usize;
    let mut i = 0usize;
    let mut size = 0usize;
    let mut emit = |out: &mut Vec<Token>, kind: TokenKind, parts: &[&str]| {
        for part in parts {
            size += part.len();
            push(out, kind, part);
        }
        if size > MAX_PRETTY {
            Err(PlainReason::TooLarge)
        } else {
            Ok(())
        }
    };
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'{' | b'[' => {
                let close = if b == b'{' { b'}' } else { b']' };
                let open = if b == b'{' { "{" } else { "[" };
                if next_significant(i + 1) == Some(close) {
                    emit(
                        out,
                        TokenKind::Punct,
                        &[if b == b'{' { "{}" } else { "[]" }],
                    )?;
                    // Skip to the closing bracket.
                    i += 1 + bytes[i + 1..].iter().position(|&c| c == close).unwrap_or(0) + 1;
                } else {
                    level += 1;
                    if level > MAX_DEPTH {
                        return Err(PlainReason::TooDeep);
                    }
                    emit(out, TokenKind::Punct, &[open, indent(level)])?;
                    i += 1;
                }
            }
            b'}' | b']' => {
                level = level.saturating_sub(1);
                let close = if b == b'}' { "}" } else { "]" };
                emit(out, TokenKind::Punct, &[indent(level), close])?;
                i += 1;
            }
            b',' => {
                emit(out, TokenKind::Punct, &[",", indent(level)])?;
                i += 1;
            }
            b':' => {
                emit(out, TokenKind::Punct, &[": "])?;
                i += 1;
            }
            b'"' => {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(bytes.len());
                let kind = if next_significant(end) == Some(b':') {
                    TokenKind::Key
                } else {
                    TokenKind::String
                };
                emit(out, kind, &[&text[i..end]])?;
                i = end;
            }
            _ => {
                let len = bytes[i..]
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .unwrap_or(bytes.len() - i);
                let word = &text[i..i + len];
                let kind = match word {
                    "true" | "false" => TokenKind::Bool,
                    "null" => TokenKind::Null,
                    _ => TokenKind::Number,
                };
                emit(out, kind, &[word])?;
                i += len.max(1);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn text_of(v: &BodyView) -> String {
        match v {
            BodyView::Json { tokens } => tokens.iter().map(|t| t.text.as_str()).collect(),
            other => panic!("not JSON: {other:?}"),
        }
    }

    #[test]
    fn json_tokens_join_to_what_serde_json_pretty_prints() {
        for body in [
            r#"{"a":1,"b":[true,null,"x\"y"],"c":{},"d":[],"e":{"f":-1.5}}"#,
            r#"[1,[2,[3]]]"#,
            r#"{"<script>":"</script>"}"#,
        ] {
            let (v, hidden) = view(body.as_bytes());
            assert_eq!(hidden, 0);
            let pretty =
                serde_json::to_string_pretty(&serde_json::from_str::<Value>(body).unwrap())
                    .unwrap();
            assert_eq!(text_of(&v), pretty, "{body}");
        }
    }

    #[test]
    fn key_order_and_the_spelling_of_numbers_and_strings_are_kept() {
        let (v, _) = view(br#" {"z":17.50,"a":"\u00e9\"x","n":[1e3, -0.0 ,{}]} "#);
        assert_eq!(
            text_of(&v),
            "{\n  \"z\": 17.50,\n  \"a\": \"\\u00e9\\\"x\",\n  \"n\": [\n    1e3,\n    -0.0,\n    {}\n  ]\n}"
        );
        // Empty containers with space inside, nested.
        let (v, _) = view(b"[ [ ] , { } ]");
        assert_eq!(text_of(&v), "[\n  [],\n  {}\n]");
    }

    #[test]
    fn keys_and_values_are_told_apart() {
        let (v, _) = view(br#"{"k":"v","n":2,"b":false,"z":null}"#);
        let BodyView::Json { tokens } = v else {
            panic!()
        };
        let kinds: Vec<(TokenKind, &str)> = tokens
            .iter()
            .filter(|t| t.kind != TokenKind::Punct)
            .map(|t| (t.kind, t.text.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (TokenKind::Key, "\"k\""),
                (TokenKind::String, "\"v\""),
                (TokenKind::Key, "\"n\""),
                (TokenKind::Number, "2"),
                (TokenKind::Key, "\"b\""),
                (TokenKind::Bool, "false"),
                (TokenKind::Key, "\"z\""),
                (TokenKind::Null, "null"),
            ]
        );
    }

    #[test]
    fn a_json_scalar_or_invalid_json_is_text_and_the_text_is_unchanged() {
        for body in [
            "42",
            "\"s\"",
            "{not json",
            "<script>alert(1)</script>",
            "é ü",
        ] {
            assert_eq!(
                view(body.as_bytes()),
                (
                    BodyView::Text {
                        text: body.to_string(),
                        plain: None,
                    },
                    0
                )
            );
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_a_hex_dump_of_every_byte() {
        let body: Vec<u8> = (0u8..=40).chain([0xff, 0xfe]).collect();
        let (v, hidden) = view(&body);
        assert_eq!(hidden, 0);
        let BodyView::Hex { lines } = v else { panic!() };
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].offset, 0);
        assert_eq!(lines[1].offset, 16);
        assert!(lines[0].hex.starts_with("00 01 02"));
        assert_eq!(lines[2].hex, "20 21 22 23 24 25 26 27 28 ff fe");
        assert_eq!(lines[2].ascii, " !\"#$%&'(..");
        let back: Vec<u8> = lines
            .iter()
            .flat_map(|l| l.hex.split(' ').map(|h| u8::from_str_radix(h, 16).unwrap()))
            .collect();
        assert_eq!(back, body);
    }

    #[test]
    fn a_large_body_is_cut_and_counted_and_a_cut_json_is_text() {
        let mut body = b"{\"a\":\"".to_vec();
        body.extend(std::iter::repeat_n(b'x', MAX_SHOWN + 10));
        body.extend(b"\"}");
        let (v, hidden) = view(&body);
        assert_eq!(hidden, 12 + 6);
        assert!(matches!(v, BodyView::Text { ref text, .. } if text.len() == MAX_SHOWN));
        assert_eq!(view(b""), (BodyView::Empty, 0));
    }

    #[test]
    fn a_cut_through_a_utf8_character_moves_back_to_its_start() {
        let mut body = vec![b'a'; MAX_SHOWN - 1];
        body.extend("é".as_bytes());
        let (v, hidden) = view(&body);
        assert_eq!(hidden, 2);
        assert!(matches!(v, BodyView::Text { ref text, .. } if text.len() == MAX_SHOWN - 1));
        // Bytes that are not UTF-8 before the cut are still hex.
        let mut body = vec![0xff; MAX_SHOWN];
        body.push(b'a');
        assert!(matches!(view(&body), (BodyView::Hex { .. }, 1)));
    }

    /// The bytes the view holds: tokens' or text's length.
    fn held(v: &BodyView) -> usize {
        match v {
            BodyView::Json { tokens } => tokens.iter().map(|t| t.text.len()).sum(),
            BodyView::Text { text, .. } => text.len(),
            _ => 0,
        }
    }

    #[test]
    fn deep_json_shows_as_text_and_the_view_stays_linear_in_the_body() {
        // 120,000 arrays deep in 240 KB: re-indenting it took about 22 GB.
        for depth in [3_000, 120_000] {
            let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let start = std::time::Instant::now();
            let (v, hidden) = view(body.as_bytes());
            assert_eq!(hidden, 0);
            assert!(held(&v) <= body.len(), "{depth}: {} bytes held", held(&v));
            assert_eq!(
                v,
                BodyView::Text {
                    text: body.clone(),
                    plain: Some(PlainReason::TooDeep)
                }
            );
            assert!(start.elapsed() < std::time::Duration::from_secs(5));
        }
        // At the bound it is still re-indented; one deeper is text.
        for (depth, json) in [(MAX_DEPTH, true), (MAX_DEPTH + 1, false)] {
            let body = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
            let (v, _) = view(body.as_bytes());
            assert_eq!(matches!(v, BodyView::Json { .. }), json, "{depth}");
        }
        // Wide and as deep as allowed, up to the size cap: what is held
        // stays within MAX_PRETTY (plus one token), never depth × size.
        let inner = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        let mut body = String::from("[");
        while body.len() + inner.len() + 2 < MAX_SHOWN {
            body.push_str(&inner);
            body.push(',');
        }
        body.push_str("1]");
        let (v, _) = view(body.as_bytes());
        assert!(
            matches!(
                v,
                BodyView::Text {
                    plain: Some(PlainReason::TooLarge),
                    ..
                }
            ),
            "{v:?}"
        );
        assert!(held(&v) <= MAX_PRETTY);
    }
}
