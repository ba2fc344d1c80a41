//! Makes an outbound HTTP request through `wasi:http` on purpose.
//!
//! `provision` sends `GET` to class parameter `url` (required; `http://` or `https://`)
//! and answers:
//! - refused or failed: `failed` with `test-network: GET <url>: <error>`;
//! - any response: a hostPath volume `/network/<volume-name>` with annotation
//!   `test-network/status` (the HTTP status code).
//!
//! `describe` and `delete` are normal.
use wasip2::http::outgoing_handler::handle;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Network;

/// Splits `http(s)://authority/path?query` into its parts.
fn parse(url: &str) -> Option<(Scheme, &str, &str)> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        (Scheme::Https, url.strip_prefix("https://")?)
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    (!authority.is_empty()).then_some((scheme, authority, path))
}

/// Sends the request and waits for the response status.
fn get(url: &str) -> Result<u16, String> {
    let (scheme, authority, path) = parse(url).ok_or("not an http:// or https:// URL")?;
    let request = OutgoingRequest::new(Fields::new());
    request
        .set_method(&Method::Get)
        .map_err(|()| "bad method")?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| "bad scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|()| "bad authority")?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| "bad path")?;
    let body = request.body().map_err(|()| "no request body")?;
    let response = handle(request, None).map_err(|e| format!("{e:?}"))?;
    OutgoingBody::finish(body, None).map_err(|e| format!("{e:?}"))?;
    response.subscribe().block();
    match response.get() {
        Some(Ok(Ok(response))) => Ok(response.status()),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        Some(Err(())) => Err("response already taken".into()),
        None => Err("no response after waiting".into()),
    }
}

impl Provisioner for Network {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-network", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let url = Params::new(&req.class.parameters).require("url", "set it to the URL to GET")?;
        let status = get(url)
            .map_err(|e| ProvisionError::Failed(format!("test-network: GET {url}: {e}")))?;
        sdk::log::info!("test-network: got a response", url = url, status = status);
        let path = format!("/network/{}", req.volume_name);
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, None),
        )
        .annotate("test-network/status", status.to_string()))
    }

    fn delete(_: &DeleteRequest) -> Result<(), DeleteError> {
        Ok(())
    }
}

sdk::export!(Network);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let (s, a, p) = parse("http://127.0.0.1:8080/x?y=1").unwrap();
        assert!(matches!(s, Scheme::Http));
        assert_eq!((a, p), ("127.0.0.1:8080", "/x?y=1"));
        let (s, a, p) = parse("https://example.test").unwrap();
        assert!(matches!(s, Scheme::Https));
        assert_eq!((a, p), ("example.test", "/"));
        assert!(parse("ftp://x/").is_none());
        assert!(parse("http:///x").is_none());
    }
}
