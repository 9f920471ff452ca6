//! The devices' activity on the agent's `/metrics`, in Prometheus' text format, every sample (not
//! just what is written to the API server). Labels are those NVIDIA's DCGM exporter uses for the
//! same devices (`gpu`, `UUID`, `GPU_I_ID`, `GPU_I_PROFILE`, `modelName`, `Hostname`), so
//! dashboards can join the two: `UUID` is the GPU's UUID, for its MIG devices too (as DCGM
//! labels them, told apart by `GPU_I_ID`); Tessera adds the MIG device's own UUID as `MIG_UUID`
//! and `GPU_I_START`, its first memory slot, as Tessera names instances by placement.

use std::collections::BTreeMap;
use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;
use tessera_crds::activity::{ActivitySource, DevicePod};

use super::Tracker;

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Renders every current device's figures. A figure not known (no GPM, no sample yet; for
/// `tessera_gpu_idle_seconds`, a GPM device with no figure yet) is left out rather than shown as 0.
///
/// `holders` maps PIDs to the pods running them: a device whose processes all belong to one pod
/// ([`super::holders::pod_of`]) is labelled with its `namespace` and `pod`, as DCGM's exporter does.
pub fn render(hostname: &str, tracker: &Tracker, now: Timestamp, holders: &BTreeMap<u32, DevicePod>) -> String {
    let families: [(&str, &str); 6] = [
        (
            "tessera_gpu_sm_active_ratio",
            "Share of time SMs were active since the previous sample (GPM SM_UTIL, like DCGM_FI_PROF_SM_ACTIVE).",
        ),
        ("tessera_gpu_sm_active_1h_ratio", "Mean SM activity over the last hour (or since the agent started)."),
        ("tessera_gpu_sm_active_24h_ratio", "Mean SM activity over the last 24 hours (or since the agent started)."),
        (
            "tessera_gpu_idle_seconds",
            "Seconds the device has been idle without a break (GPM: SM activity under 1%, until it reaches 5%; without GPM: no compute process); 0 while active.",
        ),
        ("tessera_gpu_fb_used_mib", "Device memory in use, MiB (like DCGM_FI_DEV_FB_USED)."),
        ("tessera_gpu_compute_processes", "Compute processes running on the device."),
    ];
    let latest = tracker.latest(now);
    let mut out = String::new();
    for (i, (name, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        // A device kept from the stored summary whose GPU could not be read since the restart
        // has no GPU UUID to label it with yet: left out until read.
        for (o, d) in latest.iter().filter(|(o, _)| !o.gpu_uuid.is_empty()) {
            let value = match i {
                0 => o.sm_active_percent.map(|p| p / 100.0),
                1 => d.active_percent_1h.map(|p| f64::from(p) / 100.0),
                2 => d.active_percent_24h.map(|p| f64::from(p) / 100.0),
                3 => match (&d.idle_since, o.idle()) {
                    (Some(t), _) => Some(now.duration_since(t.0).as_secs_f64().max(0.0)),
                    (None, Some(_)) => Some(0.0),
                    (None, None) => None,
                },
                4 => Some(o.memory_used_mib as f64),
                _ => Some(f64::from(o.processes)),
            };
            let Some(value) = value else { continue };
            let source = match o.source {
                ActivitySource::Gpm => "Gpm",
                ActivitySource::ProcessesAndMemory => "ProcessesAndMemory",
            };
            let _ = write!(
                out,
                "{name}{{gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\",source=\"{source}\"",
                o.gpu_index,
                escape(&o.gpu_uuid),
                escape(&o.model_name),
                escape(hostname),
            );
            if let Some(mig) = &o.uuid {
                let _ = write!(out, ",MIG_UUID=\"{}\"", escape(mig));
            }
            if let (Some(id), Some(p), Some(s)) = (o.gpu_instance_id, &o.profile, o.start) {
                let _ = write!(out, ",GPU_I_ID=\"{id}\",GPU_I_PROFILE=\"{}\",GPU_I_START=\"{s}\"", escape(p));
            }
            if let Some(pod) = super::holders::pod_of(&o.pids, holders) {
                let _ = write!(out, ",namespace=\"{}\",pod=\"{}\"", escape(&pod.namespace), escape(&pod.name));
            }
            let _ = writeln!(out, "}} {value}");
        }
    }
    out
}

/// Serves `/metrics` (the latest render) on `listener`; anything else is 404. One request per
/// connection, as the operator's endpoint.
pub async fn serve(listener: tokio::net::TcpListener, text: std::sync::Arc<std::sync::Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let text = text.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = match request.split_whitespace().nth(1) {
                Some("/metrics") => ("200 OK", text.lock().unwrap_or_else(|p| p.into_inner()).clone()),
                _ => ("404 Not Found", "not found".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::Observation;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn renders_dcgm_labels_and_leaves_unknown_figures_out() {
        let mut tr = Tracker::default();
        let obs = |sm: Option<f64>, procs| {
            vec![
                Observation {
                    gpu_index: 0,
                    model_name: "NVIDIA H100 80GB HBM3".into(),
                    gpu_uuid: "GPU-h".into(),
                    uuid: Some("MIG-a".into()),
                    profile: Some("3g.40gb".into()),
                    start: Some(4),
                    gpu_instance_id: Some(2),
                    source: ActivitySource::Gpm,
                    sm_active_percent: sm,
                    gpm_failed: false,
                    memory_used_mib: 1024,
                    processes: procs,
                    pids: vec![4242],
                },
                Observation {
                    gpu_index: 1,
                    model_name: "NVIDIA A100-SXM4-40GB".into(),
                    gpu_uuid: "GPU-w".into(),
                    uuid: None,
                    profile: None,
                    start: None,
                    gpu_instance_id: None,
                    source: ActivitySource::ProcessesAndMemory,
                    sm_active_percent: None,
                    gpm_failed: false,
                    memory_used_mib: 0,
                    processes: 0,
                    pids: vec![],
                },
            ]
        };
        tr.observe(t(0), obs(None, 1));
        // A GPM device with no figure yet: its idleness is unknown, not 0 s.
        let first = render("node-1", &tr, t(0), &BTreeMap::new());
        assert!(!first.lines().any(|l| l.starts_with("tessera_gpu_idle_seconds{gpu=\"0\"")), "{first}");
        tr.observe(t(30), obs(Some(25.0), 1));
        let pod = DevicePod { namespace: "ml".into(), name: "train-0".into(), uid: "u".into() };
        let holders = BTreeMap::from([(4242, pod)]);
        let text = render("node-1", &tr, t(90), &holders);
        let mig = r#"gpu="0",UUID="GPU-h",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",source="Gpm",MIG_UUID="MIG-a",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",GPU_I_START="4",namespace="ml",pod="train-0""#;
        let whole =
            r#"gpu="1",UUID="GPU-w",modelName="NVIDIA A100-SXM4-40GB",Hostname="node-1",source="ProcessesAndMemory""#;
        for line in [
            format!("tessera_gpu_sm_active_ratio{{{mig}}} 0.25"),
            format!("tessera_gpu_sm_active_1h_ratio{{{mig}}} 0.25"),
            format!("tessera_gpu_fb_used_mib{{{mig}}} 1024"),
            format!("tessera_gpu_compute_processes{{{mig}}} 1"),
            format!("tessera_gpu_idle_seconds{{{mig}}} 0"),
            format!("tessera_gpu_idle_seconds{{{whole}}} 90"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // No GPM: no SM figure at all (not a misleading 0).
        assert!(!text.lines().any(|l| l.starts_with("tessera_gpu_sm_active") && l.contains(whole)), "{text}");
    }
}
