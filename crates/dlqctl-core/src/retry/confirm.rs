//! The publisher's judgement of its confirms, as a pure function: from a
//! batch of publisher confirms to a verdict on each copy.
//!
//! lapin does not tie a `basic.return` to the publish it belongs to: it
//! hands the oldest waiting return to the next confirm it completes. So a
//! returned copy can read as a plain ack while another copy's confirm
//! carries its return. What holds is that the broker sends a copy's return
//! before its ack, and the confirm that takes that return resolves no later
//! than the copy's own. So the publisher judges a channel's confirms in
//! batches (every confirm resolved so far and not yet judged), and when
//! any confirm of a batch carries a return, no verdict on that channel can
//! be trusted: the channel is retired and every copy of the batch and
//! every copy still in flight on it is refused (to be published again
//! elsewhere; a duplicate is possible, a loss is not).

/// One publisher confirm as the judgement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// `basic.ack`, no return attached.
    Ack,
    /// `basic.nack`, no return attached (a full queue with reject-publish).
    Nack,
    /// A confirm (ack or nack) that carries a `basic.return`: reply code
    /// and text.
    Returned(String),
    /// The channel was not in confirm mode.
    NotRequested,
    /// The confirm failed (channel closed, connection lost).
    Failed(String),
}

/// Why a copy was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `basic.nack` from the broker (a full queue with reject-publish).
    Nacked,
    /// Returned as unroutable (`mandatory`).
    Returned(String),
    /// No confirm in time.
    Timeout,
    /// The channel failed (404 on a missing exchange, closed, retired, ...).
    Channel(String),
    /// The broker closed the channel because the message is over its
    /// `max_message_size`: no retry of the same copy can pass.
    TooLarge(String),
}

impl Refusal {
    /// The refusal of a channel that failed with `text`: [`Refusal::TooLarge`]
    /// when RabbitMQ says the message is over its size limit
    /// (`PRECONDITION_FAILED - message size N is larger than configured max
    /// size M`, the same on 3.x and 4.x; its reply code, 406, is shared
    /// with other refusals), else [`Refusal::Channel`].
    pub fn of_channel(text: String) -> Refusal {
        if text.contains("message size") && text.contains("larger than configured max size") {
            Refusal::TooLarge(text)
        } else {
            Refusal::Channel(text)
        }
    }

    /// This refusal as it concerns one copy of `body_len` bytes. The
    /// broker closes the whole channel for one message over its size
    /// limit, and every confirm in flight on that channel fails with the
    /// same text: a copy within the limit the text names is not the one
    /// refused, only a copy on a failed channel (published again).
    pub fn for_copy_of(self, body_len: usize) -> Refusal {
        match self {
            Refusal::TooLarge(text) => match max_size_in(&text) {
                Some(max) if body_len as u64 <= max => Refusal::Channel(text),
                _ => Refusal::TooLarge(text),
            },
            other => other,
        }
    }
}

/// The limit in RabbitMQ's "message size N is larger than configured max
/// size M" (the same on 3.x and 4.x).
fn max_size_in(text: &str) -> Option<u64> {
    let rest = text.split("larger than configured max size ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Nacked => {
                f.write_str("the broker nacked the copy (is the target queue full?)")
            }
            Refusal::Returned(why) => {
                write!(f, "the broker returned the copy as unroutable: {why}")
            }
            Refusal::Timeout => f.write_str("no publisher confirm in time"),
            Refusal::Channel(e) => write!(f, "publishing channel error: {e}"),
            Refusal::TooLarge(e) => write!(f, "the broker refuses a message this large: {e}"),
        }
    }
}

/// The verdict on one copy.
pub type Verdict = Result<(), Refusal>;

/// What the publisher does after judging a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Answer each copy of the batch (by its number) and go on.
    Answer(Vec<(u64, Verdict)>),
    /// Refuse every copy of the batch and every copy in flight on the
    /// channel with this refusal, and retire the channel.
    Retire(Refusal),
}

