"""Samplers of the adversarial evaluation, batched over chains (EvG; Yoon et al., DESIGN.md §5.4).

Each sampler minimises a black-box energy ``E(z)`` (the detector's standardised outlier score of the image
a variation model makes from ``z``; no detector gradients) for many chains at once and returns, per chain,
the **lowest-energy state over its whole trajectory**, the step at which it was found, the acceptance rate
and a thinned trace. Only the running minimum lives on the device: memory is O(chains × D), not
O(steps × chains × D), plus the thinned trace of energies, O(steps / trace_every × chains).

- :func:`metropolis_hastings`, exactly as the authors' ``sample_mh``: start uniform in the domain, propose
  ``z' = project(z + 0.1·N(0, I))`` (clamp to the box, or renormalise onto the sphere), accept when
  ``exp(-(E(z') - E(z)) / T) >= U``, ``U ~ U[0, 1)``, T = 1, 2000 steps. One detector call per step.
- :func:`random_search`: a fresh uniform point every step (the authors' ``RandomSampler``).
- :func:`coordinate_descent`: greedy search along one coordinate at a time (cyclic), ``z ± step_size·e_d``
  with a random sign, kept only when the energy drops; it starts where MH starts, so it shows what MH's
  random acceptance of uphill moves buys.
- :func:`zeroth_order_linf`, the paper's black-box l∞ baseline (the authors' ``coordinate_descent`` with
  their recommended image settings): a random direction ``e = h·N(0, I)``, the finite-difference gradient
  ``e·(E(z + e) - E(z)) / h``, momentum ``v = η·g + μ·v``, ``z -= v``, projected onto the l∞ ball and the
  box; h = 0.005, η = 0.01, μ = 0.999. Two detector calls per iteration, so it runs ``steps // 2``
  iterations to keep the budget of the others.

Random numbers: each chain has its own counter-based generator keyed by ``(seed, chain index)`` -- a
stateless integer hash of ``(seed, chain, step, stream, coordinate)`` turned into uniforms (and normals by
Box–Muller), computed on the device for all chains and a block of up to 64 steps at once. A chain's
numbers do not depend on which other chains share its batch, on the batch size or on the number of
processes, so neither do its results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_modules.evg.variations import Domain

Energy = Callable[[Tensor], Tensor]

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


def start_points(domain: Domain, seed: int, chains: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The uniform start of each chain in the domain (the same for every sampler that starts at random)."""
    uniform = chain_uniform(seed, chains, 0, STREAM_START, domain.dim)
    normal = chain_normal(seed, chains, 0, STREAM_START_NORMAL, domain.dim) if domain.kind == "sphere" else uniform
    return domain.from_uniform(uniform, normal).to(dtype)


@dataclass
class SearchResult:
    """Per chain: the lowest-energy state of the trajectory and how the search went.

    Attributes:
        points: ``(chains, D)`` lowest-energy states.
        energy: ``(chains,)`` their energies.
        best_step: ``(chains,)`` the step at which each was found (0 = the start).
        start_energy: ``(chains,)`` energy of the first state.
        acceptance: ``(chains,)`` fraction of accepted proposals (NaN for random search, which has none).
        calls: detector calls per chain.
        trace_steps: ``(T,)`` the steps of the thinned trace.
        trace_energy: ``(T, chains)`` current energy at those steps.
        trace_best: ``(T, chains)`` running minimum at those steps.
    """

    points: Tensor
    energy: Tensor
    best_step: Tensor
    start_energy: Tensor
    acceptance: Tensor
    calls: int
    trace_steps: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    trace_energy: Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    trace_best: Tensor = field(default_factory=lambda: torch.zeros(0, 0))


