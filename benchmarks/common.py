"""Timing helpers shared by the benchmarks: best-of-k wall time and a RESULTS.md section writer."""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("RESULTS.md")


def best_time(fn: Callable[[], object], *, repeat: int = 3) -> float:
    """The fastest of ``repeat`` wall-clock runs, in seconds (after one untimed warm-up run)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), Python {platform.python_version()}")


def write_section(name: str, body: str) -> None:
    """Replace (or append) the ``## name`` section of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by the scripts in this folder (`make benchmark`).\n"
    section = f"## {name}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")
