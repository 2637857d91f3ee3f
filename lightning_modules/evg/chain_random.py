"""The random numbers of EvG's chains: one counter-based generator per chain (DESIGN.md §5.4).

Each chain has its own counter-based generator keyed by ``(seed, chain index)`` -- a
stateless integer hash of ``(seed, chain, step, stream, coordinate)`` turned into uniforms (and normals by
Box–Muller), computed on the device for all chains and a block of up to 64 steps at once. A chain's
numbers do not depend on which other chains share its batch, on the batch size or on the number of
processes, so neither do its results.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# streams of the chain generator (one per use, so no two uses share numbers)
STREAM_START, STREAM_START_NORMAL, STREAM_PROPOSAL, STREAM_ACCEPT, STREAM_SIGN = 1, 2, 3, 4, 5


def _mulmod32(x: Tensor, constant: int) -> Tensor:
    """``x * constant mod 2^32`` for int64 tensors holding values below 2^32, without int64 overflow."""
    high, low = x >> 16, x & 0xFFFF
    return ((((high * constant) & 0xFFFF) << 16) + low * constant) & _MASK32


def _hash32(x: Tensor) -> Tensor:
    """A 32-bit integer finaliser ("lowbias32", C. Wellons' hash prospector): every input bit affects every
    output bit; on int64 tensors holding values below 2^32."""
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def chain_keys(seed: int, chains: Tensor) -> Tensor:
    """``(chains, 1)`` the key of each chain's generator: a hash of (seed, chain index), fixed for the run."""
    chains = chains.to(torch.int64).view(-1, 1)
    return _hash32(_hash32(torch.full_like(chains, seed & _MASK32)) ^ (chains & _MASK32))


def _block_bits(keys: Tensor, steps: Tensor, stream: int, count: int) -> Tensor:
    """``(len(steps), chains, count)`` 32-bit random integers for chain keys ``(chains, 1)`` at several steps."""
    key = _hash32(keys.unsqueeze(0) ^ ((steps.to(torch.int64) * 0x9E3779B1) & _MASK32).view(-1, 1, 1))
    key = _hash32(key ^ ((stream * 0x85EBCA77) & _MASK32))
    coordinates = torch.arange(count, device=keys.device, dtype=torch.int64).view(1, 1, -1)
    return _hash32(_hash32(key ^ coordinates) ^ 0x27D4EB2F)


def _to_uniform(bits: Tensor) -> Tensor:
    return (bits.double() + 0.5) / 4294967296.0


def _to_normal(uniform: Tensor, count: int) -> Tensor:
    """Box–Muller on ``2·count`` uniforms (last dimension) -> ``count`` standard normals."""
    return torch.sqrt(-2.0 * torch.log(uniform[..., :count])) * torch.cos(2.0 * math.pi * uniform[..., count:])


def chain_bits(seed: int, chains: Tensor, step: int, stream: int, count: int) -> Tensor:
    """``(len(chains), count)`` 32-bit random integers (int64) of chain generators keyed by (seed, chain)."""
    steps = torch.tensor([step], device=chains.device)
    return _block_bits(chain_keys(seed, chains), steps, stream, count)[0]


def chain_uniform(seed: int, chains: Tensor, step: int, stream: int, count: int) -> Tensor:
    """Uniforms in ``(0, 1)`` (float64, from 32 bits), ``(len(chains), count)``."""
    return _to_uniform(chain_bits(seed, chains, step, stream, count))


def chain_normal(seed: int, chains: Tensor, step: int, stream: int, count: int) -> Tensor:
    """Standard normals (Box–Muller on two uniforms per value), float64, ``(len(chains), count)``."""
    return _to_normal(chain_uniform(seed, chains, step, stream, 2 * count), count)


class ChainNumbers:
    """The numbers of a batch of chains, step by step, generated a block of steps at a time (one set of
    tensor operations per block instead of per step; the same values as :func:`chain_normal` /
    :func:`chain_uniform` at each step). A block holds at most ``budget`` values per stream."""

    def __init__(self, seed: int, chains: Tensor, *, budget: int = 1 << 22) -> None:
        self.keys = chain_keys(seed, chains)
        self.budget = budget
        self._blocks: dict[tuple[int, str, int], tuple[int, Tensor]] = {}

    def _get(self, step: int, stream: int, kind: str, count: int, last_step: int) -> Tensor:
        cached = self._blocks.get((stream, kind, count))
        if cached is None or not cached[0] <= step < cached[0] + cached[1].shape[0]:
            width = count * (2 if kind == "normal" else 1)
            size = max(1, min(64, self.budget // max(1, self.keys.shape[0] * width), last_step - step + 1))
            steps = torch.arange(step, step + size, device=self.keys.device)
            uniform = _to_uniform(_block_bits(self.keys, steps, stream, width))
            block = _to_normal(uniform, count) if kind == "normal" else uniform
            cached = (step, block)
            self._blocks[(stream, kind, count)] = cached
        return cached[1][step - cached[0]]

    def normal(self, step: int, stream: int, count: int, *, last_step: int) -> Tensor:
        return self._get(step, stream, "normal", count, last_step)

    def uniform(self, step: int, stream: int, count: int, *, last_step: int) -> Tensor:
        return self._get(step, stream, "uniform", count, last_step)
