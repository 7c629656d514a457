"""Where a measurement was taken: device, driver, library versions, host.

Stored beside every run so a number can always be traced to the stack that produced it (a step time from
torch 2.11 + transformers 5.17 on an H200 is not the same fact as one from a laptop CPU).

Library versions come from installed distribution metadata (`importlib.metadata`), not by importing the
libraries: importing bitsandbytes or deepspeed is slow and noisy, and a version is all we need. torch itself
is imported lazily, only to ask about the device.
"""
from __future__ import annotations

import importlib.metadata as _md
import os
import platform
import re
import socket
from typing import Any

# Distributions whose versions decide measured numbers; None when not installed.
LIBRARIES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "deepspeed", "flash-attn", "nvidia-ml-py")


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's marketing name ('AMD EPYC 7B13'), or the best the platform offers."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver_version() -> str | None:
    """The kernel driver version ('550.54.15'): from /proc on Linux, else NVML if installed, else None.

    torch only knows the CUDA *API* version the driver supports, which is not the driver release."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    try:
        import pynvml  # nvidia-ml-py; optional

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver, no permission: the driver is simply unknown
        return None


def _torch_device_info(device: str | None) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"device": "cpu", "device_name": cpu_model(), "torch_available": False}
    info: dict[str, Any] = {
        "torch_cuda_build": torch.version.cuda,  # CUDA runtime torch was built with (None for CPU wheels)
        "cuda_available": bool(torch.cuda.is_available()),
        "torch_threads": torch.get_num_threads(),
    }
    want = device or ("cuda" if info["cuda_available"] else "cpu")
    if want.startswith("cuda") and info["cuda_available"]:
        idx = torch.device(want).index
        idx = torch.cuda.current_device() if idx is None else idx
        props = torch.cuda.get_device_properties(idx)
        info.update(
            device=f"cuda:{idx}",
            device_name=props.name,
            device_count=torch.cuda.device_count(),
            device_memory_bytes=int(props.total_memory),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=int(props.multi_processor_count),
            cuda_runtime=torch.version.cuda,
            cuda_driver_api=_cuda_driver_api(torch),
            nvidia_driver=nvidia_driver_version(),
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        )
    else:
        info.update(device="cpu", device_name=cpu_model())
    return info


def _cuda_driver_api(torch: Any) -> str | None:
    """The CUDA API version the installed driver supports ('12.8'), from the driver itself."""
    try:
        v = int(torch._C._cuda_getDriverVersion())  # e.g. 12080; private but long-stable
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        return None


def environment(device: str | None = None) -> dict[str, Any]:
    """Everything a stored measurement should carry about where it ran.

    `device`: 'cpu', 'cuda' or 'cuda:N' (None: CUDA when available, else CPU). Keys are stable:
    device, device_name, host, python, platform, cpu_model, cpu_count, ftscope, versions{dist: version|None},
    plus on CUDA device_memory_bytes, compute_capability, cuda_runtime, cuda_driver_api, nvidia_driver.
    """
    from ...version import __version__

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "ftscope": __version__,
        "versions": {lib: _version(lib) for lib in LIBRARIES},
    }
    env.update(_torch_device_info(device))
    return env
