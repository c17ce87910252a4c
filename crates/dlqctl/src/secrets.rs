//! The secrets this process knows, for a last line of defence: every URL
//! dlqctl is given or reads (`--url`/`AMQP_URL`, the management API, an
//! idempotency store and the variable naming it, an HTTP handler, a
//! health probe) registers its secrets here, and the binary scrubs them
//! from everything it writes on standard error (logs at every level, the
//! dependencies' own lines included, errors, usage errors, a panic) in
//! every written form ([`crate::core::values::redact::Scrubber`]).
//!
//! It also names the environment variables that hold secrets, which
//! handler processes do not inherit unless the operator passes them
//! (`dlqctl work --pass-env NAME`).
//!
//! The registry is process-wide; a service embedding the library may
//! call [`scrub`] on what it writes itself.

use std::borrow::Cow;
use std::sync::{LazyLock, RwLock};

use crate::core::values::redact::{self, Scrubber};

/// Passwords that are public: RabbitMQ's default user's (`guest`, which
/// it only lets in from the loopback address). Hiding it in free text
/// would hide the user name `guest` in every line; URLs still show it as
/// `***`.
const PUBLIC: [&str; 1] = ["guest"];

/// Whether `password` is a public one (RabbitMQ's `guest`).
pub fn is_public(password: &str) -> bool {
    PUBLIC.contains(&password)
}

/// The variables that hold dlqctl's secrets, as the binary reads them.
pub const SECRET_VARS: [&str; 3] = ["AMQP_URL", "DLQCTL_MANAGEMENT_URL", "DLQCTL_AUTH_TOKEN"];

#[derive(Default)]
struct Known {
    scrubber: Scrubber,
    /// Variables handler processes do not inherit.
    withheld: Vec<String>,
    /// Variables the operator passes on purpose.
    passed: Vec<String>,
}

static KNOWN: LazyLock<RwLock<Known>> = LazyLock::new(|| {
    RwLock::new(Known {
        withheld: SECRET_VARS.iter().map(|v| v.to_string()).collect(),
        ..Known::default()
    })
});

fn with_known<T>(f: impl FnOnce(&mut Known) -> T) -> Option<T> {
    KNOWN.write().ok().map(|mut k| f(&mut k))
}

/// Registers the secrets `url` holds (its password, secret query values,
/// fragment), if any; any text may be given.
pub fn register_url(url: &str) {
    let secrets = redact::secrets(url);
    if secrets.is_empty() {
        return;
    }
    with_known(|k| {
        for s in secrets.iter().filter(|s| !PUBLIC.contains(&s.as_str())) {
            k.scrubber.add(s);
        }
    });
}

/// Registers a secret as it is (a token).
pub fn register(secret: &str) {
    if !PUBLIC.contains(&secret) {
        with_known(|k| k.scrubber.add(secret));
    }
}

/// `text` without any registered secret, in any written form.
pub fn scrub(text: &str) -> Cow<'_, str> {
    match KNOWN.read() {
        Ok(k) if !k.scrubber.is_empty() => Cow::Owned(k.scrubber.scrub(text).into_owned()),
        _ => Cow::Borrowed(text),
    }
}

/// Handler processes do not inherit the variable `name` (it holds a
/// secret: the store's URL of `env:NAME`), unless it is passed.
pub fn withhold_var(name: &str) {
    with_known(|k| {
        if !k.withheld.iter().any(|w| w == name) {
            k.withheld.push(name.to_string());
        }
    });
}

/// Handler processes inherit `name` after all: the operator passes it on
/// purpose (`--pass-env NAME`).
pub fn pass_var(name: &str) {
    with_known(|k| k.passed.push(name.to_string()));
}

/// The variables handler processes do not inherit.
pub fn withheld_vars() -> Vec<String> {
    KNOWN
        .read()
        .map(|k| {
            (k.withheld.iter())
                .filter(|w| !k.passed.contains(w))
                .cloned()
                .collect()
        })
        .unwrap_or_else(|_| SECRET_VARS.iter().map(|v| v.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_scrubbed_and_public_ones_kept() {
        register_url("redis://:rEgIsTeReD1@h/0?token=t0kEn-77");
        register_url("amqp://guest:guest@127.0.0.1");
        register("aUtH-t0ken");
        let text = "a rEgIsTeReD1 b t0kEn-77 c aUtH-t0ken d user guest";
        assert_eq!(scrub(text), "a *** b *** c *** d user guest");
        withhold_var("MY_STORE");
        assert!(withheld_vars().contains(&"MY_STORE".to_string()));
        assert!(withheld_vars().contains(&"AMQP_URL".to_string()));
        pass_var("MY_STORE");
        assert!(!withheld_vars().contains(&"MY_STORE".to_string()));
    }
}
