"""The store of EvG's chain results on disk: one file per batch of chains (``chains-<first>-<last>.pt``, written
atomically), read back to resume an interrupted run and to assemble the report (:class:`callbacks.EvGReport`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from openset_common.artefacts import atomic_write_bytes


class ChainStore:
    """The chain results of one run (its folder is named by the run's key, so another run never reads them).

    Args:
        directory: the run's folder of chain files.
        chains: the number of chains of the run (:meth:`assemble` checks that each has exactly one result).
    """

    def __init__(self, directory: str | Path, chains: int) -> None:
        self.directory, self.chains = Path(directory), int(chains)

    def file(self, first: int, stop: int) -> Path:
        """The file of the batch of chains ``[first, stop)``."""
        return self.directory / f"chains-{first:07d}-{stop - 1:07d}.pt"

    def check_batches(self, bounds: Sequence[tuple[int, int]]) -> None:
        """Refuse, before any chain runs, to resume a run whose chain files were written with another split of
        the chains into batches (another ``chains_per_batch``): they would be recomputed and overlap."""
        expected = {self.file(first, stop).name for first, stop in bounds}
        foreign = sorted(p.name for p in self.directory.glob("chains-*.pt") if p.name not in expected)
        if foreign:
            first, last = (int(part) for part in foreign[0].removesuffix(".pt").split("-")[1:])
            raise ValueError(f"{self.directory} holds chain results of this run in other batches ({foreign[0]}: "
                             f"{last - first + 1} chains per batch, or another number of chains); resume with "
                             "the chains_per_batch and chains of the interrupted run, or use another output_dir")

    def done(self, first: int, stop: int) -> bool:
        """Whether the batch of chains ``[first, stop)`` has a readable result."""
        return self.read(self.file(first, stop)) is not None

    @staticmethod
    def read(path: Path) -> dict[str, Any] | None:
        """A chain file's payload, or ``None`` (absent, unreadable, not a chain file)."""
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # a truncated file of an interrupted write cannot exist (atomic), but a foreign one can
            return None
        return payload if isinstance(payload, dict) and "chains" in payload and "results" in payload else None

    def write(self, outputs: dict[str, Any]) -> tuple[int, int]:
        """Write one batch's results (``outputs["chains"]``: its chain indices, consecutive); its bounds."""
        chains = outputs["chains"]
        first, stop = int(chains[0]), int(chains[-1]) + 1
        buffer = io.BytesIO()
        torch.save(outputs, buffer)
        atomic_write_bytes(self.file(first, stop), buffer.getvalue())
        return first, stop

    def assemble(self) -> dict[tuple[str, str, str], dict[str, Tensor]]:
        """Every chain's result, per (detector, variation, sampler), ordered by chain index."""
        parts = []
        for path in sorted(self.directory.glob("chains-*.pt")):
            payload = self.read(path)
            if payload is None:
                raise RuntimeError(f"chain result {path} is unreadable; delete it and run again to recompute it")
            parts.append(payload)
        if not parts:
            raise RuntimeError(f"no chain results in {self.directory}")
        chains = torch.cat([p["chains"] for p in parts])
        order = torch.argsort(chains)
        if not torch.equal(chains[order], torch.arange(self.chains)):
            missing = sorted(set(range(self.chains)) - set(chains.tolist()))[:10]
            raise RuntimeError(f"chain results in {self.directory} cover {chains.numel()} chains, expected "
                               f"0..{self.chains - 1} once each (missing e.g. {missing})")
        assembled: dict[tuple[str, str, str], dict[str, Tensor]] = {}
        for combo in parts[0]["results"]:
            merged: dict[str, Tensor] = {}
            for key in parts[0]["results"][combo]:
                values = [p["results"][combo][key] for p in parts]
                if key in ("calls", "trace_steps"):  # the same in every batch
                    merged[key] = values[0]
                elif key in ("trace_energy", "trace_best"):
                    merged[key] = torch.cat(values, dim=1)[:, order]
                else:
                    merged[key] = torch.cat(values)[order]
            assembled[combo] = merged
        return assembled


__all__ = ["ChainStore"]
