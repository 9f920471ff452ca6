//! Test-only: an API server for one `resource.k8s.io/v1` resource, enough for the caches that
//! ask whether the API is served and then list and watch it (claims, slices, device classes).

use kube::Client;
use serde_json::{Value, json};

/// The resource served: its plural, singular and kind names, whether namespaced, and the items
/// a list returns.
pub(crate) struct Served {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub items: Value,
}

/// Discovery of `resource.k8s.io/v1` answers `discovery` (404: not served), a list answers
/// `list` with `served.items`, and a watch never answers; any other request panics.
pub(crate) fn api(served: Served, discovery: u16, list: u16) -> Client {
    let Served { plural, singular, kind, namespaced, items } = served;
    let path = format!("/apis/resource.k8s.io/v1/{plural}");
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (path, items) = (path.clone(), items.clone());
        async move {
            let (status, body) = match (req.uri().path(), req.uri().query().unwrap_or_default()) {
                ("/apis/resource.k8s.io/v1", _) => (
                    discovery,
                    json!({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1", "resources": [
                        {"name": plural, "singularName": singular, "namespaced": namespaced, "kind": kind,
                         "verbs": ["get", "list", "watch"]}]}),
                ),
                (p, q) if p == path && q.contains("watch=true") => {
                    futures::future::pending::<()>().await;
                    unreachable!()
                }
                (p, _) if p == path => (
                    list,
                    json!({"kind": format!("{kind}List"), "apiVersion": "resource.k8s.io/v1",
                           "metadata": {"resourceVersion": "5"}, "items": items}),
                ),
                (p, _) => panic!("unexpected request {p}"),
            };
            let body = if status == 200 { body } else { json!({"kind": "Status", "code": status, "message": "no"}) };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            )
        }
    });
    Client::new(service, "default")
}
