//! A settled copy's properties kept as the bytes of their encoding, to
//! publish the same copy again when the broker refuses it.
//!
//! A publish consumes the properties it sends (lapin's `basic_publish`
//! takes them by value). So the worker's first try sends the settled
//! copy's own properties, and a try after a refusal sends them read back
//! from a [`Spare`] made before the first. Making one is one allocation
//! and the encoding lapin does anyway; a clone allocates every string and
//! table of the headers again, which on the retry path (a copy for every
//! message) cost the worker about 14 % of its throughput
//! (docs/benchmarks.md, "linear delivery path").

use amq_protocol::protocol::basic::{gen_properties, parse_properties};
use amq_protocol::protocol::BasicProperties;

use super::fit::properties_size;

/// A copy's properties as their AMQP encoding (the content header's
/// property flags and list), made by [`Spare::of`] and read back by
/// [`Spare::read`].
///
/// What a broker delivers and what dlqctl builds of it reads back whole
/// (see the tests). What would not: a header value of lapin's own
/// short-string type, which it encodes with a type byte the wire does not
/// have (no delivery carries one, and no copy gets one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spare {
    /// Empty (which does not read back) if the generator refused them.
    encoded: Vec<u8>,
}

impl Spare {
    /// Encodes `properties`, as lapin will for the publish.
    pub fn of(properties: &BasicProperties) -> Spare {
        let buffer = Vec::with_capacity(properties_size(properties));
        Spare {
            encoded: cookie_factory::gen(gen_properties(properties), buffer)
                .map(|(bytes, _)| bytes)
                .unwrap_or_default(),
        }
    }

    /// The properties encoded, equal to those [`Spare::of`] was given;
    /// `None` if they cannot be read back whole. Non-UTF-8 short strings
    /// come back as the same bytes (see [`crate::values::shortstr`]).
    pub fn read(&self) -> Option<BasicProperties> {
        match parse_properties(self.encoded.as_slice()) {
            Ok(([], properties)) => Some(properties),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::fit::tests::full_properties;
    use amq_protocol::types::{AMQPValue, FieldTable, LongString};

    #[test]
    fn every_property_and_value_reads_back_the_same() {
        let cases = [
            BasicProperties::default(),
            BasicProperties::default().with_headers(FieldTable::default()),
            full_properties(),
        ];
        for props in cases {
            let spare = Spare::of(&props);
            assert_eq!(
                spare.encoded.len(),
                properties_size(&props),
                "encoded in the size fit computes: {props:?}"
            );
            assert_eq!(spare.read(), Some(props.clone()), "{props:?}");
            // Read as often as the broker refuses.
            assert_eq!(spare.read(), Some(props));
        }
    }

    /// The one value that does not read back: lapin's own short-string
    /// type in a header (see [`Spare`]).
    #[test]
    fn a_short_string_header_value_does_not_read_back() {
        let mut t = FieldTable::default();
        t.insert(
            "k".into(),
            AMQPValue::ShortString(amq_protocol::types::ShortString::from("v")),
        );
        let spare = Spare::of(&BasicProperties::default().with_headers(t));
        assert_eq!(spare.read(), None);
    }

    #[test]
    fn bytes_that_do_not_read_back_whole_are_none() {
        let props = BasicProperties::default().with_headers({
            let mut t = FieldTable::default();
            t.insert("k".into(), AMQPValue::LongString(LongString::from("v")));
            t
        });
        let whole = Spare::of(&props).encoded;
        for cut in 0..whole.len() {
            let spare = Spare {
                encoded: whole[..cut].to_vec(),
            };
            assert_eq!(spare.read(), None, "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert_eq!(Spare { encoded: longer }.read(), None);
    }
}
