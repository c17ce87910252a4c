//! What a GitHub Actions log shows, with `--format github`: each finding as
//! a workflow command (an annotation on the topology file, see
//! `crate::output::annotations`), with the text headline and hint around them.

use crate::output::annotations::{annotations, PipelineLines};
use dlqctl::ops::provision::Report;

/// `provision --check`: the headline, an annotation per finding, the hint.
pub fn check_github(file: &str, report: &Report, lines: &PipelineLines<'_>) -> String {
    let (headline, hint) = super::text::check_headline(file, report);
    format!(
        "{headline}\n{}{hint}",
        annotations(file, &report.findings, lines)
    )
}
