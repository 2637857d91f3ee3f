"""What a piece of work costs on the machine it ran on: wall-clock seconds, peak memory above the start, and the
hardware named (the cost columns of the report card and the benchmarks).

:func:`measure` samples the process's resident set size every 5 ms in a thread (``/proc/self/statm``; a peak
between two samples shorter than 5 ms can be missed) and, on a CUDA device, reads the allocator's peak
(``torch.cuda.max_memory_allocated`` after a reset). :func:`hardware` names the CPU or the GPU a measurement ran
on: a time is a ratio between detectors of one run on one machine, never an absolute time elsewhere.
"""

from __future__ import annotations

import gc
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SAMPLE_SECONDS = 0.005
"""How often the resident set size is read while a measured call runs."""


def resident_bytes() -> int | None:
    """The process's resident set size in bytes (``None`` without ``/proc``: not Linux)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Measured:
    """One measured call.

    Attributes:
        seconds: its wall-clock time.
        peak_bytes: the largest resident set size above the one at its start (CPU), or the CUDA allocator's
            peak above its allocation at the start (a CUDA ``device``); ``None`` where neither can be read.
        value: what the call returned.
    """

    seconds: float
    peak_bytes: int | None
    value: Any


def measure(fn: Callable[[], Any], *, device: torch.device | str | None = None, collect: bool = True) -> Measured:
    """Run ``fn()`` once and measure it (:class:`Measured`); ``collect``: a garbage collection first, so that
    the start is not inflated by garbage of earlier work."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if collect:
        gc.collect()
    cuda = device.type == "cuda" and torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start_cuda = torch.cuda.memory_allocated(device)
    start = resident_bytes()
    peak = [start or 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            peak[0] = max(peak[0], resident_bytes() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    try:
        value = fn()
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        seconds = time.perf_counter() - began
        done.set()
        sampler.join()
    if cuda:
        return Measured(seconds, int(torch.cuda.max_memory_allocated(device) - start_cuda), value)
    end = resident_bytes()
    if start is None or end is None:
        return Measured(seconds, None, value)
    return Measured(seconds, int(max(peak[0], end) - start), value)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or architecture."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: torch.device | str | None = None) -> str:
    """The hardware a measurement on ``device`` ran on: ``"NVIDIA H100 80GB HBM3"`` or ``"<CPU model>, 2 cores,
    2 torch threads"``."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