/// Judges one batch of confirms of a channel.
///
/// `retired_because` is set when the channel was already retired (a
/// publish timed out or failed on it): nothing on it can be trusted
/// either. A return anywhere in the batch retires it now.
pub fn judge_batch(batch: &[(u64, Confirm)], retired_because: Option<&str>) -> BatchOutcome {
    let returned = batch.iter().find_map(|(_, c)| match c {
        Confirm::Returned(why) => Some(why.as_str()),
        _ => None,
    });
    if let Some(why) = returned {
        return BatchOutcome::Retire(Refusal::Returned(format!(
            "{why}; returned on this channel, which is retired"
        )));
    }
    if let Some(because) = retired_because {
        return BatchOutcome::Retire(Refusal::Channel(format!("channel retired: {because}")));
    }
    BatchOutcome::Answer(
        batch
            .iter()
            .map(|(id, c)| {
                let verdict = match c {
                    Confirm::Ack => Ok(()),
                    Confirm::Nack => Err(Refusal::Nacked),
                    Confirm::NotRequested => {
                        Err(Refusal::Channel("publisher confirms are off".into()))
                    }
                    Confirm::Failed(e) => Err(Refusal::of_channel(e.clone())),
                    // Not reached: a return retires the channel above.
                    Confirm::Returned(why) => Err(Refusal::Returned(why.clone())),
                };
                (*id, verdict)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_batch_answers_each_copy_by_its_confirm() {
        let batch = [
            (1, Confirm::Ack),
            (2, Confirm::Nack),
            (3, Confirm::Failed("channel closed".into())),
            (4, Confirm::NotRequested),
        ];
        let BatchOutcome::Answer(v) = judge_batch(&batch, None) else {
            panic!("retired a clean batch");
        };
        assert_eq!(v[0], (1, Ok(())));
        assert_eq!(v[1], (2, Err(Refusal::Nacked)));
        assert!(matches!(&v[2], (3, Err(Refusal::Channel(e))) if e == "channel closed"));
        assert!(matches!(&v[3], (4, Err(Refusal::Channel(_)))));
        assert_eq!(
            Refusal::of_channel(
                "PRECONDITION_FAILED - message size 2000000 is larger than configured max size 1000000 (406)".into()
            ),
            Refusal::TooLarge(
                "PRECONDITION_FAILED - message size 2000000 is larger than configured max size 1000000 (406)".into()
            )
        );
        assert_eq!(
            Refusal::of_channel("NOT_FOUND - no exchange 'x' (404)".into()),
            Refusal::Channel("NOT_FOUND - no exchange 'x' (404)".into())
        );
    }

    #[test]
    fn a_size_refusal_is_only_the_copy_over_the_limit() {
        let text = "PRECONDITION_FAILED - message size 2000000 is larger than configured max size 1000000 (406)";
        let refused = Refusal::of_channel(text.into());
        // The copy that was over the limit, and one on the same channel
        // whose confirm failed with the same text.
        assert_eq!(
            refused.clone().for_copy_of(2_000_000),
            Refusal::TooLarge(text.into())
        );
        assert_eq!(
            refused.clone().for_copy_of(1_000_001),
            Refusal::TooLarge(text.into())
        );
        assert_eq!(
            refused.clone().for_copy_of(1_000_000),
            Refusal::Channel(text.into())
        );
        assert_eq!(refused.for_copy_of(10), Refusal::Channel(text.into()));
        // A text without a readable limit stays a size refusal; other
        // refusals are left as they are.
        let odd = "message size 5 is larger than configured max size lots";
        assert_eq!(
            Refusal::of_channel(odd.into()).for_copy_of(1),
            Refusal::TooLarge(odd.into())
        );
        assert_eq!(Refusal::Nacked.for_copy_of(1), Refusal::Nacked);
        assert_eq!(max_size_in(text), Some(1_000_000));
    }

    #[test]
    fn a_return_anywhere_refuses_the_whole_batch_even_the_acks() {
        // The return rode on copy 2's confirm, but may belong to copy 1
        // or 3: none of them may be answered as accepted.
        let batch = [
            (1, Confirm::Ack),
            (2, Confirm::Returned("312 NO_ROUTE".into())),
            (3, Confirm::Ack),
        ];
        match judge_batch(&batch, None) {
            BatchOutcome::Retire(Refusal::Returned(why)) => assert!(why.contains("312 NO_ROUTE")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_retired_channel_answers_nothing_as_accepted() {
        let batch = [(7, Confirm::Ack)];
        match judge_batch(&batch, Some("a confirm timed out")) {
            BatchOutcome::Retire(Refusal::Channel(why)) => {
                assert!(why.contains("a confirm timed out"))
            }
            other => panic!("{other:?}"),
        }
        // An empty batch on a retired channel (woken by the retire signal).
        assert!(matches!(
            judge_batch(&[], Some("a publish failed")),
            BatchOutcome::Retire(_)
        ));
        assert_eq!(judge_batch(&[], None), BatchOutcome::Answer(vec![]));
    }
}
