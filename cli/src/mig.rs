//! `tessera-operator mig profiles|fit|layouts`: the catalog and the solver from the command line.

use serde::Serialize;
use tessera_crds::catalog::{self, GpuModel};
use tessera_crds::solver::{self, FitError, Placement, ProfileCounts};

use super::Output;
use crate::Error;

pub fn model(product: &str) -> Result<&'static GpuModel, Error> {
    catalog::lookup(product)
        .ok_or_else(|| Error::UnknownProduct { product: product.into(), known: catalog::known_products().join(", ") })
}

#[derive(Serialize)]
struct ProfileRow {
    name: &'static str,
    id: u32,
    compute_slices: u8,
    memory_slices: u8,
    max_count: u8,
    placements: String,
    resource: String,
}

/// Prints the profile table of one board.
pub fn profiles(product: &str, output: Output) -> Result<i32, Error> {
    let m = model(product)?;
    let rows: Vec<ProfileRow> = m
        .profiles
        .iter()
        .map(|p| ProfileRow {
            name: p.name,
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            placements: format!(
                "{{{}}}:{}",
                p.starts.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                p.memory_slices
            ),
            resource: p.resource_name(),
        })
        .collect();
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "product": m.name, "memorySlots": m.memory_slots, "computeSlices": m.compute_slices,
                "source": m.source, "profiles": rows,
            }))?
        ),
        Output::Text => {
            println!("{} ({} memory slots, {} compute slices)", m.name, m.memory_slots, m.compute_slices);
            println!(
                "{:<12} {:>3} {:>7} {:>6} {:>3}  {:<18} RESOURCE",
                "PROFILE", "ID", "COMPUTE", "MEMORY", "MAX", "PLACEMENTS"
            );
            for r in rows {
                println!(
                    "{:<12} {:>3} {:>7} {:>6} {:>3}  {:<18} {}",
                    r.name, r.id, r.compute_slices, r.memory_slices, r.max_count, r.placements, r.resource
                );
            }
            println!("source: {}", m.source);
        }
    }
    Ok(0)
}

/// Parses `PROFILE=COUNT` arguments.
pub fn parse_request(m: &GpuModel, args: &[String]) -> Result<ProfileCounts, Error> {
    let mut req = ProfileCounts::new();
    for arg in args {
        let (name, count) = arg
            .split_once('=')
            .ok_or_else(|| Error::Usage(format!("{arg:?}: expected PROFILE=COUNT, e.g. 3g.40gb=1")))?;
        let count: u32 = count
            .parse()
            .map_err(|_| Error::Usage(format!("{arg:?}: count {count:?} is not a non-negative integer")))?;
        let spec = m.profile(name).ok_or_else(|| {
            Error::Usage(format!(
                "profile {name:?} does not exist on {}; valid profiles: {}",
                m.name,
                m.profile_names().join(", ")
            ))
        })?;
        *req.entry(spec.name.to_string()).or_default() += count;
    }
    if req.is_empty() {
        return Err(Error::Usage("give at least one PROFILE=COUNT".into()));
    }
    Ok(req)
}

/// Fits a multiset: exit 0 with the placements, 1 with the reason, 2 on a usage error.
pub fn fit(product: &str, args: &[String], output: Output) -> Result<i32, Error> {
    let m = model(product)?;
    let req = parse_request(m, args)?;
    let result = solver::fit(m, &req);
    match output {
        Output::Json => {
            let body = match &result {
                Ok(p) => serde_json::json!({"product": m.name, "fits": true, "placements": p}),
                Err(e) => serde_json::json!({
                    "product": m.name, "fits": false, "reason": e.to_string(),
                    "bestPartial": best_partial(e),
                }),
            };
            println!("{}", serde_json::to_string_pretty(&body)?);
        }
        Output::Text => match &result {
            Ok(placements) => {
                println!("fits on {}:", m.name);
                print_placements(m, placements);
            }
            Err(e) => println!("does not fit: {e}"),
        },
    }
    Ok(if result.is_ok() { 0 } else { 1 })
}

fn best_partial(e: &FitError) -> Vec<Placement> {
    match e {
        FitError::NoPlacement { best_partial, .. } => best_partial.clone(),
        _ => Vec::new(),
    }
}

/// One line per instance plus a picture of the memory axis, e.g. `|2g |2g |3g         |`.
fn print_placements(m: &GpuModel, placements: &[Placement]) {
    for p in placements {
        println!("  {:<12} start {} size {}", p.profile, p.start, p.size);
    }
    let mut axis = vec!["."; usize::from(m.memory_slots)];
    for (i, p) in placements.iter().enumerate() {
        for s in p.start..p.start + p.size {
            axis[usize::from(s)] = ["A", "B", "C", "D", "E", "F", "G", "H"][i % 8];
        }
    }
    println!("  memory slots: [{}]", axis.join(""));
}

/// Enumerates every maximal layout of a board (optionally restricted to some profiles).
pub fn layouts(product: &str, only: &[String], output: Output) -> Result<i32, Error> {
    let m = model(product)?;
    for p in only {
        if m.profile(p).is_none() {
            return Err(Error::Usage(format!("profile {p:?} does not exist on {}", m.name)));
        }
    }
    let only: Vec<&str> = only.iter().map(String::as_str).collect();
    let all = solver::maximal_layouts(m, (!only.is_empty()).then_some(only.as_slice()));
    match output {
        Output::Json => {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"product": m.name, "layouts": all}))?)
        }
        Output::Text => {
            for l in &all {
                println!("{}", l.iter().map(ToString::to_string).collect::<Vec<_>>().join("  "));
            }
            println!("{} maximal layouts on {}", all.len(), m.name);
        }
    }
    Ok(0)
}
