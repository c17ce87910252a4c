//! What every part of the web page shares: why a request failed, the page
//! size, the pieces of addresses.

use axum::http::StatusCode;
use dlqctl::error::Error;

/// Messages a group page shows at once.
pub const PAGE_SIZE: u16 = 50;

/// Why a request failed: its status and a sentence for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do.
    pub message: String,
    /// The running job that caused a conflict, when one did.
    pub job: Option<u64>,
}

impl Fail {
    /// A failure with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Fail {
            status,
            message: message.into(),
            job: None,
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::NOT_FOUND, message)
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::BAD_REQUEST, message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::FORBIDDEN, message)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::Busy { .. } => StatusCode::CONFLICT,
            Error::Usage(_) | Error::Invalid(_) | Error::Url { .. } => StatusCode::BAD_REQUEST,
            Error::Read { .. } | Error::Write { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Connect { .. }
            | Error::Broker { .. }
            | Error::Management { .. }
            | Error::Store(_) => StatusCode::BAD_GATEWAY,
        };
        Fail::new(status, e.to_string())
    }
}

/// A busy DLQ, told for the page: the CLI's advice (`--wait`) does not
/// apply here.
pub(crate) fn for_the_page(e: Error) -> Error {
    match e {
        Error::Busy { queue, message } if message.contains("--wait") => Error::Busy {
            queue,
            message: "another dlqctl command holds its lock (the management UI names its \
                      connection); try again when it is done"
                .into(),
        },
        other => other,
    }
}

/// A path segment, percent-encoded (everything but `A-Z a-z 0-9 - . _ ~`,
/// and the dots too of a segment of dots alone, which a browser would
/// resolve as `.` or `..`).
pub(crate) fn seg(s: &str) -> String {
    let dots_only = s.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~');
        if plain || (b == b'.' && !dots_only) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query value, percent-encoded.
pub(crate) fn query_value(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_keep_only_unreserved_bytes() {
        assert_eq!(seg("orders.v2-x_y~"), "orders.v2-x_y~");
        assert_eq!(seg("a/b c?d#é"), "a%2Fb%20c%3Fd%23%C3%A9");
        assert_eq!(seg(".."), "%2E%2E");
        assert_eq!(seg("a.."), "a..");
        assert_eq!(query_value("a b&c=d"), "a+b%26c%3Dd");
    }

    #[test]
    fn library_errors_map_to_statuses() {
        let busy = Error::Busy {
            queue: "q.dlq".into(),
            message: "held".into(),
        };
        assert_eq!(Fail::from(busy).status, StatusCode::CONFLICT);
        assert_eq!(
            Fail::from(Error::Usage("x".into())).status,
            StatusCode::BAD_REQUEST
        );
        let broker = Error::Broker {
            context: "c".into(),
            message: "m".into(),
        };
        assert_eq!(Fail::from(broker).status, StatusCode::BAD_GATEWAY);
    }
}
