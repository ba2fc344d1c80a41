//! The Kubernetes client of the controller, with client-side rate limiting: kube-rs has
//! none of its own, and a provisioning storm must not flood the API server (the seed's
//! client-go QPS/burst, defaults 5/10).
//!
//! tower's `RateLimit` allows `burst` requests per window of `burst / qps` seconds: the
//! average is `qps`, a burst never exceeds `burst`. A watch counts once when it opens.

use std::time::Duration;

use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::limit::RateLimitLayer;

/// A client for `config` limited to `qps` requests per second on average, `burst` at
/// once.
pub fn rate_limited(config: Config, qps: u32, burst: u32) -> anyhow::Result<Client> {
    let (requests, window) = window(qps, burst);
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&RateLimitLayer::new(requests, window))
        .build())
}

/// The fixed window equivalent to a token bucket of `qps` and `burst`.
fn window(qps: u32, burst: u32) -> (u64, Duration) {
    let qps = qps.max(1);
    let burst = burst.max(1);
    (
        u64::from(burst),
        Duration::from_secs_f64(f64::from(burst) / f64::from(qps)),
    )
}

#[cfg(test)]
mod tests {
    use super::window;
    use std::time::Duration;

    #[test]
    fn window_keeps_the_average_and_the_burst() {
        assert_eq!(window(5, 10), (10, Duration::from_secs(2)));
        assert_eq!(window(100, 100), (100, Duration::from_secs(1)));
        assert_eq!(window(0, 0), (1, Duration::from_secs(1)));
    }
}
