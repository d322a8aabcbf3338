//! The domain: restart requests and their outcomes. No I/O lives here.
//!
//! Raw bytes from a broker become a [`RestartRequest`] in exactly one place,
//! [`RestartRequest::parse`]; anything that does not parse becomes a
//! [`Rejection`] whose `Display` is the dead-letter reason. The rest of the
//! code never sees an unvalidated instance name or hostname.

mod joint_ack;
mod names;
mod outcome;
mod request;
pub(crate) mod signed;
mod time;

pub(crate) use joint_ack::JointAck;
pub(crate) use names::{Domain, Hostname, InstanceName, random_instance_name};
pub use outcome::Status;
pub(crate) use outcome::{Outcome, Restarted};
pub(crate) use request::{
    Asked, Reach, Rejection, WireRequest, new_message_id, printable, salvage_message_id,
};
#[cfg(test)]
use request::{MAX_REASON_CHARS, MAX_REQUESTED_BY_CHARS};
pub(crate) use request::{ParseRules, RestartRequest, unverified};
pub(crate) use signed::SigningKey;
pub(crate) use signed::{Signatures, Signer};
pub use time::Timestamp;

/// Valid requests for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
