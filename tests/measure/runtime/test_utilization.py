"""The NVML utilization sampler (measure/utilization.py): a recorded no-op without a GPU, and both NVML paths
(GPM and utilization rates) against a fake pynvml."""
from __future__ import annotations

import sys
import time
import types

import pytest

torch = pytest.importorskip("torch")

from ftscope.measure.runtime.utilization import UtilizationSampler  # noqa: E402


def test_utilization_sampler_without_gpu_is_a_recorded_noop() -> None:
    with UtilizationSampler() as s:
        pass
    summary = s.summary()
    assert not summary.available and summary.reason and summary.samples == 0


def _fake_nvml(gpm: bool) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetHandleByUUID = lambda uuid: ("h", uuid)
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=5 * 2**30)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=41)
    if gpm:
        nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_DRAM_BW_UTIL, nv.NVML_GPM_METRICS_GET_VERSION = 2, 10, 1
        nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1)
        nv.nvmlGpmSampleAlloc = lambda: types.SimpleNamespace()
        nv.nvmlGpmSampleGet = lambda h, s: None
        nv.nvmlGpmSampleFree = lambda s: None

        class Req:
            def __init__(self) -> None:
                self.metrics = [types.SimpleNamespace(metricId=0, value=0.0) for _ in range(4)]

        def metrics_get(req):  # type: ignore[no-untyped-def]
            for m in req.metrics[: req.numMetrics]:
                m.value = {2: 63.0, 10: 29.0}[m.metricId]

        nv.c_nvmlGpmMetricsGet_t = Req
        nv.nvmlGpmMetricsGet = metrics_get
    return nv


@pytest.mark.parametrize("gpm", [False, True], ids=["utilization_rates", "gpm"])
def test_utilization_sampler_with_fake_nvml(monkeypatch, gpm: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpm))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="abc"))
    with UtilizationSampler(device_index=0, interval_s=0.1) as s:
        time.sleep(0.45)
    summary = s.summary()
    assert summary.available and summary.samples >= 2, summary
    assert summary.source == ("gpm" if gpm else "utilization_rates")
    assert (summary.sm_mean, summary.mem_bw_max) == ((63.0, 29.0) if gpm else (87.0, 41.0))
    assert summary.device_mem_used_peak_bytes == 5 * 2**30