class _Tracker:
    """Running minimum per chain and a thinned trace; everything stays on the energies' device."""

    def __init__(self, points: Tensor, energy: Tensor, trace_every: int) -> None:
        self.points, self.energy = points.clone(), energy.clone()
        self.start_energy = energy.clone()
        self.best_step = torch.zeros_like(energy, dtype=torch.long)
        self.trace_every = trace_every
        self.steps: list[int] = [0]
        self.current: list[Tensor] = [energy.clone()]
        self.best: list[Tensor] = [energy.clone()]

    def update(self, step: int, points: Tensor, energy: Tensor) -> None:
        better = energy < self.energy  # strict: the earliest of equal minima is kept
        self.points = torch.where(better.unsqueeze(1), points, self.points)
        self.energy = torch.where(better, energy, self.energy)
        self.best_step = torch.where(better, step, self.best_step)

    def trace(self, step: int, energy: Tensor, last: bool) -> None:
        if self.trace_every > 0 and (step % self.trace_every == 0 or last) and step != self.steps[-1]:
            self.steps.append(step)
            self.current.append(energy.clone())
            self.best.append(self.energy.clone())

    def result(self, acceptance: Tensor, calls: int) -> SearchResult:
        return SearchResult(self.points, self.energy, self.best_step, self.start_energy, acceptance, calls,
                            torch.tensor(self.steps), torch.stack(self.current), torch.stack(self.best))


def _checked(energy: Energy, points: Tensor) -> Tensor:
    values = energy(points)
    if values.shape != points.shape[:1]:
        raise ValueError(f"the energy must return one value per chain, got shape {tuple(values.shape)} for "
                         f"{points.shape[0]} chains")
    if torch.isnan(values).any():
        raise ValueError("the energy returned NaN: the detector's score of a generated image is not a number")
    return values


def metropolis_hastings(
    energy: Energy,
    domain: Domain,
    chains: Tensor,
    *,
    steps: int = 2000,
    step_size: float = 0.1,
    temperature: float = 1.0,
    seed: int = 0,
    trace_every: int = 10,
    start: Tensor | None = None,
) -> SearchResult:
    """Batched Metropolis–Hastings (see the module docstring).

    Args:
        energy: points ``(chains, D)`` -> energies ``(chains,)``.
        domain: the variation model's domain.
        chains: ``(chains,)`` chain indices (keys of their random generators).
        steps, step_size, temperature: the authors' 2000, 0.1, 1.
        seed: the run's seed.
        trace_every: keep the current and best energies every this many steps (0: none).
        start: ``(chains, D)`` start points (default: uniform in the domain).
    """
    if steps < 0 or step_size <= 0 or temperature <= 0:
        raise ValueError(f"MH needs steps >= 0, step_size > 0 and temperature > 0, got {steps}, {step_size}, "
                         f"{temperature}")
    device = chains.device
    x = (start if start is not None else start_points(domain, seed, chains)).to(device)
    e = _checked(energy, x)
    tracker = _Tracker(x, e, trace_every)
    accepted = torch.zeros_like(e, dtype=torch.long)
    numbers = ChainNumbers(seed, chains)
    for step in range(1, steps + 1):
        noise = numbers.normal(step, STREAM_PROPOSAL, domain.dim, last_step=steps).to(x.dtype)
        proposal = domain.project(x + step_size * noise)
        e_new = _checked(energy, proposal)
        u = numbers.uniform(step, STREAM_ACCEPT, 1, last_step=steps).view(-1)
        accept = torch.exp(-(e_new.double() - e.double()) / temperature) >= u
        x = torch.where(accept.unsqueeze(1), proposal, x)
        e = torch.where(accept, e_new, e)
        accepted += accept.long()
        tracker.update(step, x, e)
        tracker.trace(step, e, step == steps)
    acceptance = accepted.double() / max(steps, 1) if steps else torch.full_like(e, float("nan"), dtype=torch.float64)
    return tracker.result(acceptance, steps + 1)


