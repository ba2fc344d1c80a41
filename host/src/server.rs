//! The HTTP endpoint beside the controllers: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (caches synced and, with leader election, this
//! process is either leading or standing by ready to). Neither waits for modules to
//! load: they load in the background, a claim of a module still loading waits for it,
//! and a module that never loads must not keep the host from serving the others.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// What the endpoints report; shared with the controllers.
#[derive(Default)]
pub struct Health {
    /// Set once the informer caches have synced.
    pub ready: AtomicBool,
}

struct ServerState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds `address` and serves until `shutdown` resolves. Returns the bound address (the
/// port may be 0 to pick a free one) and the serving task.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(Arc::new(ServerState { metrics, health }));
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });
    Ok((bound, task))
}

async fn metrics_handler(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

async fn ready_handler(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    if state.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}
