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