def random_search(energy: Energy, domain: Domain, chains: Tensor, *, steps: int = 2000, seed: int = 0,
                  trace_every: int = 10) -> SearchResult:
    """A uniform point of the domain at every step (the same start as MH at step 0)."""
    x = start_points(domain, seed, chains).to(chains.device)
    e = _checked(energy, x)
    tracker = _Tracker(x, e, trace_every)
    numbers = ChainNumbers(seed, chains)
    for step in range(1, steps + 1):
        uniform = numbers.uniform(step, STREAM_START, domain.dim, last_step=steps)
        normal = (numbers.normal(step, STREAM_START_NORMAL, domain.dim, last_step=steps) if domain.kind == "sphere"
                  else uniform)
        x = domain.from_uniform(uniform, normal).to(x.dtype)
        e = _checked(energy, x)
        tracker.update(step, x, e)
        tracker.trace(step, e, step == steps)
    return tracker.result(torch.full_like(e, float("nan"), dtype=torch.float64), steps + 1)


def coordinate_descent(energy: Energy, domain: Domain, chains: Tensor, *, steps: int = 2000,
                       step_size: float = 0.1, seed: int = 0, trace_every: int = 10,
                       start: Tensor | None = None) -> SearchResult:
    """Greedy coordinate search: at step t, coordinate ``(t - 1) mod D`` moves by ``±step_size`` (random
    sign), projected onto the domain, and the move is kept only if the energy drops."""
    if step_size <= 0:
        raise ValueError(f"step_size must be positive, got {step_size}")
    x = (start if start is not None else start_points(domain, seed, chains)).to(chains.device)
    e = _checked(energy, x)
    tracker = _Tracker(x, e, trace_every)
    accepted = torch.zeros_like(e, dtype=torch.long)
    numbers = ChainNumbers(seed, chains)
    for step in range(1, steps + 1):
        coordinate = (step - 1) % domain.dim
        sign = torch.where(numbers.uniform(step, STREAM_SIGN, 1, last_step=steps).view(-1) < 0.5, -1.0, 1.0)
        proposal = x.clone()
        proposal[:, coordinate] += step_size * sign.to(x.dtype)
        proposal = domain.project(proposal)
        e_new = _checked(energy, proposal)
        accept = e_new < e
        x = torch.where(accept.unsqueeze(1), proposal, x)
        e = torch.where(accept, e_new, e)
        accepted += accept.long()
        tracker.update(step, x, e)
        tracker.trace(step, e, step == steps)
    return tracker.result(accepted.double() / max(steps, 1), steps + 1)


def zeroth_order_linf(energy: Energy, domain: Domain, chains: Tensor, *, steps: int = 2000, h: float = 0.005,
                      step_size: float = 0.01, momentum: float = 0.999, seed: int = 0, trace_every: int = 10,
                      start: Tensor | None = None) -> SearchResult:
    """The black-box l∞ baseline (see the module docstring); ``domain`` is the l∞ ball ``[-ε, ε]^D`` of a
    :class:`PixelPerturbation`, and the search starts at its centre (the clean image)."""
    if domain.kind != "box":
        raise ValueError("the l-infinity search works on a box domain (a PixelPerturbation)")
    iterations = steps // 2
    x = (start if start is not None else torch.full((chains.numel(), domain.dim), (domain.low + domain.high) / 2))
    x = x.to(chains.device)
    e = _checked(energy, x)
    tracker = _Tracker(x, e, trace_every)
    velocity = torch.zeros_like(x)
    numbers = ChainNumbers(seed, chains)
    for iteration in range(1, iterations + 1):
        direction = h * numbers.normal(iteration, STREAM_PROPOSAL, domain.dim, last_step=iterations).to(x.dtype)
        e_probe = _checked(energy, domain.project(x + direction))
        gradient = direction * ((e_probe - e) / h).unsqueeze(1)
        velocity = step_size * gradient + momentum * velocity
        x = domain.project(x - velocity)
        e = _checked(energy, x)
        tracker.update(2 * iteration, x, e)
        tracker.trace(2 * iteration, e, iteration == iterations)
    return tracker.result(torch.full_like(e, float("nan"), dtype=torch.float64), 1 + 2 * iterations)


SAMPLERS: dict[str, Callable[..., SearchResult]] = {
    "mh": metropolis_hastings,
    "random": random_search,
    "coordinate": coordinate_descent,
    "linf": zeroth_order_linf,
}
