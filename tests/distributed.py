"""Run a function in several real gloo processes on the CPU and collect what each rank returns.

The processes are started once per test session (a pool of ``world_size`` ranks that joined one gloo process
group) and reused by every call, instead of a spawn and a process group per test: each call costs the
function itself, not the ~7 s of starting two Python processes with torch. A call that fails on a rank
raises here with that rank's traceback; the pool is rebuilt for the next call.
"""

from __future__ import annotations

import atexit
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, port: int, tasks: Any, results: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        while (task := tasks.get()) is not None:
            fn, args = task
            try:
                results.put((rank, True, fn(rank, world_size, *args)))
            except BaseException:  # reported to the caller, which raises it
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class GlooPool:
    """``world_size`` processes in one gloo group, each running the functions it is given."""

    def __init__(self, world_size: int) -> None:
        context = mp.get_context("spawn")
        self.world_size = world_size
        self.tasks = [context.Queue() for _ in range(world_size)]
        self.results = context.Queue()
        port = _free_port()
        self.processes = [context.Process(target=_serve, args=(rank, world_size, port, self.tasks[rank], self.results),
                                          daemon=True) for rank in range(world_size)]
        for process in self.processes:
            process.start()

    def run(self, fn: Callable[..., Any], args: tuple) -> list[Any]:
        for queue in self.tasks:
            queue.put((fn, args))
        collected: dict[int, Any] = {}
        failures = []
        for _ in range(self.world_size):
            rank, ok, value = self.results.get(timeout=TIMEOUT_S)
            if ok:
                collected[rank] = value
            else:
                failures.append(f"rank {rank}:\n{value}")
        if failures:
            raise RuntimeError("a distributed call failed\n" + "\n".join(failures))
        return [collected[rank] for rank in range(self.world_size)]

    def close(self) -> None:
        for queue in self.tasks:
            queue.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


_POOLS: dict[int, GlooPool] = {}


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on every rank of the session's gloo pool; the results by rank.

    ``fn`` must be a module-level function (it is pickled into the processes); every rank must join every
    collective ``fn`` makes, or the call times out.
    """
    pool = _POOLS.get(world_size)
    if pool is None:
        pool = _POOLS[world_size] = GlooPool(world_size)
    try:
        return pool.run(fn, args)
    except BaseException:
        pool.close()
        del _POOLS[world_size]
        raise


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
