"""Timing helpers shared by the benchmarks: best-of-k wall time, per-hook callback timing and a RESULTS.md
section writer."""

from __future__ import annotations

import functools
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def load_average() -> str:
    """The 1-minute load average against the core count (other processes skew CPU timings), e.g. ``"2.1 / 2"``."""
    try:
        return f"{os.getloadavg()[0]:.1f} / {os.cpu_count()}"
    except OSError:  # not available on this platform
        return "n/a"


def time_hooks(callback: Any, *, synchronize: Callable[[], None] | None = None) -> dict[str, float]:
    """Accumulate the wall time spent inside each hook of one Lightning callback instance.

    The hooks the callback's class overrides (``setup``, ``teardown`` and ``on_*``) are wrapped on the
    instance itself (Lightning looks them up with ``getattr``), so other instances are untouched.

    Args:
        callback: a ``pytorch_lightning.Callback``.
        synchronize: called before and after each hook (``torch.cuda.synchronize`` on a GPU), so that GPU
            work the model queued before the hook is not charged to the callback.

    Returns:
        hook name -> seconds spent in it so far; the dict is updated in place as the hooks run.
    """
    import pytorch_lightning as pl

    seconds: dict[str, float] = {}
    for name in dir(pl.Callback):
        if not (name.startswith("on_") or name in ("setup", "teardown")):
            continue
        if getattr(type(callback), name, None) is getattr(pl.Callback, name):
            continue  # not overridden: Lightning's no-op
        hook = getattr(callback, name)

        @functools.wraps(hook)
        def timed(*args: Any, _hook: Callable[..., Any] = hook, _name: str = name, **kwargs: Any) -> Any:
            if synchronize is not None:
                synchronize()
            start = time.perf_counter()
            try:
                return _hook(*args, **kwargs)
            finally:
                if synchronize is not None:
                    synchronize()
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - start

        setattr(callback, name, timed)
    return seconds


def write_section(name: str, body: str) -> None:
    """Replace (or append) the ``## name`` section of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by the scripts in this folder (`make benchmark`).\n"
    section = f"## {name}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")
