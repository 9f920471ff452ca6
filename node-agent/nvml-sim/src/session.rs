//! The library's plumbing: which state file, whether NVML is initialised, opaque handles,
//! injected faults, and the mapping from the simulator's errors to NVML return codes.
//!
//! Every call loads the state file (so processes, reboots and faults written by other processes
//! are seen at once) and saves it only when the call changed it, holding the state's lock across
//! processes from the load to the save.

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::Error;
use tessera_node_agent::backend::Instance;
use tessera_node_agent::backend::sim::{SimBackend, SimProcess, SimState, model};

pub type Code = nvmlReturn_t;

struct Session {
    path: PathBuf,
    /// nvmlInit calls not yet matched by nvmlShutdown (NVML reference-counts them).
    inits: u32,
    /// The state's driver generation at init: a later driver restart loses this session's GPUs.
    generation: u64,
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

/// What one call works on: the loaded state and processes, and whether it changed the state.
pub struct Ctx {
    pub state: SimState,
    pub procs: Vec<SimProcess>,
    pub changed: bool,
}

pub fn log(message: impl std::fmt::Display) {
    eprintln!("tessera-nvml-sim: {message}");
}

/// The state file: `$TESSERA_NVML_SIM_STATE`, or `nvml-sim.json` next to this library.
fn state_path() -> PathBuf {
    if let Some(p) = std::env::var_os("TESSERA_NVML_SIM_STATE") {
        return PathBuf::from(p);
    }
    library_dir().unwrap_or_else(|| PathBuf::from(".")).join("nvml-sim.json")
}

fn library_dir() -> Option<PathBuf> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a plain C struct it fills, and
    // `dli_fname` points into the loader's memory for as long as this library is loaded.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let found = unsafe { libc::dladdr(library_dir as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    Path::new(file).parent().map(Path::to_path_buf)
}

