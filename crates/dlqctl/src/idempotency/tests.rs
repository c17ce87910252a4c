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
