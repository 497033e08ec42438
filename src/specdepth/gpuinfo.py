"""The GPU's state around a timing (clocks, power, temperature, utilisation), read through NVML
(`nvidia-ml-py`, imported as `pynvml`): recorded before and after every real timing on CUDA, so that a slow
cell can be told apart from a throttled GPU. Empty on a CPU; {"error": ...} where NVML cannot be read."""
from __future__ import annotations


def snapshot(device) -> dict:
    """One reading of the GPU behind a torch device (dict; {} for a non-CUDA device)."""
    if getattr(device, "type", str(device)) != "cuda":
        return {}
    try:
        import pynvml as nv
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(int(getattr(device, "index", None) or 0))
        util = nv.nvmlDeviceGetUtilizationRates(h)
        return dict(sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                    mem_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                    max_sm_clock_mhz=nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                    power_w=round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 1),
                    temperature_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                    utilization_pct=util.gpu,
                    throttle_reasons=int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
    except Exception as e:   # noqa: BLE001  (NVML missing or unreadable: say so, do not fail the timing)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
