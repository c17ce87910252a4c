//! Error fingerprints: what `dlq summary` groups dead-lettered messages by.
//!
//! The last error of each message is normalised so that errors differing
//! only in their data fall in one group ("order 123 not found" and "order
//! 456 not found"). The rule, applied left to right in one pass:
//!
//! - runs of whitespace (newlines included) become one space, and the ends
//!   are trimmed; then
//! - a quoted value (`'…'`, `"…"` or `` `…` ``) becomes the quotes around
//!   `<v>`: `'<v>'`; a quote never closed is kept as it is;
//! - a UUID (`8-4-4-4-12` hex digits) becomes `<uuid>`;
//! - `0x` followed by hex digits becomes `<hex>`;
//! - a word of 8 or more hex digits with both a decimal digit and a letter
//!   (a hash, an object id) becomes `<hex>`;
//! - every other run of decimal digits, with a decimal part if any (`1.5`),
//!   becomes `<n>`, also inside a word (`order123` → `order<n>`).
//!
//! A group's id is the first 10 hex digits of the 64-bit FNV-1a hash of
//! `reason`, a NUL byte and the normalised error: short, and stable across
//! runs, machines and dlqctl versions (the web page and the `--group`
//! selector rely on that).

/// The error with its data normalised away (see the module docs).
pub fn normalise(error: &str) -> String {
    let spaced = error.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = spaced.chars().collect();
    let mut out = String::with_capacity(error.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev_is_word = i > 0 && is_word(chars[i - 1]);
        if matches!(c, '\'' | '"' | '`') {
            if let Some(end) = chars[i + 1..]
                .iter()
                .position(|&x| x == c)
                .map(|p| i + 1 + p)
            {
                out.push(c);
                out.push_str("<v>");
                out.push(c);
                i = end + 1;
                continue;
            }
            out.push(c);
            i += 1;
            continue;
        }
        if !prev_is_word && is_uuid_at(&chars, i) {
            out.push_str("<uuid>");
            i += 36;
            continue;
        }
        if !prev_is_word
            && c == '0'
            && matches!(chars.get(i + 1), Some('x' | 'X'))
            && chars.get(i + 2).is_some_and(char::is_ascii_hexdigit)
        {
            let mut j = i + 2;
            while j < chars.len() && chars[j].is_ascii_hexdigit() {
                j += 1;
            }
            if j == chars.len() || !is_word(chars[j]) {
                out.push_str("<hex>");
                i = j;
                continue;
            }
        }
        if !prev_is_word && is_word(c) {
            let mut j = i;
            while j < chars.len() && is_word(chars[j]) {
                j += 1;
            }
            let word = &chars[i..j];
            if word.len() >= 8
                && word.iter().all(char::is_ascii_hexdigit)
                && word.iter().any(char::is_ascii_digit)
                && word.iter().any(char::is_ascii_alphabetic)
            {
                out.push_str("<hex>");
                i = j;
                continue;
            }
        }
        if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            if chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(char::is_ascii_digit) {
                j += 1;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    j += 1;
                }
            }
            out.push_str("<n>");
            i = j;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The group id of a reason and a normalised error: 10 hex digits.
pub(crate) fn group_id(reason: &str, normalised: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in reason
        .bytes()
        .chain(std::iter::once(0))
        .chain(normalised.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")[..10].to_string()
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_uuid_at(chars: &[char], i: usize) -> bool {
    if i + 36 > chars.len() {
        return false;
    }
    let ok = chars[i..i + 36].iter().enumerate().all(|(k, c)| match k {
        8 | 13 | 18 | 23 => *c == '-',
        _ => c.is_ascii_hexdigit(),
    });
    ok && chars.get(i + 36).is_none_or(|&c| !is_word(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn same(a: &str, b: &str) {
        assert_eq!(normalise(a), normalise(b), "{a:?} vs {b:?}");
    }

    #[test]
    fn numbers_fall_in_one_group() {
        same("order 123 not found", "order 456 not found");
        assert_eq!(normalise("order 123 not found"), "order <n> not found");
        assert_eq!(normalise("took 1.5s, limit 30s"), "took <n>s, limit <n>s");
        assert_eq!(normalise("order123 failed"), "order<n> failed");
        same("order 7 failed", "order 10000000 failed");
        assert_eq!(
            normalise("HTTP 503 (attempt 2 of 4)"),
            "HTTP <n> (attempt <n> of <n>)"
        );
    }

    #[test]
    fn uuids_hex_and_hashes_are_normalised() {
        assert_eq!(
            normalise("no user 550e8400-e29b-41d4-a716-446655440000 here"),
            "no user <uuid> here"
        );
        assert_eq!(normalise("bad pointer 0xDEADbeef"), "bad pointer <hex>");
        assert_eq!(
            normalise("object 9f86d081884c7d65 missing"),
            "object <hex> missing"
        );
        // A long word of hex letters only is a word, not a hash.
        assert_eq!(normalise("deadbeefcafe"), "deadbeefcafe");
        // A UUID glued to a word is not one.
        assert_eq!(
            normalise("x550e8400-e29b-41d4-a716-446655440000"),
            "x<n>e<n>-e<n>b-<n>d<n>-a<n>-<n>"
        );
    }

    #[test]
    fn quoted_values_are_normalised_and_unclosed_quotes_kept() {
        same(
            "field 'email' is invalid: \"x@y\"",
            "field 'phone' is invalid: \"+33 1\"",
        );
        assert_eq!(normalise("field 'email' is `bad`"), "field '<v>' is `<v>`");
        assert_eq!(normalise("it's broken"), "it's broken");
        assert_eq!(normalise("a 'b\nc' d"), "a '<v>' d");
    }

    #[test]
    fn whitespace_collapses_and_different_errors_differ() {
        assert_eq!(normalise("  a \t\n b  "), "a b");
        assert_eq!(normalise(""), "");
        assert_ne!(
            normalise("order 1 not found"),
            normalise("order 1 already paid")
        );
    }

    #[test]
    fn group_ids_are_short_stable_and_include_the_reason() {
        let id = group_id("exhausted", "order <n> not found");
        assert_eq!(id.len(), 10);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        // Pinned: the id must not change between versions.
        assert_eq!(id, group_id("exhausted", "order <n> not found"));
        // FNV-1a 64 of a single NUL byte is 0xaf63bd4c8601b7df (published
        // test vector): the hash is the standard one.
        assert_eq!(group_id("", ""), "af63bd4c86");
        assert_ne!(id, group_id("permanent", "order <n> not found"));
        assert_ne!(group_id("ab", "c"), group_id("a", "bc"));
    }

    #[test]
    fn arbitrary_text_never_panics() {
        for s in [
            "'",
            "\"\"",
            "0x",
            "0xg",
            "1.",
            ".5",
            "-",
            "é1é",
            "\u{0}",
            "0x1234567890abcdefz",
            "550e8400-e29b-41d4-a716-44665544000",
        ] {
            let _ = normalise(s);
        }
    }
}
