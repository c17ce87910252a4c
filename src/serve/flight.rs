//! Reads of one DLQ that the pages ask for at the same time share one read.
//!
//! A page read takes the DLQ's gate and reads the whole DLQ (a summary) or
//! up to its page of it (a peek), so two reads of one DLQ never run at once:
//! without sharing, a hundred browsers opening the DLQ page would wait for a
//! hundred reads, one after the other. A request that finds the same read
//! (same DLQ, same question) already under way waits for it and takes its
//! answer instead of queueing a read of its own. A request that comes after
//! the read has ended starts a new one: nothing is kept here, what is kept
//! (the last summary) lives in [`super::state`].
//!
//! The first request of a read does the read. When that request goes away
//! before the read ends (a browser closed mid-load), the requests waiting
//! on it start over, and one of them does the read.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use dlqctl::error::{Error, Result};

/// The reads under way, by what they read.
pub(crate) struct Flights<K, T> {
    under_way: Mutex<HashMap<K, watch::Sender<Option<Shared<T>>>>>,
}

/// What a read ended with, for every request that waited on it.
type Shared<T> = std::result::Result<T, Arc<Error>>;

impl<K: Eq + Hash + Clone, T: Clone> Default for Flights<K, T> {
    fn default() -> Self {
        Flights {
            under_way: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, T: Clone> Flights<K, T> {
    /// The answer of the read `key` under way, or of `read`, run now when
    /// none is.
    pub(crate) async fn join<F>(&self, key: K, read: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let mut read = Some(read);
        loop {
            let waiting = {
                let mut under_way = self.under_way.lock().unwrap_or_else(|e| e.into_inner());
                match under_way.get(&key) {
                    Some(tx) => Some(tx.subscribe()),
                    None => {
                        under_way.insert(key.clone(), watch::channel(None).0);
                        None
                    }
                }
            };
            let Some(mut rx) = waiting else {
                let leader = Leader {
                    flights: self,
                    key: key.clone(),
                };
                let read = read.take().expect("only the leader reads, and it returns");
                let answer = read.await;
                leader.done(match &answer {
                    Ok(t) => Ok(t.clone()),
                    Err(e) => Err(Arc::new(copy_error(e))),
                });
                return answer;
            };
            // `wait_for` fails when the leader went away before answering:
            // start over (and maybe lead).
            let answer = rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|a| a.clone());
            if let Some(answer) = answer {
                return answer.map_err(|e| copy_error(&e));
            }
        }
    }

    /// How many reads are under way (for tests).
    #[cfg(test)]
    fn under_way(&self) -> usize {
        self.under_way.lock().unwrap().len()
    }
}

/// The request doing a read: it gives the answer to the others, or, when
/// dropped before that, lets them start over.
struct Leader<'a, K: Eq + Hash + Clone, T: Clone> {
    flights: &'a Flights<K, T>,
    key: K,
}

impl<K: Eq + Hash + Clone, T: Clone> Leader<'_, K, T> {
    fn done(self, answer: Shared<T>) {
        let tx = self.take();
        if let Some(tx) = tx {
            tx.send_replace(Some(answer));
        }
    }

    fn take(&self) -> Option<watch::Sender<Option<Shared<T>>>> {
        let mut under_way = self
            .flights
            .under_way
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        under_way.remove(&self.key)
    }
}

impl<K: Eq + Hash + Clone, T: Clone> Drop for Leader<'_, K, T> {
    fn drop(&mut self) {
        // After `done` the entry is gone already; before it, dropping the
        // sender wakes the waiting requests, which start over.
        drop(self.take());
    }
}

/// The same error again, for each request that shared a read.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Invalid(i) => Error::Invalid(i.clone()),
        Error::Store(e) => Error::Store(e.clone()),
        Error::Read { path, source } => Error::Read {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Url { url, reason } => Error::Url {
            url: url.clone(),
            reason: reason.clone(),
        },
        Error::Connect {
            endpoint,
            reason,
            hint,
            unreachable,
        } => Error::Connect {
            endpoint: endpoint.clone(),
            reason: reason.clone(),
            hint: hint.clone(),
            unreachable: *unreachable,
        },
        Error::Broker { context, message } => Error::Broker {
            context: context.clone(),
            message: message.clone(),
        },
        Error::Busy { queue, message } => Error::Busy {
            queue: queue.clone(),
            message: message.clone(),
        },
        Error::Management { url, message } => Error::Management {
            url: url.clone(),
            message: message.clone(),
        },
        Error::Write { what, source } => Error::Write {
            what: what.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Usage(m) => Error::Usage(m.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    async fn read(
        reads: &AtomicUsize,
        gate: Arc<tokio::sync::Notify>,
        answer: Result<u32>,
    ) -> Result<u32> {
        reads.fetch_add(1, Ordering::SeqCst);
        gate.notified().await;
        answer
    }

    #[tokio::test]
    async fn requests_during_a_read_share_its_answer() {
        let flights: Flights<&str, u32> = Flights::default();
        let reads = AtomicUsize::new(0);
        let gate = Arc::new(tokio::sync::Notify::new());
        let all = futures_util::future::join_all(
            (0..10).map(|i| flights.join("dlq", read(&reads, gate.clone(), Ok(i)))),
        );
        let opener = async {
            while flights.under_way() == 0 || reads.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            // Every request has joined by now: they all ran until they wait.
            tokio::time::sleep(Duration::from_millis(20)).await;
            gate.notify_waiters();
        };
        let (answers, ()) = tokio::join!(all, opener);
        let answers: Vec<u32> = answers.into_iter().map(|a| a.unwrap()).collect();
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read for ten requests");
        assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
        assert_eq!(flights.under_way(), 0);
    }

    #[tokio::test]
    async fn other_keys_read_on_their_own_and_a_later_request_reads_again() {
        let flights: Flights<&str, u32> = Flights::default();
        assert_eq!(flights.join("a", async { Ok(1) }).await.unwrap(), 1);
        assert_eq!(flights.join("a", async { Ok(2) }).await.unwrap(), 2);
        assert_eq!(flights.join("b", async { Ok(3) }).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn an_error_reaches_every_request_that_shared_the_read() {
        let flights: Flights<&str, u32> = Flights::default();
        let reads = AtomicUsize::new(0);
        let gate = Arc::new(tokio::sync::Notify::new());
        let busy = || Error::Busy {
            queue: "q.dlq".into(),
            message: "held".into(),
        };
        let all = futures_util::future::join_all(
            (0..3).map(|_| flights.join("dlq", read(&reads, gate.clone(), Err(busy())))),
        );
        let opener = async {
            while reads.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            gate.notify_waiters();
        };
        let (answers, ()) = tokio::join!(all, opener);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        for a in answers {
            assert!(matches!(a, Err(Error::Busy { .. })), "{a:?}");
        }
    }

    #[tokio::test]
    async fn when_the_reading_request_goes_away_a_waiting_one_reads() {
        let flights: Arc<Flights<&'static str, u32>> = Arc::new(Flights::default());
        let f = flights.clone();
        let first =
            tokio::spawn(async move { f.join("dlq", std::future::pending::<Result<u32>>()).await });
        while flights.under_way() == 0 {
            tokio::task::yield_now().await;
        }
        let f = flights.clone();
        let second = tokio::spawn(async move { f.join("dlq", async { Ok(2) }).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !second.is_finished(),
            "the second request waits for the first read"
        );
        first.abort();
        let answer = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert_eq!(
            answer.expect("the second request reads").unwrap().unwrap(),
            2
        );
        assert_eq!(flights.under_way(), 0);
    }
}
