//! The outbound HTTP capability: `wasi:http` requests checked against a module's grants.
//!
//! `wasi:http` is linked for every module, so a guest that imports it still loads; a
//! module without an HTTP grant has every request refused (`HTTP-request-denied`). A
//! granted request must match a grant's scheme, host and port exactly, and its host must
//! not resolve to a link-local, unspecified, multicast or cloud-metadata address.
//!
//! Known limit: the name is resolved once for the check and again to connect, so a
//! granted name whose DNS an attacker controls could rebind; grant names you trust.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::grants::HttpGrant;

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(::http::Response<WasiBody>, IoFuture), Error>> + Send>;

/// The `wasi:http` hooks of one call.
pub(crate) struct OutboundHttp {
    pub(crate) module: Arc<str>,
    pub(crate) grants: Arc<[HttpGrant]>,
    /// Bound on connect and response waits: the call's own budget.
    pub(crate) timeout: Duration,
}

impl WasiHttpHooks for OutboundHttp {
    fn send_request(
        &mut self,
        request: ::http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        let uri = request.uri().clone();
        let scheme = uri.scheme_str().unwrap_or("").to_ascii_lowercase();
        let host = uri.host().unwrap_or("").to_string();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        let module = self.module.clone();

        // `user@host`: the grant matches `host`, but the connection would resolve the
        // whole authority (`user@host`), a name the guest chose and the destination
        // check below never saw. Grants refuse user information; so do requests.
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            tracing::warn!(
                module = %module,
                scheme, host, port,
                "refused outbound HTTP request: user information in the authority \
                 (user@host) is not allowed; send credentials in a header"
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }

        if !self
            .grants
            .iter()
            .any(|grant| grant.allows(&scheme, &host, port))
        {
            tracing::warn!(
                module = %module,
                scheme, host, port,
                "refused outbound HTTP request: no grant covers {scheme}://{host}:{port}; \
                 an admin can add one under modules.{module}.http in the grants file"
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }

        let timeout = self.timeout;
        let options = bounded_options(options, timeout);
        Box::new(async move {
            let lookup_host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let addresses = tokio::time::timeout(
                timeout,
                tokio::net::lookup_host((lookup_host.as_str(), port)),
            )
            .await
            .map_err(|_| Error::DnsTimeout)?
            .map_err(|error| Error::DnsError {
                rcode: Some(error.to_string()),
                info_code: None,
            })?;
            for address in addresses {
                if is_forbidden_destination(address.ip()) {
                    tracing::warn!(
                        module = %module, host, address = %address.ip(),
                        "refused outbound HTTP request: {host} resolves to a link-local, \
                         metadata or otherwise prohibited address"
                    );
                    return Err(Error::DestinationIpProhibited);
                }
            }
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            Ok((
                response.map(|body| body.boxed_unsync()),
                Box::new(io) as IoFuture,
            ))
        })
    }
}

fn bounded_options(options: Option<RequestOptions>, timeout: Duration) -> RequestOptions {
    let options = options.unwrap_or_default();
    let bound = |asked: Option<Duration>| Some(asked.map_or(timeout, |asked| asked.min(timeout)));
    RequestOptions {
        connect_timeout: bound(options.connect_timeout),
        first_byte_timeout: bound(options.first_byte_timeout),
        between_bytes_timeout: bound(options.between_bytes_timeout),
    }
}

/// Addresses no grant can reach: link-local (which holds the cloud metadata services,
/// 169.254.169.254 and fd00:ec2::254), unspecified, multicast and broadcast.
pub(crate) fn is_forbidden_destination(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_forbidden_destination(IpAddr::V4(v4));
            }
            let segments = v6.segments();
            // NAT64's well-known prefix (64:ff9b::/96, RFC 6052): a DNS64 resolver
            // answers it for an IPv4-only name, and the gateway connects to the IPv4
            // address in its last 32 bits.
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., high, low] = segments;
                let v4 = std::net::Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
                return is_forbidden_destination(IpAddr::V4(v4));
            }
            v6.is_unspecified()
                || v6.is_multicast()
                || (segments[0] & 0xffc0) == 0xfe80
                || v6 == std::net::Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_and_link_local_are_forbidden() {
        for ip in [
            "169.254.169.254",
            "169.254.1.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "fe80::1",
            "::",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::169.254.169.254",
            "64:ff9b::0.0.0.0",
        ] {
            assert!(is_forbidden_destination(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "93.184.216.34",
            "::1",
            "2001:db8::1",
            "64:ff9b::93.184.216.34",
        ] {
            assert!(!is_forbidden_destination(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn request_timeouts_never_exceed_the_call_budget() {
        let options = bounded_options(
            Some(RequestOptions {
                connect_timeout: Some(Duration::from_secs(600)),
                first_byte_timeout: Some(Duration::from_millis(10)),
                between_bytes_timeout: None,
            }),
            Duration::from_secs(5),
        );
        assert_eq!(options.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!(options.first_byte_timeout, Some(Duration::from_millis(10)));
        assert_eq!(options.between_bytes_timeout, Some(Duration::from_secs(5)));
    }
}
