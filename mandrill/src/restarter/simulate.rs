//! Simulated restarters, as in the tutorial: a random latency and a random
//! failure rate. One waits asynchronously; the other blocks its thread
//! (`std::thread::sleep`), to exercise the blocking bridge.

use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;

use super::{BlockingRestart, Reservation, RestartError, Restarter};
use crate::domain::{Hostname, RestartRequest, Restarted};

/// The simulated backend's behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Simulation {
    /// Shortest time a restart takes.
    pub min_latency: Duration,
    /// Longest time a restart takes; latencies are uniform in between.
    pub max_latency: Duration,
    /// Probability in `[0, 1]` that a restart fails.
    pub failure_rate: f64,
}

impl Simulation {
    /// Draws this restart's latency and whether it fails.
    fn draw(&self) -> (Duration, bool) {
        let mut rng = rand::rng();
        let latency = if self.max_latency > self.min_latency {
            rng.random_range(self.min_latency..=self.max_latency)
        } else {
            self.min_latency
        };
        let fails = self.failure_rate > 0.0 && rng.random_bool(self.failure_rate.min(1.0));
        (latency, fails)
    }

    fn result(host: &Hostname, fails: bool) -> Result<Restarted, RestartError> {
        if fails {
            Err(RestartError::failed(host, "simulated failure"))
        } else {
            Ok(Restarted::default())
        }
    }
}

/// Waits asynchronously, then succeeds or fails at random.
#[derive(Debug, Clone)]
pub(crate) struct SimulatedRestarter(pub Simulation);

#[async_trait]
impl Restarter for SimulatedRestarter {
    async fn restart(
        &self,
        request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let (latency, fails) = self.0.draw();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Simulation::result(&request.hostname, fails)
    }
}

/// Blocks its thread, then succeeds or fails at random. Wrap it in
/// [`super::Blocking`].
#[derive(Debug, Clone)]
pub(crate) struct SimulatedBlockingRestarter(pub Simulation);

impl BlockingRestart for SimulatedBlockingRestarter {
    fn restart_blocking(&self, request: &RestartRequest) -> Result<Restarted, RestartError> {
        let (latency, fails) = self.0.draw();
        std::thread::sleep(latency);
        Simulation::result(&request.hostname, fails)
    }
}
