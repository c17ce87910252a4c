//! Doctor's reading of an SQLite store gives the verdict `dlqctl work`
//! gives: a file that cannot be created where it would be is a fail, as
//! `work` exits 1 on it.

use super::*;
use crate::core::audit::idempotency::StoreReading;

/// A directory no one may write into: read-only for a user, immutable
/// for root (which ignores modes). Made writable again when dropped.
struct Unwritable(std::path::PathBuf);

impl Unwritable {
    fn new() -> Option<Unwritable> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "{}doctor-{:032x}",
            crate::core::wire::TEMP_PREFIX,
            rand::random::<u128>()
        ));
        std::fs::create_dir(&dir).ok()?;
        let locked = if unsafe { libc::geteuid() } == 0 {
            std::process::Command::new("chattr")
                .arg("+i")
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).is_ok()
        };
        let d = Unwritable(dir);
        locked.then_some(d)
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o700));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn block(path: &std::path::Path) -> Idempotency {
    Idempotency {
        store: StoreSpec::Sqlite(Some(path.display().to_string())),
        ..Idempotency::default()
    }
}

#[tokio::test]
async fn a_file_that_cannot_be_created_fails_as_work_exits_1() {
    let Some(dir) = Unwritable::new() else {
        eprintln!("cannot make a directory unwritable here: skipped");
        return;
    };
    let path = dir.0.join("orders.db");
    let env = |_: &str| None;
    let f = store_facts(&block(&path), "orders", "/", &env).await;
    let StoreReading::Failed(why) = &f.reading else {
        panic!("{:?}", f.reading)
    };
    assert!(why.contains("not writable by this user"), "{why}");
    // The worker refuses it too.
    let url = StoreUrl::Sqlite(path.clone());
    let e = open(&url, b"s", Create::Yes).await.err().expect("refused");
    assert!(
        matches!(e, crate::idempotency::StoreError::Refused { .. }),
        "{e}"
    );
    // The default file under an unwritable state directory: the same.
    let default = Idempotency::default();
    let state = dir.0.join("state").display().to_string();
    let env = move |name: &str| (name == "STATE_DIRECTORY").then(|| state.clone());
    let f = store_facts(&default, "orders", "/", &env).await;
    assert!(
        matches!(f.reading, StoreReading::Failed(_)),
        "{:?}",
        f.reading
    );
}

#[tokio::test]
async fn a_file_not_created_yet_in_a_writable_directory_warns() {
    let dir = std::env::temp_dir().join(format!(
        "{}doctor-{:032x}",
        crate::core::wire::TEMP_PREFIX,
        rand::random::<u128>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let env = |_: &str| None;
    let f = store_facts(&block(&dir.join("orders.db")), "orders", "/", &env).await;
    assert_eq!(f.reading, StoreReading::NotCreated);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default file not found where doctor looked: the item says where
/// it looked and where the packaged unit's worker keeps it.
#[tokio::test]
async fn a_default_file_not_found_says_where_the_unit_keeps_it() {
    let home = std::env::temp_dir().join(format!(
        "{}doctor-{:032x}",
        crate::core::wire::TEMP_PREFIX,
        rand::random::<u128>()
    ));
    std::fs::create_dir(&home).unwrap();
    let shown = home.display().to_string();
    let env = move |name: &str| (name == "HOME").then(|| shown.clone());
    let pipeline = format!("p{:016x}", rand::random::<u64>());
    let f = store_facts(&Idempotency::default(), &pipeline, "/", &env).await;
    let _ = std::fs::remove_dir_all(&home);
    assert_eq!(f.reading, StoreReading::NotCreated);
    assert!(f.store.contains(&home.display().to_string()), "{}", f.store);
    assert!(
        f.store
            .contains(&format!("/var/lib/private/dlqctl/{pipeline}/{pipeline}.db")),
        "{}",
        f.store
    );
}
