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

Random numbers: each chain has its own counter-based generator (:mod:`lightning_modules.evg.chain_random`), so
a chain's results do not depend on its batch, the batch size or the number of processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_modules.evg.chain_random import (
    STREAM_ACCEPT,
    STREAM_PROPOSAL,
    STREAM_SIGN,
    STREAM_START,
    STREAM_START_NORMAL,
    ChainNumbers,
    chain_normal,
    chain_uniform,
)
from lightning_modules.evg.variations import Domain

Energy = Callable[[Tensor], Tensor]

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
