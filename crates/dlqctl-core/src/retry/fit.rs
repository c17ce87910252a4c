//! Copies that fit the negotiated `frame_max`.
//!
//! A message's properties, headers included, travel in one content-header
//! frame, and a client drops the connection on a frame larger than
//! `frame_max` (lapin: `received large frame`). A copy dlqctl publishes must
//! fit, and must still fit when it is delivered back:
//!
//! - a **retry copy** is dead-lettered by its tier queue back to the main
//!   queue, and the broker then adds `x-death` (one entry: count, reason,
//!   queue, time, exchange, routing-keys, original-expiration),
//!   `x-first-death-{exchange,queue,reason}`, from 3.13
//!   `x-last-death-{exchange,queue,reason}`, and on a quorum queue
//!   `x-delivery-count` (and from 4.3 `x-acquired-count`). With every name
//!   at its 255-byte maximum these take 2,421 bytes; `BROKER_DEAD_LETTER_RESERVE` keeps 4 KiB free for them,
//!   plus the size of a `CC` header again (its routing keys are listed in
//!   `routing-keys` too);
//! - a **dead-letter copy** goes to the DLX by a plain publish, which adds
//!   no `x-death`; `DELIVERY_RESERVE` keeps room for a quorum DLQ's
//!   `x-delivery-count` and `x-acquired-count` (26 bytes each) when `peek`
//!   or `replay` read it.
//!
//! When a copy is too large, dlqctl's own history goes first:
//! `dlqctl-errors` loses its oldest entries (then the header), then
//! `dlqctl-last-error` is cut (then removed). A retry copy that still does
//! not fit is not published: the message is dead-lettered with reason
//! [`too_large`](super::DeadLetterReason::TooLarge). A dead-letter copy
//! that still does not fit keeps only `dlqctl-reason`, then nothing of
//! dlqctl's (the message's own properties are never changed).
//!
//! All sizes are exact for the encoding lapin uses (checked against its
//! generator in the tests), short strings counted in bytes on the wire.

use std::collections::BTreeMap;

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

use super::headers::WRITTEN_HEADERS;
use crate::values::shortstr;
use crate::values::text::truncate_utf8;
use crate::wire::{ERRORS_HEADER, LAST_ERROR_HEADER, REASON_HEADER};

/// Bytes of a content-header frame besides its properties: frame type 1,
/// channel 2, size 4, class id 2, weight 2, body size 8, frame end 1.
pub(crate) const HEADER_FRAME_OVERHEAD: usize = 20;

/// Room a retry copy leaves below `frame_max` for what the broker adds
/// when its tier dead-letters it (2,421 bytes at most, see the module
/// documentation), with margin.
pub(crate) const BROKER_DEAD_LETTER_RESERVE: usize = 4096;

/// Room a dead-letter copy leaves below `frame_max` for what the broker
/// adds when it delivers it (`x-delivery-count`, 26 bytes, and from 4.3
/// `x-acquired-count`, 26 bytes), with margin.
pub(crate) const DELIVERY_RESERVE: usize = 256;

/// The encoded size of `props` as the properties of a content-header frame:
/// the 2 property-flag bytes and every property present (a short string
/// 1 + its bytes, `headers` a field table, `delivery_mode` and `priority`
/// 1, `timestamp` 8).
pub fn properties_size(props: &BasicProperties) -> usize {
    let short = |s: Option<&amq_protocol::types::ShortString>| {
        s.map_or(0, |s| 1 + shortstr::wire_len(s.as_str()))
    };
    [
        2,
        short(props.content_type().as_ref()),
        short(props.content_encoding().as_ref()),
        props.headers().as_ref().map_or(0, table_size),
        props.delivery_mode().map_or(0, |_| 1),
        props.priority().map_or(0, |_| 1),
        short(props.correlation_id().as_ref()),
        short(props.reply_to().as_ref()),
        short(props.expiration().as_ref()),
        short(props.message_id().as_ref()),
        props.timestamp().map_or(0, |_| 8),
        short(props.kind().as_ref()),
        short(props.user_id().as_ref()),
        short(props.app_id().as_ref()),
        short(props.cluster_id().as_ref()),
    ]
    .into_iter()
    .fold(0, usize::saturating_add)
}

