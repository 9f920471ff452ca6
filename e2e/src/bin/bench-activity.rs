//! The node agent's activity writer: `GpuNode.status.activity` writes per node per
//! hour for a day of 30 s samples on a simulated clock (the agent's tracker and write rule),
//! next to the heartbeat's lease renewals. Usage: `bench-activity [devices]` (default 56: eight
//! H100s cut into seven 1g.10gb each).

use k8s_openapi::jiff::SignedDuration;
use tessera_node_agent::activity::bench::{Load, writes};

fn main() {
    let devices: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(56);
    let (sample, interval) = (SignedDuration::from_secs(30), SignedDuration::from_mins(5));
    // The heartbeat: lease 40 s (the default), renewed four times per duration.
    let lease_renewals_per_hour = 3600.0 / 10.0;
    println!(
        "| load ({devices} devices, 24 h of 30 s samples) | activity writes / day | per hour | lease renewals per hour |"
    );
    println!("| --- | --- | --- | --- |");
    for load in [Load::Idle, Load::Steady, Load::Workday, Load::Flapping, Load::Hovering] {
        let n = writes(load, devices, 24, sample, interval);
        println!("| {load:?} | {n} | {:.2} | {lease_renewals_per_hour} |", f64::from(n) / 24.0);
    }
}
