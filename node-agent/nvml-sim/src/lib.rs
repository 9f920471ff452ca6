//! A simulated `libnvidia-ml.so.1`: NVML's C ABI over the node agent's simulated GPUs (the same
//! state file and MIG rules as `--backend sim`), so the agent's NVML backend can run its create,
//! destroy and MIG-mode paths without a GPU.
//!
//! It exports the NVML functions nvml-wrapper 0.13 and the agent call on the agent's paths, with
//! nvml.h's semantics and return codes; every other NVML function is exported too and answers
//! `NVML_ERROR_NOT_SUPPORTED`, logged on stderr (see `stubs.rs`).
//!
//! State: `$TESSERA_NVML_SIM_STATE`, or `nvml-sim.json` next to the library; created with
//! `$TESSERA_SIM_GPUS` (default `H100-80GB`) if missing. Faults, processes, leaked memory and
//! driver restarts are written there by `node-agent sim ...` (or tests). Calls from several
//! processes are serialised by a lock on `<state>.lock`, as the driver serialises NVML calls.

#![allow(non_snake_case)]
// The bindgen names of NVML's return codes are lower-case constants.
#![allow(non_upper_case_globals)]

/// Exports each named NVML function as a stub answering NOT_SUPPORTED, logged.
macro_rules! stubs {
    ($($name:ident),* $(,)?) => { $(
        /// Not simulated: answers `NVML_ERROR_NOT_SUPPORTED`.
        ///
        /// # Safety
        /// Reads no argument.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            crate::session::log(concat!(stringify!($name), ": not simulated (NOT_SUPPORTED)"));
            nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        }
    )* };
}

mod compute_instances;
mod devices;
mod events;
mod exports;
mod gpm;
mod gpu_instances;
mod profiles;
mod session;
mod stubs;
mod system;

#[cfg(test)]
mod tests;