/// The encoded size of a field table: its 4-byte length and its entries.
pub(crate) fn table_size(table: &FieldTable) -> usize {
    table
        .inner()
        .iter()
        .map(|(k, v)| entry_size(k.as_str(), v))
        .fold(4, usize::saturating_add)
}

/// One table entry: the key (1 length byte + its bytes) and the value.
pub(crate) fn entry_size(key: &str, value: &AMQPValue) -> usize {
    (1 + shortstr::wire_len(key)).saturating_add(value_size(value))
}

/// One value: its type byte and payload (nested tables and arrays with
/// their 4-byte length).
pub(crate) fn value_size(value: &AMQPValue) -> usize {
    let payload = match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(s) => 1 + shortstr::wire_len(s.as_str()),
        AMQPValue::LongString(s) => 4usize.saturating_add(s.len()),
        AMQPValue::ByteArray(a) => 4usize.saturating_add(a.len()),
        AMQPValue::FieldArray(a) => a
            .as_slice()
            .iter()
            .map(value_size)
            .fold(4, usize::saturating_add),
        AMQPValue::FieldTable(t) => table_size(t),
        AMQPValue::Void => 0,
    };
    1 + payload
}

/// The most properties a copy may have on a connection with `frame_max`,
/// keeping `reserve` bytes free.
pub(crate) fn properties_budget(frame_max: u32, reserve: usize) -> usize {
    usize::try_from(frame_max)
        .unwrap_or(usize::MAX)
        .saturating_sub(HEADER_FRAME_OVERHEAD)
        .saturating_sub(reserve)
}

/// The budget of a retry copy: `BROKER_DEAD_LETTER_RESERVE` and a `CC`
/// header's size again are kept free.
pub fn retry_budget(props: &BasicProperties, frame_max: u32) -> usize {
    let cc = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("CC"))
        .map_or(0, value_size);
    properties_budget(frame_max, BROKER_DEAD_LETTER_RESERVE.saturating_add(cc))
}

/// The budget of a dead-letter copy: [`DELIVERY_RESERVE`] kept free.
pub(crate) fn dead_letter_budget(frame_max: u32) -> usize {
    properties_budget(frame_max, DELIVERY_RESERVE)
}

/// What was taken out of a copy to make it fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Oldest `dlqctl-errors` entries dropped.
    pub history_entries: usize,
    /// `dlqctl-errors` removed entirely.
    pub history_removed: bool,
    /// Bytes cut from the end of `dlqctl-last-error`.
    pub last_error_bytes: usize,
    /// `dlqctl-last-error` removed entirely.
    pub last_error_removed: bool,
    /// Every `dlqctl-*` header the copy writes removed but `dlqctl-reason`.
    pub dlqctl_headers_removed: bool,
    /// `dlqctl-reason` removed too.
    pub reason_removed: bool,
}

impl Trimmed {
    /// Whether anything was taken out.
    pub fn any(&self) -> bool {
        *self != Trimmed::default()
    }

    /// In words, for the log: `2 oldest dlqctl-errors entries dropped, …`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        parts.extend(header_cut(
            ERRORS_HEADER,
            self.history_removed,
            self.history_entries,
            |n| format!("{n} oldest {ERRORS_HEADER} entries dropped"),
        ));
        parts.extend(header_cut(
            LAST_ERROR_HEADER,
            self.last_error_removed,
            self.last_error_bytes,
            |n| format!("{LAST_ERROR_HEADER} cut by {n} bytes"),
        ));
        if self.dlqctl_headers_removed {
            parts.push(format!("every dlqctl header but {REASON_HEADER} removed"));
        }
        if self.reason_removed {
            parts.push(format!("{REASON_HEADER} removed"));
        }
        parts.join(", ")
    }
}

/// How one header was trimmed, in words: `removed`, else cut by `n`
/// (entries or bytes) as `cut` says it, else not at all.
fn header_cut(
    header: &str,
    removed: bool,
    n: usize,
    cut: impl FnOnce(usize) -> String,
) -> Option<String> {
    if removed {
        Some(format!("{header} removed"))
    } else if n > 0 {
        Some(cut(n))
    } else {
        None
    }
}

/// A copy that does not fit, even trimmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// The properties' size after every allowed trim, in bytes.
    pub size: usize,
    /// The budget it had to fit.
    pub budget: usize,
}

