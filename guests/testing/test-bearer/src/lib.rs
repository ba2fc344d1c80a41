//! Calls a storage API with the Secret its class names, as a real plugin would.
//!
//! `provision`, `expand` and `delete` send `GET <url>?op=provision|expand|delete&volume=<name>`
//! (class parameter `url`, `http://` only) with `authorization: Bearer <token>`, where
//! the token is the `token` key of the request's Secret. A 200 answer makes a hostPath
//! volume `/echo/<volume-name>` (a provision), the requested size (an expand) or a
//! successful delete; anything else fails with the status, and a request without a
//! Secret fails saying so. The token is never logged
//! nor put in an answer.
use wasip2::http::outgoing_handler::handle;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasm_provisioner_sdk::{self as sdk, prelude::*};

struct Bearer;

/// The `token` of the Secret.
fn token(secret: Option<&Secret>) -> Result<String, String> {
    let secret = secret.ok_or("no Secret in the request: name one in the class")?;
    let (_, value) = secret
        .data
        .iter()
        .find(|(key, _)| key == "token")
        .ok_or_else(|| {
            format!(
                "Secret {}/{} has no key `token`",
                secret.namespace, secret.name
            )
        })?;
    String::from_utf8(value.clone()).map_err(|_| "the token is not UTF-8".to_string())
}

/// `GET url?op=..&volume=..` with the bearer token; the response status.
fn call(url: &str, op: &str, volume: &str, token: &str) -> Result<u16, String> {
    let rest = url.strip_prefix("http://").ok_or("url must be http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let headers = Fields::new();
    headers
        .append("authorization", format!("Bearer {token}").as_bytes())
        .map_err(|e| format!("header: {e:?}"))?;
    let request = OutgoingRequest::new(headers);
    request
        .set_method(&Method::Get)
        .map_err(|()| "bad method")?;
    request
        .set_scheme(Some(&Scheme::Http))
        .map_err(|()| "bad scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|()| "bad authority")?;
    request
        .set_path_with_query(Some(&format!("{path}?op={op}&volume={volume}")))
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

/// One authenticated call; `Ok` on 200.
fn authorized(url: &str, op: &str, volume: &str, secret: Option<&Secret>) -> Result<(), String> {
    let token = token(secret)?;
    match call(url, op, volume, &token)? {
        200 => Ok(()),
        status => Err(format!("the API answered {status} to {op} {volume}")),
    }
}

impl Provisioner for Bearer {
    fn describe() -> PluginInfo {
        PluginInfo::new("test-bearer", env!("CARGO_PKG_VERSION"))
    }

    fn provision(req: &ProvisionRequest) -> Result<Volume, ProvisionError> {
        let url = Params::new(&req.class.parameters).require("url", "the API's URL")?;
        authorized(url, "provision", &req.volume_name, req.secret.as_ref())
            .map_err(|e| ProvisionError::Failed(format!("test-bearer: {e}")))?;
        sdk::log::info!(
            "test-bearer: the API made the volume",
            volume = req.volume_name
        );
        let path = format!("/echo/{}", req.volume_name);
        Ok(Volume::new(
            req.claim.requested_bytes,
            VolumeSource::host_path(path, Some("DirectoryOrCreate")),
        ))
    }

    fn delete(req: &DeleteRequest) -> Result<(), DeleteError> {
        let Some(url) = Params::new(&req.class_parameters).get("url") else {
            return Err(DeleteError::Failed("test-bearer: the class is gone".into()));
        };
        authorized(url, "delete", &req.volume.name, req.secret.as_ref())
            .map_err(|e| DeleteError::Failed(format!("test-bearer: {e}")))
    }
}

impl Expander for Bearer {
    fn expand(req: &ExpandRequest) -> Result<u64, ExpandError> {
        let Some(url) = Params::new(&req.class_parameters).get("url") else {
            return Err(ExpandError::Failed("test-bearer: the class is gone".into()));
        };
        authorized(url, "expand", &req.volume.name, req.secret.as_ref())
            .map_err(|e| ExpandError::Failed(format!("test-bearer: {e}")))?;
        Ok(req.requested_bytes)
    }
}

sdk::export!(Bearer, capabilities: [expand]);
