//! Reading an export file line by line with a bound on each line: a file
//! with no newline (`/dev/zero`, a corrupted archive) is refused at the
//! bound instead of filling memory.

use std::io::BufRead;

/// The longest export line read or written, in bytes: 192 MiB. That holds
/// a message of 128 MiB (RabbitMQ 3.x's default `max_message_size`; 4.x's
/// is 16 MiB) as base64 with room for its headers. Reading one line holds
/// at most this much, plus the record parsed from it.
pub const MAX_LINE_BYTES: usize = 192 * 1024 * 1024;

/// Why a line of a file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FileLineError {
    /// The file could not be read.
    #[error("{0}")]
    Io(std::io::Error),
    /// The line is longer than the bound.
    #[error(
        "the line is longer than {max} bytes (the longest export line, README \"Reliability bounds\"): \
         is this an export file?"
    )]
    TooLong {
        /// The bound, in bytes.
        max: usize,
    },
    /// The line is not UTF-8.
    #[error("the line is not UTF-8: is this an export file?")]
    NotUtf8,
}

/// The lines of a reader, without their `\n` (or `\r\n`), each at most
/// `max` bytes; after an error the iterator ends.
pub struct BoundedLines<R> {
    reader: R,
    max: usize,
    done: bool,
}

impl<R: BufRead> BoundedLines<R> {
    /// Lines of `reader`, each at most `max` bytes.
    pub fn new(reader: R, max: usize) -> Self {
        BoundedLines {
            reader,
            max,
            done: false,
        }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = Result<String, FileLineError>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::io::Read;
        if self.done {
            return None;
        }
        let mut buf = Vec::new();
        // One byte over the bound (plus the newline) tells a long line.
        let limit = self.max as u64 + 2;
        let got = (&mut self.reader).take(limit).read_until(b'\n', &mut buf);
        let n = match got {
            Ok(n) => n,
            Err(e) => {
                self.done = true;
                return Some(Err(FileLineError::Io(e)));
            }
        };
        if n == 0 {
            self.done = true;
            return None;
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        } else if n as u64 == limit {
            self.done = true;
            return Some(Err(FileLineError::TooLong { max: self.max }));
        }
        if buf.len() > self.max {
            self.done = true;
            return Some(Err(FileLineError::TooLong { max: self.max }));
        }
        match String::from_utf8(buf) {
            Ok(s) => Some(Ok(s)),
            Err(_) => {
                self.done = true;
                Some(Err(FileLineError::NotUtf8))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Result<String, String>> {
        BoundedLines::new(input, max)
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn lines_up_to_the_bound_read_and_a_longer_one_ends_the_file() {
        assert_eq!(
            lines(b"ab\r\ncd\n\nxyz", 3),
            vec![
                Ok("ab".to_string()),
                Ok("cd".to_string()),
                Ok(String::new()),
                Ok("xyz".to_string())
            ]
        );
        let got = lines(b"abc\nabcd\nab\n", 3);
        assert_eq!(got[0], Ok("abc".to_string()));
        assert!(got[1].as_ref().unwrap_err().contains("longer than 3 bytes"));
        assert_eq!(got.len(), 2, "nothing after the error: {got:?}");
        // No newline at all, as /dev/zero: refused at the bound.
        let zeros = std::io::Read::take(std::io::repeat(0), 1 << 20);
        let mut it = BoundedLines::new(std::io::BufReader::new(zeros), 1000);
        assert!(matches!(
            it.next(),
            Some(Err(FileLineError::TooLong { .. }))
        ));
        assert!(it.next().is_none());
        assert!(lines(b"\xff\n", 3)[0]
            .as_ref()
            .unwrap_err()
            .contains("UTF-8"));
    }
}
