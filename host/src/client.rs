//! The Kubernetes client of the controller: a client-side token bucket, since kube-rs has
//! none of its own and a provisioning storm must not flood the API server (the seed's
//! client-go QPS/burst), and a count of every request by verb, resource and status code
//! (`wasm_provisioner_kube_api_requests_total`), so the host's own API cost per volume
//! can be read without access to the API server's metrics.
//!
//! The bucket is client-go's `tokenBucketRateLimiter`: it starts full with `burst`
//! tokens, a request takes one, and one token comes back every `1 / qps` seconds, never
//! more than `burst` in the bucket. So after a quiet period `burst` requests go at once,
//! then `qps` per second. (governor's GCRA is that bucket, kept as one timestamp.) A
//! watch counts once, when it opens. kube's client serialises every request through one
//! buffered service, so waiting in `poll_ready` orders requests first come, first served.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Method, Request, Response};
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use prometheus::{IntCounterVec, Opts};
use rustls::pki_types::ServerName;
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

/// Requests the host sent to the API server, by verb (Kubernetes' words: get, list,
/// watch, create, update, patch, delete, deletecollection), resource (with
/// `/subresource`) and HTTP status code (`error` when no response came). Registered by
/// [`crate::metrics::Metrics`].
pub static KUBE_API_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "wasm_provisioner_kube_api_requests_total",
            "Kubernetes API requests sent by the host, by verb, resource and status code",
        ),
        &["verb", "resource", "code"],
    )
    .expect("valid counter")
});

/// A client for `config`: at most `burst` requests at once, `qps` per second on average
/// (each at least 1), every request counted, over HTTP/2 when the API server offers it
/// ([`connection`]).
pub fn rate_limited(config: Config, qps: u32, burst: u32) -> anyhow::Result<Client> {
    Ok(connection(config)?
        .with_layer(&TokenBucketLayer::new(qps, burst))
        .with_layer(&CountLayer)
        .build())
}

/// kube's service stack (`kube::client::ClientBuilder::try_from`), boxed as kube boxes it.
type Connection = BoxService<Request<kube::client::Body>, Response<Box<DynBody>>, BoxError>;

/// How long an HTTP/2 connection with requests or watches open may stay silent before
/// it is pinged, and how long the ping's answer may take before the connection is
/// dropped and its watches reopen on a new one: client-go's `ReadIdleTimeout` and
/// `PingTimeout`.
const HTTP2_PING_AFTER: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// HTTP/2 flow-control windows, Go's transport's: what one stream (a watch, a list) may
/// have unread, and what all of them together may. With hyper's 5 MiB for the
/// connection, two or three watches whose events wait to be read could stall every
/// other request on it.
const HTTP2_STREAM_WINDOW: u32 = 4 << 20;
const HTTP2_CONNECTION_WINDOW: u32 = 1 << 30;

/// kube's service stack for `config`, but speaking HTTP/2 when the API server offers it
/// (ALPN), as client-go does. kube's own connector speaks HTTP/1.1 only: one connection
/// per request in flight, so the head of a provisioning storm waits for new TLS
/// connections (seven in a 500-claim burst) while the watches' connections sit idle.
/// Over HTTP/2 every request and watch shares one connection, warm from the start.
///
/// Behind a proxy (`proxy_url`) or with an exec credential plugin (whose client
/// certificate kube renews), kube's own stack is used unchanged.
fn connection(config: Config) -> anyhow::Result<ClientBuilder<Connection>> {
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        return Ok(ClientBuilder::try_from(config)?);
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(FixedServerNameResolver::new(
            ServerName::try_from(name.clone())
                .map_err(|error| anyhow::anyhow!("tls-server-name {name:?}: {error}"))?,
        )),
        None => tls,
    };
    let mut connector = TimeoutConnector::new(tls.enable_all_versions().wrap_connector(tcp));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(HTTP2_PING_AFTER)
        .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
        .http2_initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .http2_initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http)
        .map_response(|response| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

/// The token bucket of `qps` and `burst`: one token every `1 / qps` s, at most `burst`
/// held (0 is taken as 1 for both).
pub fn quota(qps: u32, burst: u32) -> Quota {
    let qps = NonZeroU32::new(qps).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(qps).allow_burst(burst)
}

/// A tower layer that makes each request wait for a token of one shared bucket.
#[derive(Clone)]
pub struct TokenBucketLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl TokenBucketLayer {
    pub fn new(qps: u32, burst: u32) -> Self {
        Self {
            limiter: Arc::new(RateLimiter::direct(quota(qps, burst))),
        }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucket<S>;

    fn layer(&self, inner: S) -> TokenBucket<S> {
        TokenBucket {
            inner,
            limiter: self.limiter.clone(),
            wait: None,
            token: false,
        }
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The service of [`TokenBucketLayer`]: ready once it holds a token and the inner service
/// is ready; `call` spends the token.
pub struct TokenBucket<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    wait: Option<Wait>,
    /// A token taken for the next `call`.
    token: bool,
}

impl<S, R> Service<R> for TokenBucket<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.token {
            let wait = self.wait.get_or_insert_with(|| {
                let limiter = self.limiter.clone();
                Box::pin(async move { limiter.until_ready().await })
            });
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
            self.token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        assert!(self.token, "poll_ready must succeed before call");
        self.token = false;
        self.inner.call(request)
    }
}

/// A tower layer that counts each request in [`KUBE_API_REQUESTS`].
#[derive(Clone, Copy)]
pub struct CountLayer;

impl<S> Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count { inner }
    }
}

