//! The bytes of a topology file before parsing: a size cap and UTF-8, each
//! refusal saying where and what to do.

use crate::values::Invalid;

/// The largest topology file read (16 MiB): a topology of 20,000 pipelines
/// is about 2 MiB, and `dlqctl validate /dev/urandom` must not read forever.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The file's text, or why it is not UTF-8 text: the line, column and byte
/// offset of the first bad byte, and a guess at the encoding it is in.
pub fn decode(bytes: &[u8]) -> Result<&str, Invalid> {
    let bom = |b: &[u8]| bytes.starts_with(b);
    if bom(&[0xFF, 0xFE]) || bom(&[0xFE, 0xFF]) {
        return Err(Invalid(
            "the file is UTF-16 (it starts with a UTF-16 byte order mark); \
                    save it as UTF-8"
                .into(),
        ));
    }
    let bytes = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            if s.contains('\0') {
                let at = s.find('\0').unwrap_or(0);
                let (line, col) = position(&bytes[..at]);
                return Err(Invalid(format!(
                    "line {line}, column {col}: a NUL byte; this is not a text file \
                     (UTF-16 without a byte order mark has one every other byte)"
                )));
            }
            Ok(s)
        }
        Err(e) => {
            let at = e.valid_up_to();
            let (line, col) = position(&bytes[..at]);
            Err(Invalid(format!(
                "line {line}, column {col} (byte {at}): byte 0x{:02x} is not UTF-8; \
                 the file may be in Latin-1 or another legacy encoding: save it as UTF-8",
                bytes[at]
            )))
        }
    }
}

/// 1-based line and column (in characters) just after `valid`.
fn position(valid: &[u8]) -> (usize, usize) {
    let text = std::str::from_utf8(valid).unwrap_or_default();
    let line = text.matches('\n').count() + 1;
    let col = text.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_with_or_without_a_bom_is_text() {
        assert_eq!(decode(b"version: 1\n"), Ok("version: 1\n"));
        assert_eq!(decode(b"\xEF\xBB\xBFversion: 1\n"), Ok("version: 1\n"));
        assert_eq!(decode("name: café\n".as_bytes()), Ok("name: café\n"));
    }

    #[test]
    fn latin1_names_the_line_column_and_byte() {
        let e = decode(b"version: 1\nname: caf\xe9\n").unwrap_err().0;
        assert!(
            e.starts_with("line 2, column 10 (byte 20): byte 0xe9"),
            "{e}"
        );
        assert!(e.contains("Latin-1"), "{e}");
    }

    #[test]
    fn utf16_is_named_with_or_without_its_bom() {
        let with_bom: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("v: 1".encode_utf16().flat_map(|u| u.to_le_bytes()))
            .collect();
        assert!(decode(&with_bom).unwrap_err().0.contains("UTF-16"));
        let without: Vec<u8> = "v: 1"
            .encode_utf16()
            .flat_map(|u| u.to_le_bytes())
            .collect();
        let e = decode(&without).unwrap_err().0;
        assert!(e.starts_with("line 1, column 2: a NUL byte"), "{e}");
    }

    #[test]
    fn random_bytes_never_panic() {
        for seed in 0u32..2000 {
            let bytes: Vec<u8> = (0..64u32)
                .map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i * 40503) >> 7) as u8)
                .collect();
            let _ = decode(&bytes);
        }
    }
}
