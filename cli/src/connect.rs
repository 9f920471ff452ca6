//! Reaching the cluster from a command line the way kubectl does: `--kubeconfig`, else
//! `KUBECONFIG` (a list of files, merged), else `~/.kube/config`, else the in-cluster service
//! account; `--context` picks a context other than the current one.

use std::time::Duration;

use clap::Args;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::de::DeserializeOwned;

use crate::Error;

/// kubectl's connection flags.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<String>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
    /// Give up on each API request (each page of a list) after this long, as kubectl:
    /// `30s`, `1m`, `1m30s`, `500ms` or plain seconds; 0 means no limit.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, global = true)]
    pub request_timeout: Duration,
}

impl ClusterArgs {
    /// The limit on each request; `None` for `--request-timeout 0`.
    pub fn request_limit(&self) -> Option<Duration> {
        (!self.request_timeout.is_zero()).then_some(self.request_timeout)
    }
}

/// kubectl's `--request-timeout` syntax: plain seconds (`30`), or Go's duration syntax: numbers
/// with units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`, one after another (`1h2m3.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let bad = || format!("{text:?} is not a duration (e.g. 30s, 1m, 1m30s, 500ms, or plain seconds; 0: no limit)");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        let part = Duration::try_from_secs_f64(value * scale).map_err(|_| bad())?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = tail;
    }
    Ok(total)
}

/// A client for the cluster the flags name. A kubeconfig that cannot be read or lacks the context
/// is a usage error (exit 2); an unreachable server shows up on the first request.
pub async fn client(args: &ClusterArgs) -> Result<Client, Error> {
    let options = KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| Error::Usage(format!("--kubeconfig {path}: {e}")))?;
            Config::from_custom_kubeconfig(kc, &options).await.map_err(|e| Error::Usage(format!("{path}: {e}")))?
        }
        (None, Some(context)) => {
            Config::from_kubeconfig(&options).await.map_err(|e| Error::Usage(format!("--context {context}: {e}")))?
        }
        (None, None) => Config::infer().await.map_err(|e| Error::Usage(format!("no cluster configured: {e}")))?,
    };
    let mut config = config;
    // The socket timeouts only bound one connect, read or write: `list_all` bounds each request.
    let limit = args.request_limit();
    config.connect_timeout = limit;
    config.read_timeout = limit;
    config.write_timeout = limit;
    Client::try_from(config).map_err(|e| Error::Usage(format!("cannot build a client: {e}")))
}

/// Every object of `api`, read in pages of 500 as kubectl does, so a large cluster is not one
/// huge response. Each page must arrive whole within `limit`: a server that trickles bytes
/// passes every socket timeout but not this one.
pub async fn list_all<K>(api: &Api<K>, params: &ListParams, limit: Option<Duration>) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = params.clone().limit(500);
    loop {
        let page = match limit {
            Some(limit) => tokio::time::timeout(limit, api.list(&params)).await.map_err(|_| timed_out(limit))??,
            None => api.list(&params).await?,
        };
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

fn timed_out(limit: Duration) -> kube::Error {
    let e = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no complete answer within --request-timeout {limit:?}"),
    );
    kube::Error::Service(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeouts_are_read_as_kubectl_reads_them() {
        let ok = [
            ("30", 30_000),
            ("0", 0),
            ("30s", 30_000),
            ("1m", 60_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            ("500ms", 500),
            ("1.5s", 1_500),
            ("0s", 0),
        ];
        for (text, ms) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for bad in ["", "s", "1x", "-1s", "1 m", "thirty", "1e3s", "1..5s", "5000000000000000h5000000000000000h"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad}: {e}");
        }
        let zero = ClusterArgs { request_timeout: Duration::ZERO, ..Default::default() };
        assert_eq!(zero.request_limit(), None, "0 means no limit");
    }
}
