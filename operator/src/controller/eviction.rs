//! One eviction through the policy/v1 Eviction API, read raw: kube's typed call drops the
//! response headers, and a throttle (API priority and fairness) says when to ask again only in
//! `Retry-After`. A pod the server asked to wait is not asked for again before then
//! ([`NotBefore`]): its refusal stands meanwhile.

use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::core::Status;
use kube::{Client, Resource};
use serde_json::json;

use crate::Error;
use tessera_planner::drain::{NotBefore, eviction_refused, retry_after};

/// What came of asking to evict a pod.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Evicted,
    /// Already gone (404).
    Gone,
    /// Refused (429), why in the drain's words; `asked` is false when the server was not asked
    /// because its Retry-After has not passed.
    Refused {
        why: String,
        asked: bool,
    },
}

pub async fn evict(
    client: &Client,
    not_before: &Mutex<NotBefore>,
    namespace: &str,
    pod: &str,
) -> Result<Answer, Error> {
    let lock = || crate::locked(not_before);
    if let Some(why) = lock().waiting(namespace, pod, Instant::now()) {
        return Ok(Answer::Refused { why, asked: false });
    }
    let body =
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}});
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)))
        .create_subresource("eviction", pod, &PostParams::default(), body.to_string().into_bytes())
        .map_err(|e| Error::Kube(kube::Error::BuildRequest(e)))?;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let code = response.status();
    if code.is_success() {
        return Ok(Answer::Evicted);
    }
    let header = response.headers().get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = response.into_body().collect_bytes().await?;
    let text = String::from_utf8_lossy(&bytes);
    // As kube reads an error: a Status, else the text (a throttle answers in plain text).
    let status = serde_json::from_str::<Status>(&text)
        .unwrap_or_else(|_| Status::failure(text.trim(), "Failed to parse error data").with_code(code.as_u16()));
    match code.as_u16() {
        404 => Ok(Answer::Gone),
        429 => {
            let why = eviction_refused(namespace, pod, &status);
            if let Some(after) = retry_after(header.as_deref(), &status) {
                tracing::info!(%namespace, %pod, ?after, "eviction refused with Retry-After; not asked again before");
                lock().defer(namespace, pod, Instant::now(), after, why.clone());
            }
            Ok(Answer::Refused { why, asked: true })
        }
        _ => Err(Error::Kube(kube::Error::Api(status.boxed()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server answering every eviction with `code`, the `Retry-After` header and body
    /// given, counting the calls.
    fn api(code: u16, retry_after: Option<&'static str>, body: &'static str) -> (Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/p/eviction");
                seen.fetch_add(1, Ordering::SeqCst);
                let mut answer = http::Response::builder().status(code);
                if let Some(after) = retry_after {
                    answer = answer.header("Retry-After", after);
                }
                Ok::<_, std::convert::Infallible>(
                    answer.body(kube::client::Body::from(body.as_bytes().to_vec())).unwrap(),
                )
            }
        });
        (Client::new(service, "default"), calls)
    }

    /// A throttled eviction is not asked again before the server's Retry-After, however many
    /// passes come first.
    #[tokio::test]
    async fn a_throttled_eviction_is_not_asked_again_before_the_servers_retry_after() {
        // API priority and fairness answers in plain text, the wait in the header.
        let (client, calls) = api(429, Some("30"), "Too many requests, please try again later.\n");
        let nb = Mutex::new(NotBefore::default());
        let first = evict(&client, &nb, "ml", "p").await.unwrap();
        let why = "eviction of ml/p refused (HTTP 429): Too many requests, please try again later.".to_string();
        assert_eq!(first, Answer::Refused { why: why.clone(), asked: true });
        let again = evict(&client, &nb, "ml", "p").await.unwrap();
        assert_eq!(again, Answer::Refused { why, asked: false }, "the refusal stands, in the same words");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the server was not asked again before its time");
    }

    #[tokio::test]
    async fn a_budget_refusal_without_retry_after_is_asked_again_next_pass() {
        let (client, calls) = api(
            429,
            None,
            r#"{"kind":"Status","code":429,"message":"Cannot evict pod as it would violate the pod's disruption budget.",
                "details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget web needs 2 healthy pods and has 2 currently"}]}}"#,
        );
        let nb = Mutex::new(NotBefore::default());
        for _ in 0..2 {
            match evict(&client, &nb, "ml", "p").await.unwrap() {
                Answer::Refused { why, asked: true } => {
                    assert!(why.starts_with("eviction of ml/p blocked by PodDisruptionBudget ml/web"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn evicted_gone_and_other_errors_are_told_apart() {
        let nb = Mutex::new(NotBefore::default());
        let (ok, _) = api(201, None, "{}");
        assert_eq!(evict(&ok, &nb, "ml", "p").await.unwrap(), Answer::Evicted);
        let (gone, _) = api(404, None, r#"{"kind":"Status","code":404,"message":"pods \"p\" not found"}"#);
        assert_eq!(evict(&gone, &nb, "ml", "p").await.unwrap(), Answer::Gone);
        let (broken, _) = api(500, Some("5"), "etcd is down");
        let e = evict(&broken, &nb, "ml", "p").await.unwrap_err().to_string();
        assert!(e.contains("etcd is down"), "{e}");
        assert!(nb.lock().unwrap().is_empty(), "only a 429 defers the pod");
    }
}