/// A retry copy made to fit [`retry_budget`]: `dlqctl-errors` trimmed
/// first, then `dlqctl-last-error`. `Err` when it still does not fit: the
/// message must then be dead-lettered (`too_large`).
pub fn fit_retry_copy(
    props: BasicProperties,
    frame_max: u32,
) -> Result<(BasicProperties, Trimmed), TooLarge> {
    let budget = retry_budget(&props, frame_max);
    let mut trimmed = Trimmed::default();
    let (props, size) = trim_history(props, budget, &mut trimmed);
    if size <= budget {
        Ok((props, trimmed))
    } else {
        Err(TooLarge { size, budget })
    }
}

/// A dead-letter copy made to fit [`dead_letter_budget`]: as
/// [`fit_retry_copy`], then every header dlqctl writes but `dlqctl-reason`
/// removed, then that too. `Err` when even the message's own properties do
/// not fit (the copy is then the most that can be kept, still within
/// `frame_max` itself when the original was).
pub(crate) fn fit_dead_letter_copy(
    props: BasicProperties,
    frame_max: u32,
) -> (BasicProperties, Trimmed, Result<(), TooLarge>) {
    let budget = dead_letter_budget(frame_max);
    let mut trimmed = Trimmed::default();
    let (mut props, mut size) = trim_history(props, budget, &mut trimmed);
    if size > budget {
        props = without_headers(props, |k| {
            WRITTEN_HEADERS.contains(&k) && k != REASON_HEADER
        });
        let after = properties_size(&props);
        trimmed.dlqctl_headers_removed = after < size;
        size = after;
    }
    if size > budget {
        props = without_headers(props, |k| k == REASON_HEADER);
        let after = properties_size(&props);
        trimmed.reason_removed = after < size;
        size = after;
    }
    let fits = if size <= budget {
        Ok(())
    } else {
        Err(TooLarge { size, budget })
    };
    (props, trimmed, fits)
}

/// Trims `dlqctl-errors` (oldest entries, then the header), then
/// `dlqctl-last-error` (its end, then the header), until `props` fit
/// `budget` or nothing of either is left. Returns them with their size
/// (measured once when they fit as they are, as most copies do).
fn trim_history(
    props: BasicProperties,
    budget: usize,
    trimmed: &mut Trimmed,
) -> (BasicProperties, usize) {
    let mut size = properties_size(&props);
    if size <= budget {
        return (props, size);
    }
    let Some(headers) = props.headers().as_ref() else {
        return (props, size);
    };
    let mut map: Vec<(ShortString, AMQPValue)> = headers
        .inner()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let pos = |map: &Vec<(ShortString, AMQPValue)>, key: &str| {
        map.iter().position(|(k, _)| k.as_str() == key)
    };

    if let Some(i) = pos(&map, ERRORS_HEADER) {
        if let AMQPValue::FieldArray(entries) = &map[i].1 {
            let mut entries = entries.as_slice().to_vec();
            while size > budget && !entries.is_empty() {
                let first = entries.remove(0);
                size -= value_size(&first);
                trimmed.history_entries += 1;
            }
            map[i].1 = AMQPValue::FieldArray(FieldArray::from(entries));
        }
        if size > budget {
            let (k, v) = map.remove(i);
            size -= entry_size(k.as_str(), &v);
            trimmed.history_removed = true;
        }
    }
    if size > budget {
        if let Some(i) = pos(&map, LAST_ERROR_HEADER) {
            let over = size - budget;
            let text = match &map[i].1 {
                AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
                _ => None,
            };
            match text {
                Some(text) if text.len() > over => {
                    let cut = truncate_utf8(text, text.len() - over);
                    trimmed.last_error_bytes = text.len() - cut.len();
                    map[i].1 = AMQPValue::LongString(LongString::from(cut));
                }
                _ => {
                    map.remove(i);
                    trimmed.last_error_removed = true;
                }
            }
        }
    }
    let props = props.with_headers(FieldTable::from(
        map.into_iter().collect::<BTreeMap<_, _>>(),
    ));
    let size = properties_size(&props);
    (props, size)
}

