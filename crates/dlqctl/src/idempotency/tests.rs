use super::*;
use crate::core::wire::TEMP_PREFIX;

#[test]
fn a_store_url_debug_shows_no_password() {
    let url = StoreUrl::Redis("redis://user:s3cret-pw@cache:6379/0".into());
    let shown = format!("{url:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    assert!(shown.contains("redis://user:***@cache:6379/0"), "{shown}");
    let path = StoreUrl::Sqlite("/var/lib/dlqctl/orders.db".into());
    assert_eq!(
        format!("{path:?}"),
        r#"Sqlite("/var/lib/dlqctl/orders.db")"#
    );
}

#[tokio::test]
async fn open_says_which_store_it_opened() {
    let dir =
        std::env::temp_dir().join(format!("{TEMP_PREFIX}open-{:032x}", rand::random::<u128>()));
    std::fs::create_dir(&dir).unwrap();
    let url = StoreUrl::Sqlite(dir.join("orders.db"));
    let opened = open(&url, b"1:/:6:orders", Create::Yes).await;
    let _ = std::fs::remove_dir_all(&dir);
    #[cfg(feature = "sqlite")]
    assert!(opened.unwrap().describe().starts_with("sqlite:"));
    #[cfg(not(feature = "sqlite"))]
    assert!(opened
        .err()
        .unwrap()
        .to_string()
        .contains("built without the sqlite feature"));
}

/// The default SQLite file, resolved from an operator's shell (no
/// `STATE_DIRECTORY`), is the one the packaged unit's worker uses when
/// the unit's state directory exists (`/var/lib/dlqctl/PIPELINE/`, or
/// `/var/lib/private/dlqctl/PIPELINE/` under `DynamicUser`), under a
/// temporary root here; the worker's own `STATE_DIRECTORY` comes first.
#[test]
fn the_default_file_is_the_installed_workers() {
    let root =
        std::env::temp_dir().join(format!("{TEMP_PREFIX}root-{:032x}", rand::random::<u128>()));
    let home = |name: &str| (name == "HOME").then(|| "/root".to_string());
    let spec = crate::core::idempotency::StoreSpec::Sqlite(None);
    let at = |env: &dyn Fn(&str) -> Option<String>| match resolve_at(&spec, "orders", env, &root) {
        Ok(StoreUrl::Sqlite(p)) => p,
        other => panic!("{other:?}"),
    };
    // No unit: the user's own state directory.
    assert_eq!(
        at(&home),
        std::path::PathBuf::from("/root/.local/state/dlqctl/orders.db")
    );
    // The unit's DynamicUser layout.
    let private = root.join("var/lib/private/dlqctl/orders");
    std::fs::create_dir_all(&private).unwrap();
    assert_eq!(at(&home), private.join("orders.db"));
    // Without DynamicUser (or through its symlink).
    let plain = root.join("var/lib/dlqctl/orders");
    std::fs::create_dir_all(&plain).unwrap();
    assert_eq!(at(&home), plain.join("orders.db"));
    // The worker under the unit: its STATE_DIRECTORY.
    let unit = |name: &str| (name == "STATE_DIRECTORY").then(|| "/var/lib/dlqctl/orders".into());
    assert_eq!(
        at(&unit),
        std::path::PathBuf::from("/var/lib/dlqctl/orders/orders.db")
    );
    // Another pipeline's: not this one's.
    let other = match resolve_at(&spec, "payments", &home, &root) {
        Ok(StoreUrl::Sqlite(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        other,
        std::path::PathBuf::from("/root/.local/state/dlqctl/payments.db")
    );
    let _ = std::fs::remove_dir_all(&root);
    // Where the unit keeps it, for a message that did not find it.
    let hint = unit_hint("orders");
    assert!(
        hint.contains("/var/lib/private/dlqctl/orders/orders.db"),
        "{hint}"
    );
}

/// Store URLs of every shape a password hides in, each with the password
/// as written and as decoded (none may appear anywhere).
const SECRET_SHAPES: [(&str, &[&str]); 8] = [
    ("redis://:se/cret@127.0.0.1:1/0", &["se/cret"]),
    ("redis://127.0.0.1:1/0?password=qSecret9", &["qSecret9"]),
    ("redis://qSecret9@127.0.0.1:1/0", &["qSecret9"]),
    (
        "redis://u:p%40ss%2Fw0rd@127.0.0.1:1/0",
        &["p%40ss%2Fw0rd", "p@ss/w0rd"],
    ),
    ("redis://u:qSecret9@[::1]:1/0", &["qSecret9"]),
    ("rediss://:qSecret9@127.0.0.1:1/0", &["qSecret9"]),
    (
        "redis+unix:///nonexistent/redis.sock?db=0&password=qSecret9",
        &["qSecret9"],
    ),
    ("memcached://:qSecret9@host", &["qSecret9"]),
];

#[track_caller]
fn assert_no_secret(what: &str, text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!text.contains(s), "{what}: {s:?} shown in {text:?}");
    }
}

#[tokio::test]
async fn no_store_url_shape_shows_its_password() {
    for (url, secrets) in SECRET_SHAPES {
        let shown = format!("{:?}", StoreUrl::Redis(url.into()));
        assert_no_secret("Debug", &shown, secrets);
        // Named by an environment variable, refused or accepted.
        let env = |_: &str| Some(url.to_string());
        match resolve(&StoreSpec::Env("STORE".into()), "orders", &env) {
            Err(e) => assert_no_secret("env: refused", &e.to_string(), secrets),
            Ok(u) => assert_no_secret("env: resolved", &format!("{u:?}"), secrets),
        }
        if let Err(e) = crate::core::idempotency::StoreSpec::parse(url) {
            assert_no_secret("parse", &e, secrets);
        }
        // Nothing listens on port 1, and the socket is not there.
        if url.starts_with("redis") {
            let e = open(&StoreUrl::Redis(url.into()), b"1:/:6:orders", Create::No)
                .await
                .err()
                .map(|e| format!("{e} {e:?}"))
                .unwrap_or_default();
            assert_no_secret("open", &e, secrets);
        }
    }
}
