//! Reading a topology file from disk: the shell around the pure parser
//! ([`crate::core::topology`]), which never touches files.
//!
//! The file is read with a size cap ([`MAX_TOPOLOGY_FILE_BYTES`]) so that
//! a wrong path (`/dev/zero`, a log file) is refused instead of read
//! forever, must be UTF-8 (a byte order mark is skipped), and is then
//! parsed and validated as a whole. The `dlqctl` commands read their
//! topology through these functions, so a service embedding the worker
//! accepts exactly the files `dlqctl validate` accepts. Every URL of the
//! file is parsed by the client that will use it
//! ([`crate::urls::CLIENT_PARSERS`]).

use crate::core::topology::{parse_topology_with, source, Invalid, Pipeline, Topology};
use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// The largest topology file read, in bytes (16 MiB): a topology of 20,000
/// pipelines is about 2 MiB.
pub const MAX_TOPOLOGY_FILE_BYTES: u64 = source::MAX_FILE_BYTES;

/// Reads, parses and validates the topology file at `path`.
///
/// # Errors
///
/// - [`Error::Read`] when the file cannot be opened or read (missing,
///   no permission);
/// - [`Error::Usage`] when `path` is a directory, the file is larger than
///   [`MAX_TOPOLOGY_FILE_BYTES`], or it is not UTF-8 text (the message
///   gives the line, column and byte of the first bad byte);
/// - [`Error::Invalid`] when the YAML is not a valid topology (every
///   problem, as `FILE:LINE:COL: ...`).
///
/// The path, as given, names the file in every message.
pub fn load_topology(path: impl AsRef<Path>) -> Result<Topology> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let read_err = |source| Error::Read {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Error::Usage(format!(
            "{shown} is a directory: give a topology file"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_TOPOLOGY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_TOPOLOGY_FILE_BYTES {
        return Err(Error::Usage(format!(
            "{shown} is larger than {} MiB: a topology file is a few KiB to a few MiB; \
             is this the right file?",
            MAX_TOPOLOGY_FILE_BYTES / 1024 / 1024
        )));
    }
    let text = source::decode(&bytes).map_err(|why| Error::Usage(format!("{shown}: {why}")))?;
    let topology = parse_topology(text, &shown)?;
    register_secrets(&topology);
    Ok(topology)
}

/// The secrets a topology holds (a store's or a health probe's URL) join
/// the process's known ones ([`crate::secrets`]).
fn register_secrets(topology: &Topology) {
    for p in &topology.pipelines {
        if let Some(health) = p
            .dead_letter
            .redrive
            .as_ref()
            .and_then(|r| r.health.as_ref())
        {
            crate::secrets::register_url(health);
        }
        if let Some(crate::core::idempotency::StoreSpec::Redis(url)) =
            p.idempotency.as_ref().map(|i| &i.store)
        {
            crate::secrets::register_url(url);
        }
    }
}

/// Parses and validates a topology file's text, as [`load_topology`]
/// does once it has read the file: its URLs parsed as their clients will
/// parse them (an HTTP health URL as reqwest, a Redis store as the redis
/// crate). `file` names it in errors.
///
/// # Errors
///
/// Every problem of the file, at its line and column.
pub fn parse_topology(text: &str, file: &str) -> std::result::Result<Topology, Invalid> {
    parse_topology_with(text, file, &crate::urls::CLIENT_PARSERS)
}

/// The pipeline whose main queue is `queue`, from the topology file at
/// `path` (read as [`load_topology`] does).
///
/// # Errors
///
/// Those of [`load_topology`], and [`Error::Usage`], naming every pipeline
/// of the file, when none is called `queue`.
pub fn load_pipeline(path: impl AsRef<Path>, queue: &str) -> Result<Pipeline> {
    let path = path.as_ref();
    let topology = load_topology(path)?;
    match topology.pipeline(queue) {
        Some(p) => Ok(p.clone()),
        None => {
            let names: Vec<_> = topology.pipelines.iter().map(|p| p.name.as_str()).collect();
            // A DLQ, a retry queue or an exchange of a pipeline: name it.
            let owner = topology.pipelines.iter().find_map(|p| {
                let what = if p.dead_letter.queue == queue {
                    "the DLQ"
                } else if p.retry_queues().iter().any(|q| q == queue) {
                    "a retry queue"
                } else {
                    return None;
                };
                Some(format!(
                    "; it is {what} of pipeline `{}`: give --queue {}",
                    p.name, p.name
                ))
            });
            Err(Error::Usage(format!(
                "queue `{queue}` is not a pipeline of {} (pipelines: {}){}",
                path.display(),
                names.join(", "),
                owner.unwrap_or_default()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::wire::TEMP_PREFIX;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "{TEMP_PREFIX}topology-file-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.yaml");
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn a_file_is_read_parsed_and_its_pipeline_found() {
        let p = scratch("ok", b"version: 1\npipelines:\n  - name: orders\n");
        let t = load_topology(&p).unwrap();
        assert_eq!(t.pipelines.len(), 1);
        assert_eq!(load_pipeline(&p, "orders").unwrap().name, "orders");
        let e = load_pipeline(&p, "billing").unwrap_err().to_string();
        assert!(e.contains("queue `billing` is not a pipeline of"), "{e}");
        assert!(e.contains("(pipelines: orders)"), "{e}");
        assert!(!e.contains("give --queue"), "{e}");
        // A DLQ or a retry queue points to its pipeline.
        let e = load_pipeline(&p, "orders.dlq").unwrap_err().to_string();
        assert!(
            e.ends_with("; it is the DLQ of pipeline `orders`: give --queue orders"),
            "{e}"
        );
        let q = load_topology(&p).unwrap().pipelines[0].retry_queues()[0].clone();
        let e = load_pipeline(&p, &q).unwrap_err().to_string();
        assert!(
            e.ends_with("; it is a retry queue of pipeline `orders`: give --queue orders"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let missing = load_topology("/nonexistent/dlqctl/t.yaml").unwrap_err();
        assert!(matches!(missing, Error::Read { .. }), "{missing:?}");
        let dir = load_topology(std::env::temp_dir()).unwrap_err();
        assert!(dir.to_string().contains("is a directory"), "{dir}");
        let huge = load_topology("/dev/zero").unwrap_err();
        assert!(huge.to_string().contains("larger than 16 MiB"), "{huge}");
        let p = scratch("latin1", b"version: 1\npipelines:\n  - name: caf\xe9\n");
        let latin1 = load_topology(&p).unwrap_err().to_string();
        assert!(latin1.contains("byte 0xe9 is not UTF-8"), "{latin1}");
        let p2 = scratch("invalid", b"version: 1\npipelines: 3\n");
        let invalid = load_topology(&p2).unwrap_err();
        assert!(matches!(invalid, Error::Invalid(_)), "{invalid:?}");
        for p in [p, p2] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }
}
