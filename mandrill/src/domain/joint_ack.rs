//! An ack that a store may commit together with the outcome it settles.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// An ack of one delivery that a store can commit in the very transaction
/// that records the message's outcome, when the broker and the store keep
/// their data in one database: the ack is then never durable before the
/// outcome, and a failed transaction fails both. Obtained from the broker
/// seam's `Consumer::joint_ack`, spent by the store seam's
/// `Store::record_outcome_acking` (the domain names neither seam).
///
/// Opaque: it carries whatever the adapter that made it put in, and only
/// that adapter, which knows the type, can [`open`](Self::open) it. A store
/// that cannot open it records the outcome alone, and the caller acks.
#[derive(Clone)]
pub(crate) struct JointAck(Arc<dyn Any + Send + Sync>);

impl JointAck {
    /// Wraps an adapter's own description of the ack.
    pub(crate) fn new<T: Any + Send + Sync>(ack: T) -> Self {
        Self(Arc::new(ack))
    }

    /// The adapter's description, if this ack holds a `T`.
    pub(crate) fn open<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for JointAck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JointAck").finish_non_exhaustive()
    }
}
