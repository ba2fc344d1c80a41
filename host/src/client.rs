//! The Kubernetes client of the controller: a client-side token bucket, since kube-rs has
//! none of its own and a provisioning storm must not flood the API server (the Go library's
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
//!
//! The bytes of every response body are counted too, by verb and resource
//! (`wasm_provisioner_kube_api_response_bytes_total`), and the watches open right now
//! (`wasm_provisioner_kube_api_watches_open`): what each instance costs the API server
//! in watch connections and traffic (docs/benchmarks.md, "Node-local mode").

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use tower::{BoxError, Layer, Service};

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

/// Response body bytes the host received from the API server, by verb and resource (a
/// watch's events count as they arrive). Registered by [`crate::metrics::Metrics`].
pub static KUBE_API_RESPONSE_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "wasm_provisioner_kube_api_response_bytes_total",
            "Bytes of Kubernetes API response bodies received by the host, by verb and resource",
        ),
        &["verb", "resource"],
    )
    .expect("valid counter")
});

/// Watches the host holds open on the API server right now, by resource. Registered by
/// [`crate::metrics::Metrics`].
pub static KUBE_API_WATCHES_OPEN: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    IntGaugeVec::new(
        Opts::new(
            "wasm_provisioner_kube_api_watches_open",
            "Kubernetes API watches the host holds open, by resource",
        ),
        &["resource"],
    )
    .expect("valid gauge")
});

/// A client for `config`: at most `burst` requests at once, `qps` per second on average
/// (each at least 1), every request counted.
pub fn rate_limited(config: Config, qps: u32, burst: u32) -> anyhow::Result<Client> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&TokenBucketLayer::new(qps, burst))
        .with_layer(&CountLayer)
        .build())
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

/// A tower layer that counts each request in [`KUBE_API_REQUESTS`], its response's bytes
/// in [`KUBE_API_RESPONSE_BYTES`] and, for a watch, the time it is open in
/// [`KUBE_API_WATCHES_OPEN`].
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
    type Response = Response<CountedBody<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<CountedBody<RB>>, BoxError>> + Send>>;

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
            let bytes = KUBE_API_RESPONSE_BYTES.with_label_values(&[verb, resource.as_str()]);
            let watch = (verb == "watch")
                .then(|| KUBE_API_WATCHES_OPEN.with_label_values(&[resource.as_str()]));
            Ok(response?.map(|body| CountedBody::new(body, bytes, watch)))
        })
    }
}

/// A response body whose data bytes are counted as they arrive; for a watch, the open
/// watches gauge is up while the body lives.
pub struct CountedBody<B> {
    inner: Pin<Box<B>>,
    bytes: IntCounter,
    watch: Option<IntGauge>,
}

impl<B> CountedBody<B> {
    fn new(inner: B, bytes: IntCounter, watch: Option<IntGauge>) -> Self {
        if let Some(open) = &watch {
            open.inc();
        }
        Self {
            inner: Box::pin(inner),
            bytes,
            watch,
        }
    }
}

impl<B> Drop for CountedBody<B> {
    fn drop(&mut self) {
        if let Some(open) = &self.watch {
            open.dec();
        }
    }
}

impl<B> Body for CountedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.bytes.inc_by(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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

    #[tokio::test]
    async fn a_body_counts_its_bytes_and_a_watch_is_open_while_it_lives() {
        use http_body_util::{BodyExt as _, Full};
        let bytes = IntCounter::new("bytes", "test").unwrap();
        let open = IntGauge::new("open", "test").unwrap();
        let body = CountedBody::new(
            Full::new(Bytes::from_static(b"{\"type\":\"ADDED\"}")),
            bytes.clone(),
            Some(open.clone()),
        );
        assert_eq!(open.get(), 1, "the watch is open while its body lives");
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.get(), collected.len() as u64);
        assert_eq!(open.get(), 0, "the watch closed with its body");
        // a request that is not a watch counts bytes only
        let body = CountedBody::new(Full::new(Bytes::from_static(b"{}")), bytes.clone(), None);
        drop(body);
        assert_eq!(open.get(), 0);
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
