//! Tessera node agent. The NVML and simulated backends arrive with the node-agent issue; until then
//! this binary only says so, so nothing mistakes it for a working agent.

fn main() {
    eprintln!("node-agent: not implemented yet (see the node-agent issue)");
    std::process::exit(2);
}
