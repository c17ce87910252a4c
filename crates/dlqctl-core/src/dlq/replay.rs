//! The copies the DLQ commands publish: a replay copy (back to a main
//! queue) and a rotation copy (to the DLQ's own tail, for a message a
//! command keeps past its window).

use crate::retry::copy::{is_broker_history, kept_properties};
use crate::values::text::rfc3339_millis;
use crate::wire::{count, ATTEMPT_HEADER, REPLAYED_AT_HEADER, REPLAYED_HEADER, REPLAY_ID_HEADER};
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};

/// The properties of a replay copy.
///
/// As the worker's copies: a `user_id` other than the connection's user is
/// dropped (the broker would refuse it), `expiration` is not copied and
/// `delivery_mode` is 2. The headers lose the broker's history (`x-death`,
/// `x-first-death-*`, `x-last-death-*`, `x-delivery-count`,
/// `x-acquired-count`) and
/// `dlqctl-attempt`, so the copy starts again at attempt 1; every other
/// header is kept (the error history, `dlqctl-reason`, ...), and
/// `dlqctl-replayed` (previous count + 1), `dlqctl-replayed-at` and
/// `dlqctl-replay-id` are set.
pub fn replay_copy(
    original: &BasicProperties,
    connection_user: &str,
    replay_id: &str,
    now_unix_ms: u64,
) -> BasicProperties {
    back_to_work(
        original,
        connection_user,
        replay_id,
        now_unix_ms,
        REPLAYED_HEADER,
    )
}

/// A copy back to a main queue, by a DLQ command's run `replay_id`: the
/// broker's history and `dlqctl-attempt` dropped, every other header kept
/// as it was but `counter` (one more than the original's, see
/// [`count`]), and `dlqctl-replayed-at` and `dlqctl-replay-id` set. A
/// replay counts in `dlqctl-replayed`, a redrive in `dlqctl-redriven`
/// ([`crate::dlq::redrive::redrive_copy`]); each keeps the other's
/// count as it was.
pub(crate) fn back_to_work(
    original: &BasicProperties,
    connection_user: &str,
    replay_id: &str,
    now_unix_ms: u64,
    counter: &str,
) -> BasicProperties {
    let old = original.headers().as_ref();
    let next = i64::try_from(count(old, counter).saturating_add(1)).unwrap_or(i64::MAX);
    let mut headers = FieldTable::default();
    for (k, v) in old.into_iter().flatten() {
        let key = k.as_str();
        if !is_broker_history(key) && key != ATTEMPT_HEADER {
            headers.insert(k.clone(), v.clone());
        }
    }
    headers.insert(counter.into(), AMQPValue::LongLongInt(next));
    headers.insert(
        REPLAYED_AT_HEADER.into(),
        AMQPValue::LongString(LongString::from(rfc3339_millis(now_unix_ms))),
    );
    headers.insert(
        REPLAY_ID_HEADER.into(),
        AMQPValue::LongString(LongString::from(replay_id)),
    );
    kept_properties(original, connection_user).with_headers(headers)
}

