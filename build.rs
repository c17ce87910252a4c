//! Sets `DLQCTL_VERSION` for `dlqctl --version`: the crate's version, with
//! the git commit when built from a git checkout (uncommitted changes are
//! not tracked: that would rebuild the crate at every `git add`). Built from a package (`cargo install` of a
//! `.crate`), it is the version alone.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    // Only a checkout of this crate counts, not a git repository the
    // package was unpacked into.
    let here = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let top = git(&["-C", &here, "rev-parse", "--show-toplevel"]);
    let ours = top
        .as_deref()
        .is_some_and(|t| std::path::Path::new(t) == std::path::Path::new(&here));
    let commit = if ours {
        git(&["-C", &here, "rev-parse", "--short=12", "HEAD"])
    } else {
        None
    };
    let full = match commit {
        Some(c) => format!("{version} ({c})"),
        None => version.to_string(),
    };
    println!("cargo:rustc-env=DLQCTL_VERSION={full}");
    // A new commit or checkout changes HEAD or the ref it points at. Each
    // path comes from `git rev-parse --git-path`: in a worktree HEAD is in
    // the worktree's git dir but the branch refs are in the common one, and
    // a path that does not exist would make cargo rerun this script (and
    // rebuild the crate) on every build. A ref packed into `packed-refs`
    // has no file of its own: that file is watched instead.
    if ours {
        let path = |p: &str| {
            git(&["-C", &here, "rev-parse", "--git-path", p])
                .map(|g| std::path::Path::new(&here).join(g))
                .filter(|g| g.exists())
        };
        if let Some(head) = path("HEAD") {
            println!("cargo:rerun-if-changed={}", head.display());
        }
        if let Some(r) = git(&["-C", &here, "symbolic-ref", "-q", "HEAD"]) {
            if let Some(f) = path(&r).or_else(|| path("packed-refs")) {
                println!("cargo:rerun-if-changed={}", f.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
