//! The deliveries a pause for the idempotency store drains from the
//! cancelled consumer (docs/worker.md, "Idempotent handling"): each runs
//! (a keyed one is handed back, one without a key runs unguarded) under
//! a permit of `--concurrency`, like every delivery.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::delivery::DeliveryTask;
use crate::handler::Handler;

/// Where the deliveries a pause for the store drains are run: on the
/// session's tracker, each under a permit of the session's `--concurrency`
/// (taken in its task, so that draining does not wait for handlers).
pub(super) struct Drained<'a, H: Handler> {
    pub(super) tracker: &'a TaskTracker,
    pub(super) template: &'a DeliveryTask<H>,
    pub(super) permits: &'a Arc<Semaphore>,
}

impl<H: Handler> Drained<'_, H> {
    /// Runs `d` once a permit is free.
    pub(super) fn spawn(&self, d: lapin::message::Delivery) {
        let task = self.template.clone();
        self.tracker
            .spawn(under_permit(self.permits.clone(), task.process(d, None)));
    }
}

/// `work`, run once a permit of `permits` is free, the permit held until
/// it ends (never closed: a closed semaphore runs it without one).
async fn under_permit<F: std::future::Future<Output = ()>>(permits: Arc<Semaphore>, work: F) {
    let _permit = permits.acquire_owned().await.ok();
    work.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A drained delivery waits for a permit: with every permit taken,
    /// its work does not start until one is given back.
    #[tokio::test]
    async fn drained_work_waits_for_a_permit() {
        let permits = Arc::new(Semaphore::new(1));
        let held = permits.clone().acquire_owned().await.unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let flag = started.clone();
        let tracker = TaskTracker::new();
        tracker.spawn(under_permit(permits.clone(), async move {
            flag.store(true, Ordering::SeqCst);
        }));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!started.load(Ordering::SeqCst), "ran without a permit");
        drop(held);
        tracker.close();
        tracker.wait().await;
        assert!(started.load(Ordering::SeqCst));
        assert_eq!(permits.available_permits(), 1);
    }
}
