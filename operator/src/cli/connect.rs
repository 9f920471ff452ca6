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
    /// Give up on an API request after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, global = true)]
    pub request_timeout: u64,
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
    let timeout = Duration::from_secs(args.request_timeout.max(1));
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Client::try_from(config).map_err(|e| Error::Usage(format!("cannot build a client: {e}")))
}

/// Every object of `api`, read in pages of 500 as kubectl does, so a large cluster is not one
/// huge response.
pub async fn list_all<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = params.clone().limit(500);
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}