/// The replay id a message carries, if any.
pub fn replay_id_of(props: &BasicProperties) -> Option<String> {
    match props.headers().as_ref()?.inner().get(REPLAY_ID_HEADER)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// The properties of a rotation copy: the message as it is (every header,
/// the broker's history included, and its `delivery_mode`; persistent when
/// it had none), except that a foreign `user_id` is dropped and
/// `expiration` is `expiration_ms` (its remaining retention; `None`: no
/// expiration).
pub fn rotation_copy(
    original: &BasicProperties,
    connection_user: &str,
    expiration_ms: Option<u64>,
) -> BasicProperties {
    let mut p = kept_properties(original, connection_user);
    if let Some(m) = original.delivery_mode() {
        p = p.with_delivery_mode(*m);
    }
    if let Some(h) = original.headers() {
        p = p.with_headers(h.clone());
    }
    match expiration_ms {
        Some(ms) => p.with_expiration(ShortString::from(ms.to_string())),
        None => p,
    }
}

/// The least a rotation copy keeps, in ms, when the DLQ's retention is
/// longer: 15 minutes. A read-only command never removes or expires a
/// message, so a message whose retention is already spent by its
/// `dlqctl-dead-lettered-at` (an archive replayed `--to` the DLQ, a clock
/// that moved) is not rotated to its death: its copy keeps this long, time
/// for the next reader to reach it at the tail. The broker would not have
/// dropped it either: its own clock (`x-message-ttl`) starts at enqueue.
pub(crate) const ROTATION_FLOOR_MS: u64 = 15 * 60 * 1000;

/// The `expiration` of a rotation copy, in ms: the DLQ's retention
/// (`dead_letter.ttl`) minus the time since the message was dead-lettered,
/// so rotating a message does not make it live longer; but never less
/// than `ROTATION_FLOOR_MS` (or the whole retention, when that is
/// shorter), so rotating never expires it either. `None` when the DLQ
/// keeps messages for ever. A message whose time is unknown keeps the
/// whole retention (from now). The DLQ's `x-message-ttl` applies to the
/// copy too, counted from its enqueue.
pub fn remaining_retention(
    ttl_ms: Option<u64>,
    dead_lettered_at_ms: Option<u64>,
    now_unix_ms: u64,
) -> Option<u64> {
    let ttl = ttl_ms?;
    let age = dead_lettered_at_ms.map_or(0, |at| now_unix_ms.saturating_sub(at));
    let floor = ttl.clamp(1, ROTATION_FLOOR_MS);
    Some(ttl.saturating_sub(age).max(floor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field_table;
    use crate::values::shortstr;
    use crate::wire::{ERRORS_HEADER, LAST_ERROR_HEADER, REASON_HEADER};
    use amq_protocol::types::FieldArray;

    fn original() -> BasicProperties {
        let text = |s: &str| AMQPValue::LongString(s.into());
        let h = field_table([
            ("x-death", AMQPValue::FieldArray(FieldArray::default())),
            ("x-first-death-reason", text("rejected")),
            ("x-last-death-queue", text("q")),
            ("x-delivery-count", AMQPValue::LongLongInt(3)),
            ("x-acquired-count", AMQPValue::LongLongInt(4)),
            (ATTEMPT_HEADER, AMQPValue::LongLongInt(4)),
            (ERRORS_HEADER, AMQPValue::FieldArray(FieldArray::default())),
            (LAST_ERROR_HEADER, text("boom")),
            (REASON_HEADER, text("exhausted")),
            ("tenant", text("acme")),
        ]);
        BasicProperties::default()
            .with_message_id(ShortString::from(shortstr::from_raw_bytes(&[0xff, b'1'])))
            .with_user_id("someone-else".into())
            .with_expiration("5000".into())
            .with_delivery_mode(1)
            .with_content_type("application/json".into())
            .with_headers(h)
    }

    #[test]
    fn a_replay_copy_starts_at_attempt_one_and_keeps_the_history() {
        let c = replay_copy(&original(), "guest", "run-1", 1_700_000_000_123);
        let h = c.headers().clone().unwrap();
        let keys: Vec<&str> = h.inner().keys().map(|k| k.as_str()).collect();
        for gone in [
            "x-death",
            "x-first-death-reason",
            "x-last-death-queue",
            "x-delivery-count",
            "x-acquired-count",
            ATTEMPT_HEADER,
        ] {
            assert!(!keys.contains(&gone), "{gone} kept: {keys:?}");
        }
        for kept in [ERRORS_HEADER, LAST_ERROR_HEADER, REASON_HEADER, "tenant"] {
            assert!(keys.contains(&kept), "{kept} dropped: {keys:?}");
        }
        assert_eq!(
            h.inner().get(REPLAYED_HEADER),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert_eq!(
            h.inner().get(REPLAYED_AT_HEADER),
            Some(&AMQPValue::LongString("2023-11-14T22:13:20.123Z".into()))
        );
        assert_eq!(replay_id_of(&c).as_deref(), Some("run-1"));
        assert_eq!(c.user_id(), &None, "a foreign user_id is dropped");
        assert_eq!(c.expiration(), &None);
        assert_eq!(c.delivery_mode(), &Some(2));
        assert_eq!(c.message_id(), original().message_id(), "bytes kept");
        assert_eq!(c.content_type(), original().content_type());
        // Replayed again: the count goes on.
        let again = replay_copy(&c, "guest", "run-2", 0);
        let h = again.headers().clone().unwrap();
        assert_eq!(
            h.inner().get(REPLAYED_HEADER),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(replay_id_of(&again).as_deref(), Some("run-2"));
        // The connection's own user is kept.
        let own = original().with_user_id("guest".into());
        assert_eq!(replay_copy(&own, "guest", "r", 0).user_id(), own.user_id());
    }

    #[test]
    fn a_replay_count_of_a_foreign_type_or_at_the_limit_does_not_break_the_copy() {
        let mut h = FieldTable::default();
        h.insert(REPLAYED_HEADER.into(), AMQPValue::LongString("many".into()));
        let p = BasicProperties::default().with_headers(h.clone());
        let c = replay_copy(&p, "guest", "r", 0);
        assert_eq!(
            c.headers().as_ref().unwrap().inner().get(REPLAYED_HEADER),
            Some(&AMQPValue::LongLongInt(1))
        );
        h.insert(REPLAYED_HEADER.into(), AMQPValue::LongLongInt(i64::MAX));
        let c = replay_copy(&BasicProperties::default().with_headers(h), "guest", "r", 0);
        assert_eq!(
            c.headers().as_ref().unwrap().inner().get(REPLAYED_HEADER),
            Some(&AMQPValue::LongLongInt(i64::MAX))
        );
        assert_eq!(replay_id_of(&BasicProperties::default()), None);
    }

    #[test]
    fn a_rotation_copy_is_the_message_with_its_remaining_retention() {
        let c = rotation_copy(&original(), "guest", Some(1234));
        assert_eq!(
            c.headers(),
            original().headers(),
            "every header, x-death included"
        );
        assert_eq!(c.delivery_mode(), &Some(1));
        assert_eq!(c.expiration().as_ref().map(|e| e.as_str()), Some("1234"));
        assert_eq!(c.user_id(), &None);
        assert_eq!(
            rotation_copy(&original(), "guest", None).expiration(),
            &None
        );
        let bare = rotation_copy(&BasicProperties::default(), "guest", None);
        assert_eq!(bare.delivery_mode(), &Some(2));
    }

    #[test]
    fn remaining_retention_never_extends_a_message_life_nor_ends_it() {
        const HOUR: u64 = 3_600_000;
        assert_eq!(remaining_retention(None, Some(0), 10), None);
        assert_eq!(
            remaining_retention(Some(HOUR), Some(10_000), 10_000 + HOUR / 2),
            Some(HOUR / 2)
        );
        // Spent, or nearly: the floor, never 0 or 1 ms (the broker would
        // drop the copy).
        for age in [HOUR - 1, HOUR, 2 * HOUR, 1000 * HOUR] {
            assert_eq!(
                remaining_retention(Some(HOUR), Some(10_000), 10_000 + age),
                Some(ROTATION_FLOOR_MS),
                "age {age}"
            );
        }
        // A retention shorter than the floor: the whole retention.
        assert_eq!(
            remaining_retention(Some(1000), Some(10_000), 99_999),
            Some(1000)
        );
        assert_eq!(remaining_retention(Some(1000), None, 99_999), Some(1000));
        // A time in the future (clock skew) keeps the whole retention.
        assert_eq!(
            remaining_retention(Some(1000), Some(20_000), 10_000),
            Some(1000)
        );
    }
}
