//! A minimal HTTP endpoint for probes and scraping: `/livez` (the process answers), `/readyz`
//! (caches synced), `/metrics` (OpenMetrics text). Plain HTTP/1.1 over tokio, one request per
//! connection: all a kubelet probe or Prometheus needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::Metrics;

pub async fn serve(listener: TcpListener, ready: Arc<AtomicBool>, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let ready = ready.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/livez" => ("200 OK", "text/plain", "ok".to_string()),
                "/readyz" if ready.load(Ordering::Relaxed) => ("200 OK", "text/plain", "ok".to_string()),
                "/readyz" => ("503 Service Unavailable", "text/plain", "caches not synced".to_string()),
                "/metrics" => {
                    ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.render())
                }
                _ => ("404 Not Found", "text/plain", "not found".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}
