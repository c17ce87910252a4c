//! The HTML pages, rendered on the server with `maud` (which escapes every
//! value it is given: a header or body holding `<script>` shows as text).
//! No inline script or style: the Content-Security-Policy forbids both.
//!
//! - `overview`: every pipeline, with a chart of its DLQ's hour.
//! - `views`: a DLQ's groups, a group's messages.
//! - `message`: one message, its history and its body.
//! - `actions`: the action forms, the jobs' pages, the export download.
//! - `login`: the login form and the unknown address.
//! - `frame` and `parts`: what every page is built from.

mod actions;
pub(super) mod frame;
mod login;
mod message;
mod overview;
mod parts;
mod views;

pub use actions::{action, cancel, download, job, jobs};
pub use login::{login, login_form, not_found};
pub use message::message;
pub use overview::overview;
pub(crate) use parts::{bad_path, bad_query};
pub use views::{dlq, group};
