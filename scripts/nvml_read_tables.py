"""Read-only dump of a GPU's MIG profile and placement tables through NVML (pynvml).

Used once on a lent H100 to check Tessera's built-in catalog against real hardware. It never
changes MIG mode, creates or destroys instances, or resets anything.
"""
import json
import pynvml as n

n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    g = {"index": i, "name": n.nvmlDeviceGetName(h), "pci_device_id": hex(n.nvmlDeviceGetPciInfo(h).pciDeviceId),
         "memory_mib": n.nvmlDeviceGetMemoryInfo(h).total // (1 << 20), "profiles": []}
    try:
        cur, pend = n.nvmlDeviceGetMigMode(h)
        g["mig_mode"] = {"current": cur, "pending": pend}
    except n.NVMLError as e:
        g["mig_mode"] = str(e)
    for enum in range(0, 0x20):
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
        except n.NVMLError as e:
            if enum < 0x11:
                g["profiles"].append({"enum": enum, "error": str(e)})
            continue
        p = {"enum": enum, "id": info.id, "slices": info.sliceCount, "instance_count": info.instanceCount,
             "memory_mib": info.memorySizeMB, "sm": info.multiprocessorCount, "copy_engines": info.copyEngineCount,
             "decoders": info.decoderCount, "encoders": info.encoderCount, "jpeg": info.jpegCount, "ofa": info.ofaCount}
        try:
            pl = n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id)
            p["placements"] = [[x.start, x.size] for x in pl]
        except Exception as e:  # noqa: BLE001 - record whatever NVML says
            p["placements_error"] = str(e)
        g["profiles"].append(p)
    out["gpus"].append(g)
print(json.dumps(out, indent=1))