pub struct Count<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for Count<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = verb_and_resource(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await.map_err(Into::into);
            let code = match &response {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            KUBE_API_REQUESTS
                .with_label_values(&[verb, resource.as_str(), code.as_str()])
                .inc();
            response
        })
    }
}

/// The API server's verb and resource (`resource` or `resource/subresource`) of a
/// request, as in the API server's own `apiserver_request_total`; `("", path)` for a
/// path that is not a resource (`/version`, discovery).
pub fn verb_and_resource(
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return ("", path.to_string()),
    };
    let rest = match rest {
        // a namespaced resource, or the namespace object itself and its subresources
        ["namespaces", _namespace, resource, tail @ ..] => {
            let mut all = vec![*resource];
            all.extend_from_slice(tail);
            all
        }
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [] => return ("", path.to_string()),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    let watch = query
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;
    use std::time::Duration;

    /// A bucket on a clock the test moves.
    type TestLimiter = RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        FakeRelativeClock,
        governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
    >;

    /// How many requests the bucket lets through right now.
    fn drain(limiter: &TestLimiter) -> u32 {
        let mut n = 0;
        while limiter.check().is_ok() {
            n += 1;
            assert!(n < 1_000_000, "the bucket never empties");
        }
        n
    }

    #[test]
    fn the_bucket_starts_full_then_refills_at_the_rate() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(quota(5, 10), clock.clone());
        // the whole burst at once, not one more
        assert_eq!(drain(&limiter), 10);
        // then one token per 1/qps = 200 ms
        let wait = limiter.check().unwrap_err();
        assert_eq!(
            wait.wait_time_from(governor::clock::Clock::now(&clock)),
            Duration::from_millis(200)
        );
        clock.advance(Duration::from_millis(199));
        assert_eq!(drain(&limiter), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(drain(&limiter), 1);
        clock.advance(Duration::from_secs(1));
        assert_eq!(drain(&limiter), 5, "qps tokens per second");
        // a long quiet period refills no more than the burst
        clock.advance(Duration::from_secs(3600));
        assert_eq!(drain(&limiter), 10);
    }

    #[test]
    fn sustained_rate_is_qps_after_the_burst() {
        // 60 s at qps 50 burst 100: 100 + 60 * 50 requests
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(quota(50, 100), clock.clone());
        let mut total = drain(&limiter);
        for _ in 0..600 {
            clock.advance(Duration::from_millis(100));
            total += drain(&limiter);
        }
        assert_eq!(total, 100 + 60 * 50);
    }

    #[test]
    fn zero_means_one() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(quota(0, 0), clock.clone());
        assert_eq!(drain(&limiter), 1);
        clock.advance(Duration::from_secs(1));
        assert_eq!(drain(&limiter), 1);
    }

    #[tokio::test]
    async fn the_layer_waits_for_tokens() {
        use tower::ServiceExt as _;
        // burst 5 at once, then 5 more at 50/s: about 100 ms
        let mut service = TokenBucketLayer::new(50, 5)
            .layer(tower::service_fn(|(): ()| async { Ok::<_, BoxError>(()) }));
        let started = std::time::Instant::now();
        for _ in 0..5 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "the burst waits for nothing"
        );
        for _ in 0..5 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(90) && elapsed < Duration::from_secs(2),
            "{elapsed:?}"
        );
    }

    #[test]
    fn verbs_and_resources_as_the_api_server_names_them() {
        let cases = [
            (
                Method::POST,
                "/api/v1/persistentvolumes",
                None,
                ("create", "persistentvolumes"),
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumes/pvc-1",
                None,
                ("get", "persistentvolumes"),
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumes",
                Some("limit=500"),
                ("list", "persistentvolumes"),
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumeclaims",
                Some("allowWatchBookmarks=true&watch=true&resourceVersion=1"),
                ("watch", "persistentvolumeclaims"),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/persistentvolumeclaims/c",
                None,
                ("patch", "persistentvolumeclaims"),
            ),
            (
                Method::PUT,
                "/api/v1/persistentvolumes/pvc-1/status",
                None,
                ("update", "persistentvolumes/status"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events",
                None,
                ("create", "events"),
            ),
            (
                Method::PATCH,
                "/apis/coordination.k8s.io/v1/namespaces/k/leases/l",
                Some("fieldManager=x"),
                ("patch", "leases"),
            ),
            (
                Method::DELETE,
                "/api/v1/persistentvolumes/pvc-1",
                None,
                ("delete", "persistentvolumes"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a",
                None,
                ("get", "namespaces"),
            ),
            (Method::GET, "/version", None, ("", "/version")),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                verb_and_resource(&method, path, query),
                (verb, resource.to_string()),
                "{method} {path}"
            );
        }
    }
}
