//! Event sets, as NVIDIA's device plugin uses them to health-check GPUs: it registers Xid and ECC
//! events on each physical GPU and waits on the set in a loop. The simulator raises no events, so
//! a wait lasts its timeout and answers NVML_ERROR_TIMEOUT (healthy), or GPU_IS_LOST once the
//! driver restarted under the session, as nvml.h's wait does.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::sync::Mutex;
use std::time::Duration;

use nvml_wrapper_sys::bindings::*;

use crate::exports::nvml_fn;
use crate::session::{self, Code, Ctx, Dev, out};

const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

/// The events a simulated GPU supports: the ones the device plugin's health check asks for
/// (Xid critical errors, single- and double-bit ECC errors), as on an H100.
pub const SUPPORTED: u64 =
    (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError) as u64;

const SET_TAG: usize = 5 << 40;

/// Live event sets by id: each GPU registered with its event mask.
static SETS: Mutex<BTreeMap<usize, BTreeMap<u32, u64>>> = Mutex::new(BTreeMap::new());

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<usize, BTreeMap<u32, u64>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A live set's id; anything else (freed, forged, null) is an invalid argument.
fn set_id(set: nvmlEventSet_t) -> Result<usize, Code> {
    let h = set as usize;
    if h & !0xffff_ffff != SET_TAG || !sets().contains_key(&h) {
        return Err(INVALID);
    }
    Ok(h)
}

/// The GPU of a device handle for event calls: events belong to physical GPUs (a MIG device's
/// Xid events arrive on its parent, with the GPU instance id in the event data).
fn event_gpu(cx: &mut Ctx, device: nvmlDevice_t) -> Result<u32, Code> {
    match cx.device(device)? {
        Dev::Gpu(g) => Ok(g),
        Dev::Mig(..) => Err(NOT_SUPPORTED),
    }
}

nvml_fn!(nvmlEventSetCreate(cx, set: *mut nvmlEventSet_t) {
    if set.is_null() {
        return Err(INVALID);
    }
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let id = SET_TAG | (NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xffff_ffff);
    sets().insert(id, BTreeMap::new());
    unsafe { out(set, id as nvmlEventSet_t) }
});

nvml_fn!(nvmlEventSetFree(cx, set: nvmlEventSet_t) {
    let id = set_id(set)?;
    sets().remove(&id);
    Ok(())
});

nvml_fn!(nvmlDeviceGetSupportedEventTypes(cx, device: nvmlDevice_t, types: *mut u64) {
    event_gpu(cx, device)?;
    unsafe { out(types, SUPPORTED) }
});

nvml_fn!(nvmlDeviceRegisterEvents(cx, device: nvmlDevice_t, types: u64, set: nvmlEventSet_t) {
    let g = event_gpu(cx, device)?;
    let id = set_id(set)?;
    // nvml.h: NOT_SUPPORTED when some requested type is not; none is registered then, and the
    // set stays usable.
    if types & !SUPPORTED != 0 {
        session::log(format!("register events {types:#x} on GPU {g}: only {SUPPORTED:#x} are supported"));
        return Err(NOT_SUPPORTED);
    }
    *sets().get_mut(&id).ok_or(INVALID)?.entry(g).or_default() |= types;
    Ok(())
});

/// Waits `timeout_ms` on a valid set and `data`: no event ever arrives, so TIMEOUT, unless the
/// session was lost (driver restart) or a fault was injected, before or during the wait.
fn wait(name: &'static str, set: nvmlEventSet_t, data_null: bool, timeout_ms: c_uint) -> nvmlReturn_t {
    let check = |cx: &mut Ctx| -> Result<(), Code> {
        let _ = cx;
        set_id(set)?;
        if data_null { Err(INVALID) } else { Ok(()) }
    };
    let rc = session::call(name, check);
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    std::thread::sleep(Duration::from_millis(u64::from(timeout_ms)));
    // A driver restart during the wait loses the GPUs, as it would end a real wait.
    let rc = session::call(name, |_| Ok(()));
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    nvmlReturn_enum_NVML_ERROR_TIMEOUT
}

/// An NVML entry point; see nvml.h.
///
/// # Safety
/// `data` is null or valid for a write of `nvmlEventData_t` (it is never written: no events).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    wait("nvmlEventSetWait_v2", set, data.is_null(), timeout_ms)
}

/// The v1 wait: the same, with the v1 event data (no instance ids).
///
/// # Safety
/// `data` is null or valid for a write of the v1 event data (never written: no events).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    wait("nvmlEventSetWait", set, data.is_null(), timeout_ms)
}