fn without_headers(props: BasicProperties, drop: impl Fn(&str) -> bool) -> BasicProperties {
    let Some(headers) = props.headers().as_ref() else {
        return props;
    };
    let kept = headers
        .inner()
        .iter()
        .filter(|(k, _)| !drop(k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<BTreeMap<_, _>>();
    props.with_headers(FieldTable::from(kept))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::values::shortstr::from_raw_bytes;
    use crate::wire::{ATTEMPT_HEADER, SOURCE_QUEUE_HEADER};
    use amq_protocol::types::{ByteArray, DecimalValue};

    /// What lapin writes for `props`.
    fn generated(props: &BasicProperties) -> usize {
        let (out, _) = cookie_factory::gen(
            amq_protocol::protocol::basic::gen_properties(props),
            Vec::new(),
        )
        .expect("generates");
        out.len()
    }

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    fn every_value() -> FieldTable {
        let mut inner = FieldTable::default();
        inner.insert(from_raw_bytes(b"\xff\xfe").into(), long("x"));
        let mut t = FieldTable::default();
        let values = vec![
            AMQPValue::Boolean(true),
            AMQPValue::ShortShortInt(-1),
            AMQPValue::ShortShortUInt(1),
            AMQPValue::ShortInt(-2),
            AMQPValue::ShortUInt(2),
            AMQPValue::LongInt(-3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(-4),
            AMQPValue::Float(1.5),
            AMQPValue::Double(2.5),
            AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 5 }),
            AMQPValue::LongString(LongString::from(vec![0xffu8, 0, 1])),
            AMQPValue::Timestamp(7),
            AMQPValue::ByteArray(ByteArray::from(vec![1u8, 2, 3])),
            AMQPValue::Void,
            AMQPValue::FieldTable(inner.clone()),
        ];
        t.insert(
            "array".into(),
            AMQPValue::FieldArray(FieldArray::from(values.clone())),
        );
        for (i, v) in values.into_iter().enumerate() {
            t.insert(format!("k{i}").into(), v);
        }
        t.insert(
            from_raw_bytes(b"bad\xc3").into(),
            AMQPValue::FieldTable(inner),
        );
        t
    }

    pub(crate) fn full_properties() -> BasicProperties {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(every_value())
            .with_delivery_mode(2)
            .with_priority(3)
            .with_correlation_id(from_raw_bytes(b"c\xff").into())
            .with_reply_to("reply".into())
            .with_expiration("1000".into())
            .with_message_id(from_raw_bytes(&[0xff; 255]).into())
            .with_timestamp(1_700_000_000)
            .with_type("t".into())
            .with_user_id("guest".into())
            .with_app_id("app".into())
            .with_cluster_id("c".into())
    }

    #[test]
    fn sizes_are_what_lapin_generates() {
        let cases = [
            BasicProperties::default(),
            BasicProperties::default().with_delivery_mode(2),
            BasicProperties::default().with_headers(FieldTable::default()),
            BasicProperties::default().with_message_id(from_raw_bytes(b"\xff\xfe-bad").into()),
            full_properties(),
        ];
        for props in cases {
            assert_eq!(properties_size(&props), generated(&props), "{props:?}");
        }
        // The table alone: what the generator writes for it.
        let t = every_value();
        let (out, _) = cookie_factory::gen(
            amq_protocol::types::generation::gen_field_table(&t),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(table_size(&t), out.len());
    }

    /// The broker's additions when a tier dead-letters a copy, with every
    /// name at its 255-byte maximum, fit the reserve.
    #[test]
    fn the_reserve_covers_what_the_broker_adds() {
        let name = long(&"n".repeat(255));
        let mut entry = FieldTable::default();
        entry.insert("count".into(), AMQPValue::LongLongInt(1));
        entry.insert("reason".into(), long("delivery_limit"));
        entry.insert("queue".into(), name.clone());
        entry.insert("time".into(), AMQPValue::Timestamp(1_700_000_000));
        entry.insert("exchange".into(), name.clone());
        entry.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![name.clone()])),
        );
        entry.insert("original-expiration".into(), name.clone());
        let mut added = FieldTable::default();
        added.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(entry)])),
        );
        for which in ["first", "last"] {
            added.insert(format!("x-{which}-death-exchange").into(), name.clone());
            added.insert(format!("x-{which}-death-queue").into(), name.clone());
            added.insert(
                format!("x-{which}-death-reason").into(),
                long("delivery_limit"),
            );
        }
        added.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1));
        let entries = table_size(&added) - 4;
        assert_eq!(entries, 2395);
        assert!(entries <= BROKER_DEAD_LETTER_RESERVE);
        // RabbitMQ 4.3 also counts every hand-off.
        added.insert("x-acquired-count".into(), AMQPValue::LongLongInt(1));
        let entries = table_size(&added) - 4;
        assert_eq!(entries, 2421);
        assert!(entries <= BROKER_DEAD_LETTER_RESERVE);
        // A quorum DLQ's delivery counters fit the delivery reserve.
        let counters = entry_size("x-delivery-count", &AMQPValue::LongLongInt(1))
            + entry_size("x-acquired-count", &AMQPValue::LongLongInt(1));
        assert!(counters <= DELIVERY_RESERVE);
    }

    #[test]
    fn budgets() {
        assert_eq!(properties_budget(131_072, 0), 131_052);
        assert_eq!(dead_letter_budget(131_072), 131_072 - 20 - 256);
        let p = BasicProperties::default();
        assert_eq!(retry_budget(&p, 131_072), 131_072 - 20 - 4096);
        // A CC header is reserved again (its keys are listed in x-death).
        let mut h = FieldTable::default();
        let cc = AMQPValue::FieldArray(FieldArray::from(vec![long("a.b")]));
        h.insert("CC".into(), cc.clone());
        let p = p.with_headers(h);
        assert_eq!(
            retry_budget(&p, 131_072),
            131_072 - 20 - 4096 - value_size(&cc)
        );
        // Tiny or zero frame_max: no budget, no panic.
        assert_eq!(dead_letter_budget(0), 0);
        assert_eq!(retry_budget(&p, 4096), 0);
    }

    /// A copy as `retry_copy` makes it: a big header of the producer's, and
    /// dlqctl's history of 5 errors and a last error.
    fn copy_with(big: usize) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert("big".into(), long(&"b".repeat(big)));
        h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(5));
        let entry = |i: i64| {
            let mut t = FieldTable::default();
            t.insert("attempt".into(), AMQPValue::LongLongInt(i));
            t.insert("time".into(), long("2023-11-14T22:13:20.123Z"));
            t.insert("error".into(), long(&"e".repeat(256)));
            AMQPValue::FieldTable(t)
        };
        h.insert(
            ERRORS_HEADER.into(),
            AMQPValue::FieldArray(FieldArray::from((1..=5).map(entry).collect::<Vec<_>>())),
        );
        h.insert(LAST_ERROR_HEADER.into(), long(&"é".repeat(500)));
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(h)
    }

    fn header<'a>(p: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
        p.headers().as_ref().and_then(|h| h.inner().get(key))
    }

    fn history_len(p: &BasicProperties) -> Option<usize> {
        match header(p, ERRORS_HEADER)? {
            AMQPValue::FieldArray(a) => Some(a.as_slice().len()),
            _ => None,
        }
    }

    #[test]
    fn a_copy_that_fits_is_unchanged() {
        let p = copy_with(1000);
        let (fitted, trimmed) = fit_retry_copy(p.clone(), 131_072).unwrap();
        assert_eq!(fitted, p);
        assert!(!trimmed.any());
        assert_eq!(trimmed.describe(), "");
    }

    #[test]
    fn the_history_goes_first_oldest_entry_first() {
        let full = properties_size(&copy_with(0));
        let entry = value_size(&{
            let AMQPValue::FieldArray(a) = header(&copy_with(0), ERRORS_HEADER).unwrap().clone()
            else {
                unreachable!()
            };
            a.as_slice()[0].clone()
        });
        // Over the budget by one byte: the oldest entry goes, nothing else.
        let budget = retry_budget(&copy_with(0), 131_072);
        let p = copy_with(budget - full + 1);
        let (fitted, trimmed) = fit_retry_copy(p, 131_072).unwrap();
        assert_eq!(history_len(&fitted), Some(4));
        let AMQPValue::FieldArray(a) = header(&fitted, ERRORS_HEADER).unwrap() else {
            unreachable!()
        };
        let AMQPValue::FieldTable(first) = &a.as_slice()[0] else {
            unreachable!()
        };
        assert_eq!(
            first.inner().get("attempt"),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(trimmed.history_entries, 1);
        assert!(properties_size(&fitted) <= budget);
        assert_eq!(trimmed.describe(), "1 oldest dlqctl-errors entries dropped");
        // Over by more than the entries: the header goes, then the last
        // error is cut on a character boundary.
        let p = copy_with(budget - full + 5 * entry + 40);
        let (fitted, trimmed) = fit_retry_copy(p, 131_072).unwrap();
        assert_eq!(history_len(&fitted), None);
        assert!(trimmed.history_removed);
        let AMQPValue::LongString(last) = header(&fitted, LAST_ERROR_HEADER).unwrap() else {
            unreachable!()
        };
        let last = std::str::from_utf8(last.as_bytes()).expect("cut on a boundary");
        assert!(last.len() < 1000 && !last.is_empty());
        assert!(trimmed.last_error_bytes > 0 && !trimmed.last_error_removed);
        assert!(properties_size(&fitted) <= budget);
        assert_eq!(
            header(&fitted, ATTEMPT_HEADER),
            Some(&AMQPValue::LongLongInt(5))
        );
    }

    #[test]
    fn a_retry_copy_that_cannot_fit_is_refused() {
        // The example of issue 13: a 130,200-byte header.
        let p = copy_with(130_200);
        let err = fit_retry_copy(p, 131_072).unwrap_err();
        assert_eq!(err.budget, 131_072 - 20 - 4096);
        assert!(err.size > err.budget);
        // The dead-letter copy of the same message fits, trimmed of dlqctl's
        // history only.
        let p = copy_with(130_200);
        let (fitted, trimmed, fits) = fit_dead_letter_copy(p, 131_072);
        assert_eq!(fits, Ok(()));
        assert!(trimmed.history_removed || trimmed.history_entries > 0);
        assert!(!trimmed.dlqctl_headers_removed);
        assert!(properties_size(&fitted) <= dead_letter_budget(131_072));
        assert_eq!(
            header(&fitted, ATTEMPT_HEADER),
            Some(&AMQPValue::LongLongInt(5))
        );
    }

    #[test]
    fn a_dead_letter_copy_keeps_the_reason_longest() {
        let with_reason = |big: usize| {
            let mut p = copy_with(big);
            let mut h = p.headers().clone().unwrap();
            h.insert(REASON_HEADER.into(), long("too_large"));
            h.insert(SOURCE_QUEUE_HEADER.into(), long("orders"));
            p = p.with_headers(h);
            p
        };
        let budget = dead_letter_budget(131_072);
        // Only the producer's header and dlqctl-reason fit.
        let reason = entry_size(REASON_HEADER, &long("too_large"));
        let bare = properties_size(&BasicProperties::default().with_delivery_mode(2)) + 4;
        let big_entry = |n: usize| entry_size("big", &long(&"b".repeat(n)));
        let n = budget - bare - reason - big_entry(0) + 5; // 5: the value's header
        assert_eq!(bare + reason + big_entry(n - 5), budget);
        let (fitted, trimmed, fits) = fit_dead_letter_copy(with_reason(n - 5), 131_072);
        assert_eq!(fits, Ok(()));
        assert!(trimmed.dlqctl_headers_removed && !trimmed.reason_removed);
        let keys: Vec<&str> = fitted
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(keys, vec!["big", REASON_HEADER]);
        // One byte more: dlqctl-reason goes too, the producer's header stays.
        let (fitted, trimmed, fits) = fit_dead_letter_copy(with_reason(n - 4), 131_072);
        assert_eq!(fits, Ok(()));
        assert!(trimmed.reason_removed);
        assert!(header(&fitted, "big").is_some());
        assert_eq!(fitted.delivery_mode(), &Some(2));
        // The producer's own properties are never cut: too large is said so.
        let (fitted, _, fits) = fit_dead_letter_copy(with_reason(budget), 131_072);
        assert!(header(&fitted, "big").is_some());
        let err = fits.unwrap_err();
        assert!(err.size > err.budget);
    }

    #[test]
    fn no_headers_no_panic() {
        let p = BasicProperties::default().with_message_id("m".into());
        assert_eq!(fit_retry_copy(p.clone(), 0).unwrap_err().budget, 0);
        let (fitted, trimmed, fits) = fit_dead_letter_copy(p.clone(), 0);
        assert_eq!(fitted, p);
        assert!(!trimmed.any());
        assert!(fits.is_err());
    }
}
