//! Flow control: at most `max_in_flight` deliveries are handled at once.
//!
//! A semaphore holds the capacity; each handled delivery owns one permit. The
//! limit can change at run time (configuration reload): raising it adds
//! permits, lowering it forgets idle permits at once and the rest as their
//! deliveries finish (the "debt").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct FlowControl {
    permits: Arc<Semaphore>,
    limit: AtomicUsize,
    /// Permits to forget, rather than return, as deliveries finish.
    debt: AtomicUsize,
}

impl FlowControl {
    /// Capacity for `limit` deliveries at once (at least 1).
    pub(crate) fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit: AtomicUsize::new(limit),
            debt: AtomicUsize::new(0),
        }
    }

    /// The current limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Waits for capacity for one delivery.
    pub(crate) async fn acquire(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("flow-control semaphore is never closed")
    }

    /// Takes up to `extra` more permits into `permit` without waiting.
    pub(crate) fn top_up(&self, permit: &mut OwnedSemaphorePermit, extra: usize) {
        let extra = extra.min(self.permits.available_permits());
        if extra == 0 {
            return;
        }
        let extra = u32::try_from(extra).unwrap_or(u32::MAX);
        if let Ok(more) = self.permits.clone().try_acquire_many_owned(extra) {
            permit.merge(more);
        }
    }

    /// Returns permits: a finished delivery's, or those a pull took but did
    /// not use. Forgets as many as pay off debt: a permit dropped instead
    /// would keep a lowered limit from taking effect while pulls come back
    /// short (an idle queue's long polls hold `pull_batch` each).
    pub(crate) fn release(&self, mut permit: OwnedSemaphorePermit) {
        let held = permit.num_permits();
        let Ok(debt) = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (d > 0).then(|| d - d.min(held))
            })
        else {
            return;
        };
        let paid = debt.min(held);
        if paid == held {
            permit.forget();
        } else if let Some(paid) = permit.split(paid) {
            paid.forget();
        }
    }

    /// Changes the limit (at least 1).
    pub(crate) fn set_limit(&self, new_limit: usize) {
        let new_limit = new_limit.max(1);
        let old_limit = self.limit.swap(new_limit, Ordering::AcqRel);
        if new_limit > old_limit {
            let mut grow = new_limit - old_limit;
            // Cancel outstanding debt before adding permits.
            while grow > 0 {
                let debt = self.debt.load(Ordering::Acquire);
                let pay = debt.min(grow);
                if pay == 0 {
                    break;
                }
                if self
                    .debt
                    .compare_exchange(debt, debt - pay, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    grow -= pay;
                }
            }
            self.permits.add_permits(grow);
        } else if new_limit < old_limit {
            let shrink = old_limit - new_limit;
            let forgotten = self.permits.forget_permits(shrink);
            self.debt.fetch_add(shrink - forgotten, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lowering_the_limit_takes_effect_as_work_finishes() {
        let flow = FlowControl::new(3);
        let held: Vec<_> = [
            flow.acquire().await,
            flow.acquire().await,
            flow.acquire().await,
        ]
        .into();
        flow.set_limit(1);
        let mut held = held.into_iter();
        // Two finish: both permits are forgotten (debt), none returned.
        flow.release(held.next().unwrap());
        flow.release(held.next().unwrap());
        assert_eq!(flow.permits.available_permits(), 0);
        // The last one finishes: the single permit of the new limit returns.
        flow.release(held.next().unwrap());
        assert_eq!(flow.permits.available_permits(), 1);
        flow.set_limit(4);
        assert_eq!(flow.permits.available_permits(), 4);
    }

    /// The permits a pull took but did not use pay debt too: a limit
    /// lowered while long polls held a batch's worth each takes effect when
    /// they come back short, not only as deliveries finish.
    #[tokio::test]
    async fn permits_a_pull_did_not_use_pay_debt() {
        let flow = FlowControl::new(100);
        let mut pulling = flow.acquire().await;
        flow.top_up(&mut pulling, 31);
        flow.set_limit(4);
        assert_eq!(flow.permits.available_permits(), 0, "28 owed");
        flow.release(pulling);
        assert_eq!(flow.permits.available_permits(), 4);
        assert_eq!(flow.debt.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn raising_the_limit_pays_debt_first() {
        let flow = FlowControl::new(2);
        let a = flow.acquire().await;
        let _b = flow.acquire().await;
        flow.set_limit(1); // debt 1
        flow.set_limit(2); // debt paid, no new permit
        assert_eq!(flow.permits.available_permits(), 0);
        flow.release(a);
        assert_eq!(flow.permits.available_permits(), 1);
    }
}