/// The NVML code for a simulator error (nvml.h's codes for the same conditions).
pub fn code(e: &Error) -> Code {
    match e {
        Error::InUse(_) => nvmlReturn_enum_NVML_ERROR_IN_USE,
        Error::InsufficientResources(_) => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        Error::NotSupported(_) => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Error::InvalidArgument(_) => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Error::NotFound(_) => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        _ => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

/// Maps a simulator error to its code, logging it.
pub fn fail(e: Error) -> Code {
    log(&e);
    code(&e)
}

/// `nvmlInit*`: opens (creating if needed, with `$TESSERA_SIM_GPUS`) the simulated GPUs.
pub fn init(name: &'static str) -> Code {
    let mut session = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let path = match &*session {
        Some(s) => s.path.clone(),
        None => state_path(),
    };
    let products: Vec<String> = std::env::var("TESSERA_SIM_GPUS")
        .unwrap_or_else(|_| "H100-80GB".into())
        .split(',')
        .map(str::to_string)
        .collect();
    // Locked from the load to the fault counters' save: NVML serialises its callers.
    let opened = SimBackend::open(&path, &products).and_then(|sim| Ok((sim.lock()?, sim.load()?)));
    let (_lock, mut state) = match opened {
        Ok(s) => s,
        Err(e) => {
            log(format!("{name}: {e}"));
            return nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
        }
    };
    if let Some(rc) = injected(&path, &mut state, name) {
        return rc;
    }
    // A new nvmlInit attaches to the driver as it is now, also for the process's older handles
    // (an assumption: the simulator keeps one session per process).
    match &mut *session {
        Some(s) => {
            s.inits += 1;
            s.generation = state.driver_generation;
        }
        None => *session = Some(Session { path, inits: 1, generation: state.driver_generation }),
    }
    nvmlReturn_enum_NVML_SUCCESS
}

pub fn shutdown() -> Code {
    let mut session = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    match &mut *session {
        None => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        Some(s) => {
            s.inits -= 1;
            if s.inits == 0 {
                *session = None;
            }
            nvmlReturn_enum_NVML_SUCCESS
        }
    }
}

/// Counts the call against every fault whose function prefix matches; the fault whose count
/// reaches its `nth` fires: the process aborts (`crash`) or the call returns its code.
fn injected(path: &Path, state: &mut SimState, name: &str) -> Option<Code> {
    let mut hit = None;
    let mut matched = false;
    for f in state.call_faults.iter_mut().filter(|f| name.starts_with(&f.function)) {
        matched = true;
        f.seen += 1;
        if f.seen == f.nth {
            hit = Some(f.clone());
        }
    }
    if matched && let Err(e) = SimBackend::at(path).save(state) {
        log(format!("{name}: saving fault counters: {e}"));
    }
    let f = hit?;
    if f.crash {
        log(format!("{name}: injected crash (call {} of {:?})", f.nth, f.function));
        std::process::abort();
    }
    log(format!("{name}: injected error {} (call {} of {:?})", f.code, f.nth, f.function));
    Some(f.code)
}

/// Runs one NVML call: initialised check, faults, a lost session after a driver restart, then
/// `f` on the loaded state, saved if `f` changed it.
pub fn call(name: &'static str, f: impl FnOnce(&mut Ctx) -> Result<(), Code>) -> Code {
    let session = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let Some(s) = &*session else { return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED };
    let sim = SimBackend::at(&s.path);
    // One call at a time across processes, from the load to the save (a real driver serialises
    // NVML calls; without it concurrent callers lose each other's changes).
    let _lock = match sim.lock() {
        Ok(l) => l,
        Err(e) => {
            log(format!("{name}: {e}"));
            return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
        }
    };
    let loaded = sim.load().and_then(|state| Ok((state, sim.all_processes()?)));
    let (mut state, procs) = match loaded {
        Ok(x) => x,
        Err(e) => {
            log(format!("{name}: {e}"));
            return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
        }
    };
    if let Some(rc) = injected(&s.path, &mut state, name) {
        return rc;
    }
    if state.driver_generation != s.generation {
        return nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    }
    let mut cx = Ctx { state, procs, changed: false };
    if let Err(rc) = f(&mut cx) {
        return rc;
    }
    if cx.changed
        && let Err(e) = sim.save(&cx.state)
    {
        log(format!("{name}: {e}"));
        return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// A device handle: a physical GPU, or the MIG device of a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    Gpu(u32),
    Mig(u32, u32),
}

const GPU_TAG: usize = 1 << 40;
const MIG_TAG: usize = 2 << 40;
const GI_TAG: usize = 3 << 40;
const CI_TAG: usize = 4 << 40;
const TAG_MASK: usize = 0xff << 40;

fn encode(tag: usize, gpu: u32, id: u32) -> usize {
    tag | (gpu as usize) << 16 | id as usize
}

fn decode(h: usize, tag: usize) -> Result<(u32, u32), Code> {
    if h & TAG_MASK != tag {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((((h >> 16) & 0xffff) as u32, (h & 0xffff) as u32))
}

pub fn gpu_handle(gpu: u32) -> nvmlDevice_t {
    encode(GPU_TAG, gpu, 0) as nvmlDevice_t
}

pub fn mig_handle(gpu: u32, gi: u32) -> nvmlDevice_t {
    encode(MIG_TAG, gpu, gi) as nvmlDevice_t
}

pub fn gi_handle(gpu: u32, gi: u32) -> nvmlGpuInstance_t {
    encode(GI_TAG, gpu, gi) as nvmlGpuInstance_t
}

pub fn ci_handle(gpu: u32, gi: u32) -> nvmlComputeInstance_t {
    encode(CI_TAG, gpu, gi) as nvmlComputeInstance_t
}

/// Marks a compute-instance handle as one of the smaller compute instances of a GPU instance.
const SPLIT: u32 = 0x8000;

/// A compute instance smaller than its GPU instance: GPU, GPU instance id, compute instance id.
pub fn split_ci_handle(gpu: u32, gi: u32, ci: u32) -> nvmlComputeInstance_t {
    encode(CI_TAG, gpu, SPLIT | (ci & 0x7f) << 8 | (gi & 0xff)) as nvmlComputeInstance_t
}

impl Ctx {
    /// A live handle of a smaller compute instance as (GPU, GPU instance, compute instance);
    /// `None` for any other handle.
    pub fn split_compute_instance(&mut self, h: nvmlComputeInstance_t) -> Result<Option<(u32, u32, u32)>, Code> {
        let Ok((gpu, id)) = decode(h as usize, CI_TAG) else { return Ok(None) };
        if id & SPLIT == 0 {
            return Ok(None);
        }
        let (gi, ci) = (id & 0xff, (id >> 8) & 0x7f);
        let live = self.gpu(gpu)?.split.get(&gi).is_some_and(|l| l.iter().any(|c| c.id == ci));
        if !live {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        Ok(Some((gpu, gi, ci)))
    }

    pub fn gpu(&mut self, gpu: u32) -> Result<&mut model::SimGpu, Code> {
        self.state.gpus.get_mut(gpu as usize).ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }

    /// A live device handle: the GPU exists, and a MIG device's instance is still whole.
    pub fn device(&mut self, h: nvmlDevice_t) -> Result<Dev, Code> {
        let h = h as usize;
        if h & TAG_MASK == MIG_TAG {
            let (gpu, gi) = decode(h, MIG_TAG)?;
            self.instance(gpu, gi)?.compute_instance_id.ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
            return Ok(Dev::Mig(gpu, gi));
        }
        let (gpu, _) = decode(h, GPU_TAG)?;
        self.gpu(gpu)?;
        Ok(Dev::Gpu(gpu))
    }

    /// A physical GPU's handle (MIG device handles are refused).
    pub fn physical(&mut self, h: nvmlDevice_t) -> Result<u32, Code> {
        match self.device(h)? {
            Dev::Gpu(g) => Ok(g),
            Dev::Mig(..) => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    pub fn instance(&mut self, gpu: u32, gi: u32) -> Result<&mut Instance, Code> {
        self.gpu(gpu)?
            .instances
            .iter_mut()
            .find(|i| i.gpu_instance_id == gi)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }

    /// A live GPU instance handle.
    pub fn gpu_instance(&mut self, h: nvmlGpuInstance_t) -> Result<(u32, u32), Code> {
        let (gpu, gi) = decode(h as usize, GI_TAG)?;
        self.instance(gpu, gi)?;
        Ok((gpu, gi))
    }

    /// A live compute instance handle.
    pub fn compute_instance(&mut self, h: nvmlComputeInstance_t) -> Result<(u32, u32), Code> {
        let (gpu, gi) = decode(h as usize, CI_TAG)?;
        self.instance(gpu, gi)?.compute_instance_id.ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        Ok((gpu, gi))
    }
}

/// Writes `value` through an out-pointer.
///
/// # Safety
/// `p` is null or valid for a write of `T` (the caller's NVML out-parameter).
pub unsafe fn out<T>(p: *mut T, value: T) -> Result<(), Code> {
    if p.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid per the contract above.
    unsafe { p.write(value) };
    Ok(())
}

/// The struct behind an in/out pointer.
///
/// # Safety
/// `p` is null or valid for reads and writes of `T` for the rest of the call.
pub unsafe fn inout<'a, T>(p: *mut T) -> Result<&'a mut T, Code> {
    // SAFETY: valid per the contract above.
    unsafe { p.as_mut() }.ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// Copies `s` NUL-terminated into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
pub unsafe fn out_str(buf: *mut c_char, len: u32, s: &str) -> Result<(), Code> {
    if buf.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds at least `s.len() + 1` bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Copies `s` NUL-terminated into a fixed C array (truncating).
pub fn fill_name(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

/// GPU `g`'s PCI bus id as `nvmlPciInfo_t::busId` and `busIdLegacy` spell it.
pub fn bus_ids(g: u32) -> (String, String) {
    let bus = 0x1b + g;
    (format!("00000000:{bus:02X}:00.0"), format!("0000:{bus:02X}:00.0"))
}
