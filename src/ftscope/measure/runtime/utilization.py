"""GPU utilization while steps run: a background thread polling NVML for SM and memory-bandwidth use.

A recorded no-op that says why on CPU, without nvidia-ml-py, or when NVML cannot start. torch is imported
inside the functions that need it, never at module import.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

@dataclasses.dataclass
class UtilizationSummary:
    """GPU utilization over a sampled window (percentages 0-100)."""

    available: bool
    """False on CPU, without nvidia-ml-py, or when NVML cannot start; see `reason`."""
    reason: str | None
    """Why nothing was sampled, when nothing was."""
    source: str | None
    """'gpm' (Hopper+ GPU performance monitoring: true SM activity and DRAM bandwidth) or 'utilization_rates'
    (nvmlDeviceGetUtilizationRates: share of time any kernel ran, and share of time memory was read/written)."""
    samples: int
    """Number of samples taken."""
    sm_mean: float | None
    """Mean SM utilization (GPM SM_UTIL, else NVML 'gpu' kernel-active time)."""
    sm_max: float | None
    mem_bw_mean: float | None
    """Mean memory-bandwidth utilization (GPM DRAM_BW_UTIL, else NVML 'memory' read/write-active time)."""
    mem_bw_max: float | None
    device_mem_used_peak_bytes: int | None
    """Highest device memory in use seen by NVML (all processes, includes the CUDA context)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class UtilizationSampler:
    """Poll NVML from a daemon thread every `interval_s` while a block runs (`with sampler: ...`).

    `device_index` is the CUDA ordinal as torch sees it; it is mapped to the NVML device by UUID so
    CUDA_VISIBLE_DEVICES renumbering does not pick the wrong GPU. Anything NVML-related failing turns the
    sampler into a recorded no-op; it never breaks the run it observes."""

    def __init__(self, device_index: int | None = None, interval_s: float = 0.1) -> None:
        self.device_index = device_index
        self.interval_s = max(0.1, interval_s)  # GPM needs >= 100 ms between samples
        self.samples: list[tuple[float, float, float, int]] = []
        """(perf_counter time, SM %, memory-bandwidth %, device memory used bytes)."""
        self.available = False
        self.reason: str | None = None
        self.source: str | None = None
        self._nv: Any = None
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> bool:
        try:
            import torch

            if not torch.cuda.is_available():
                self.reason = "no CUDA device"
                return False
        except ImportError:
            self.reason = "torch not installed"
            return False
        try:
            import pynvml  # provided by nvidia-ml-py
        except ImportError:
            self.reason = "nvidia-ml-py not installed (pip install nvidia-ml-py)"
            return False
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
            self.reason = f"NVML unavailable: {e}"
            return False
        self._nv = pynvml
        try:
            idx = torch.cuda.current_device() if self.device_index is None else self.device_index
            try:
                uuid = str(torch.cuda.get_device_properties(idx).uuid)
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else
                                                                 "GPU-" + uuid)
            except Exception:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.source = "gpm" if self._gpm_supported() else "utilization_rates"
        except Exception as e:
            self.reason = f"NVML device lookup failed: {e}"
            pynvml.nvmlShutdown()
            self._nv = None
            return False
        self.available = True
        return True

    def _gpm_supported(self) -> bool:
        nv = self._nv
        if not all(hasattr(nv, a) for a in ("nvmlGpmQueryDeviceSupport", "NVML_GPM_METRIC_SM_UTIL",
                                            "NVML_GPM_METRIC_DRAM_BW_UTIL")):
            return False
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice)
        except Exception:
            return False

    def _run(self) -> None:
        nv, h = self._nv, self._handle
        prev = cur = None
        try:
            if self.source == "gpm":
                prev, cur = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                nv.nvmlGpmSampleGet(h, prev)
            while not self._stop.wait(self.interval_s):
                used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
                if self.source == "gpm":
                    nv.nvmlGpmSampleGet(h, cur)
                    sm, bw = self._gpm_metrics(prev, cur)
                    prev, cur = cur, prev
                else:
                    u = nv.nvmlDeviceGetUtilizationRates(h)
                    sm, bw = float(u.gpu), float(u.memory)
                self.samples.append((time.perf_counter(), sm, bw, used))
        except Exception as e:  # a sampler must never take the measured run down
            self.reason = f"sampling stopped: {e}"
        finally:
            for s in (prev, cur):
                if s is not None:
                    try:
                        nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass

    def _gpm_metrics(self, s1: Any, s2: Any) -> tuple[float, float]:
        nv = self._nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 2
        req.sample1, req.sample2 = s1, s2
        req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        req.metrics[1].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        nv.nvmlGpmMetricsGet(req)
        return float(req.metrics[0].value), float(req.metrics[1].value)

    def start(self) -> "UtilizationSampler":
        if self._open():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="ftscope-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> UtilizationSummary:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None
        return self.summary()

    def __enter__(self) -> "UtilizationSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def summary(self) -> UtilizationSummary:
        s = self.samples
        if not s:
            return UtilizationSummary(
                available=self.available, reason=self.reason or ("no samples (window shorter than the interval)"
                                                                  if self.available else None),
                source=self.source, samples=0, sm_mean=None, sm_max=None, mem_bw_mean=None, mem_bw_max=None,
                device_mem_used_peak_bytes=None,
            )
        sm = [x[1] for x in s]
        bw = [x[2] for x in s]
        return UtilizationSummary(
            available=True, reason=self.reason, source=self.source, samples=len(s),
            sm_mean=sum(sm) / len(sm), sm_max=max(sm), mem_bw_mean=sum(bw) / len(bw), mem_bw_max=max(bw),
            device_mem_used_peak_bytes=max(x[3] for x in s),
        )
