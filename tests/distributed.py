"""Run a function in several real gloo processes on the CPU and collect what each rank returns."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as handle:
            pickle.dump(result, handle)
    finally:
        dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; return the results by rank.

    ``fn`` must be a module-level function (it is pickled into spawned processes).
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, _free_port(), fn, args, out_dir), nprocs=world_size, join=True)
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as handle:
                results.append(pickle.load(handle))
    return results
