//! The rules of the DLQ commands (`dlq peek`, `summary`, `export`,
//! `replay`, `purge`) and of the web page's DLQ views.
//!
//! - [`describe`]: what a dead-lettered message says about itself, and
//!   the summary groups.
//! - [`fingerprint`]: the error fingerprint messages are grouped by.
//! - [`select`]: the selectors every DLQ command shares.
//! - [`export`]: the lossless JSON Lines form of a message.
//! - [`replay`]: the replay and rotation copies.
//! - [`rate`]: `--rate`, a token bucket.
//! - [`run`]: how a replay ends, and the canary rules of a replay and of
//!   automatic redrive.
//! - [`redrive`]: automatic redrive: which message moves, its copy, the
//!   canary's rule and the wait between runs.
//! - [`redrive_state`]: the wait and the last runs a pipeline's workers
//!   share, kept in the broker.

pub mod describe;
pub mod export;
pub mod fingerprint;
pub mod rate;
pub mod redrive;
pub mod redrive_state;
pub mod replay;
pub mod run;
pub mod select;
