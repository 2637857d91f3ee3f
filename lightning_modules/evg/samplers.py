"""Samplers of the adversarial evaluation, batched over chains (EvG; Yoon et al., DESIGN.md §5.4).

Each sampler minimises a black-box energy ``E(z)`` (the detector's standardised outlier score of the image
a variation model makes from ``z``; no detector gradients) for many chains at once and returns, per chain,
the **lowest-energy state over its whole trajectory**, the step at which it was found, the acceptance rate
and a thinned trace. Only the running minimum lives on the device: memory is O(chains × D), not
O(steps × chains × D), plus the thinned trace of energies, O(steps / trace_every × chains).

- :func:`metropolis_hastings`, exactly as the authors' ``sample_mh``: start uniform in the domain, propose
  ``z' = project(z + 0.1·N(0, I))`` (clamp to the box, or renormalise onto the sphere), accept when
  ``exp(-(E(z') - E(z)) / T) >= U``, ``U ~ U[0, 1)``, T = 1, 2000 steps. One detector call per step.
- :func:`random_search`: ``steps`` independent uniform points of the domain, the minimum over them (the
  authors' ``RandomSampler``: ``n_step`` = 2000 draws, 2,000 detector calls in all; MH makes 2,001, its
  start and 2,000 proposals, as their ``sample_mh``). The first draw is MH's start.
- :func:`coordinate_descent`, the coordinate descent of the paper's Figure 2 (the authors' deterministic
  ``coordinate_descent``): at iteration ``i`` (from 0) the coordinate ``d = i mod D`` gets the forward
  finite difference ``g = (E(project(z + h·e_d)) - E(z)) / h`` and moves ``z_d -= step_size·h·g``, projected
  onto the domain; h = 0.1, step_size = 0.05. Every move is taken (no acceptance test), two detector calls
  per iteration; it starts where MH starts, so it shows what MH's random acceptance of uphill moves buys.
- :func:`zeroth_order_linf`, the paper's black-box l∞ baseline as they ran it (their ``coordinate_descent``
  with momentum and ``svhn_coord.yml``): a random direction ``e = h·N(0, I)``, the finite-difference gradient
  ``g = e·(E(x + e) - E(x)) / h`` (the probe clamped to the pixel range only), momentum ``v = η·g + μ·v``,
  ``x -= v`` clamped to the l∞ ball around the clean image and then to the pixel range; h = 0.005, η = 0.1,
  μ = 0.999, η and h halved every 2,000 iterations, 20,000 iterations, ε = 0.01. Its budget is its own
  (``iterations``, two detector calls each), independent of the other samplers' ``steps``
  (:data:`OWN_BUDGET`).

Random numbers: each chain has its own counter-based generator (:mod:`lightning_modules.evg.chain_random`), so
a chain's results do not depend on its batch, the batch size or the number of processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_modules.evg.chain_random import (
    STREAM_ACCEPT,
    STREAM_PROPOSAL,
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
        nan_proposals: ``(chains,)`` detector calls whose energy was NaN, each a rejected proposal (the
            authors' acceptance ``exp(-ΔE/T) >= U`` is false for NaN; the finite-difference searches do not
            move on one); a chain whose start is NaN accepts its first finite proposal (this project's rule:
            the authors' would keep it at its start) and keeps the lowest finite state as its minimum.
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
    nan_proposals: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))


class _Tracker:
    """Running minimum per chain and a thinned trace; everything stays on the energies' device."""

    def __init__(self, points: Tensor, energy: Tensor, trace_every: int, counted: _Counted) -> None:
        self.counted = counted
        self.points, self.energy = points.clone(), energy.clone()
        self.start_energy = energy.clone()
        self.best_step = torch.zeros_like(energy, dtype=torch.long)
        self.trace_every = trace_every
        self.steps: list[int] = [0]
        self.current: list[Tensor] = [energy.clone()]
        self.best: list[Tensor] = [energy.clone()]

    def update(self, step: int, points: Tensor, energy: Tensor) -> None:
        # strict: the earliest of equal minima is kept; a finite energy beats a NaN one (a NaN start)
        better = (energy < self.energy) | (torch.isnan(self.energy) & ~torch.isnan(energy))
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
                            torch.tensor(self.steps), torch.stack(self.current), torch.stack(self.best),
                            self.counted.nan.cpu())


class _Counted:
    """The energy, checked for one value per chain, counting NaN energies per chain (rejected proposals)."""

    def __init__(self, energy: Energy, chains: Tensor) -> None:
        self.energy = energy
        self.nan = torch.zeros(chains.numel(), dtype=torch.long, device=chains.device)

    def __call__(self, points: Tensor) -> Tensor:
        values = self.energy(points)
        if values.shape != points.shape[:1]:
            raise ValueError(f"the energy must return one value per chain, got shape {tuple(values.shape)} for "
                             f"{points.shape[0]} chains")
        self.nan += torch.isnan(values).to(self.nan.device).long()
        return values


def _kept_if_nan(new_points: Tensor, new_energy: Tensor, points: Tensor, energy: Tensor) -> tuple[Tensor, Tensor]:
    """A finite-difference move whose energy is NaN is not made (the state stays)."""
    bad = torch.isnan(new_energy) & ~torch.isnan(energy)
    return torch.where(bad.unsqueeze(1), points, new_points), torch.where(bad, energy, new_energy)


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
    checked = _Counted(energy, chains)
    e = checked(x)
    tracker = _Tracker(x, e, trace_every, checked)
    accepted = torch.zeros_like(e, dtype=torch.long)
    numbers = ChainNumbers(seed, chains)
    for step in range(1, steps + 1):
        noise = numbers.normal(step, STREAM_PROPOSAL, domain.dim, last_step=steps).to(x.dtype)
        proposal = domain.project(x + step_size * noise)
        e_new = checked(proposal)
        u = numbers.uniform(step, STREAM_ACCEPT, 1, last_step=steps).view(-1)
        # a NaN proposal is rejected (exp(NaN) >= U is false); a NaN current state (only the start can be one)
        # takes any finite proposal -- the authors' rule would keep such a chain at its start for ever
        current = torch.nan_to_num(e.double(), nan=math.inf)
        accept = torch.exp(-(e_new.double() - current) / temperature) >= u
        x = torch.where(accept.unsqueeze(1), proposal, x)
        e = torch.where(accept, e_new, e)
        accepted += accept.long()
        tracker.update(step, x, e)
        tracker.trace(step, e, step == steps)
    acceptance = accepted.double() / max(steps, 1) if steps else torch.full_like(e, float("nan"), dtype=torch.float64)
    return tracker.result(acceptance, steps + 1)


def random_search(energy: Energy, domain: Domain, chains: Tensor, *, steps: int = 2000, seed: int = 0,
                  trace_every: int = 10) -> SearchResult:
    """The minimum of ``steps`` uniform points of the domain per chain (see the module docstring).

    Draw ``t`` (``t = 0 .. steps - 1``) is ``start_points`` at ``t = 0`` (MH's start) and the chain's uniforms of
    step ``t`` after it: ``steps`` detector calls in all, as the authors' ``RandomSampler`` (``n_step`` draws).

    Args:
        energy: points ``(chains, D)`` -> energies ``(chains,)``.
        domain: the variation model's domain.
        chains: ``(chains,)`` chain indices (keys of their random generators).
        steps: the draws (detector calls) per chain, at least 1 (the authors' 2000).
        seed: the run's seed.
        trace_every: keep the current and best energies every this many draws (0: none).

    Raises:
        ValueError: steps < 1.
    """
    if steps < 1:
        raise ValueError(f"random search needs at least one draw, got steps={steps}")
    x = start_points(domain, seed, chains).to(chains.device)
    checked = _Counted(energy, chains)
    e = checked(x)
    tracker = _Tracker(x, e, trace_every, checked)
    numbers = ChainNumbers(seed, chains)
    for step in range(1, steps):
        uniform = numbers.uniform(step, STREAM_START, domain.dim, last_step=steps - 1)
        normal = (numbers.normal(step, STREAM_START_NORMAL, domain.dim, last_step=steps - 1)
                  if domain.kind == "sphere" else uniform)
        x = domain.from_uniform(uniform, normal).to(x.dtype)
        e = checked(x)
        tracker.update(step, x, e)
        tracker.trace(step, e, step == steps - 1)
    return tracker.result(torch.full_like(e, float("nan"), dtype=torch.float64), steps)


def coordinate_descent(energy: Energy, domain: Domain, chains: Tensor, *, steps: int = 2000, h: float = 0.1,
                       step_size: float = 0.05, seed: int = 0, trace_every: int = 10,
                       start: Tensor | None = None) -> SearchResult:
    """The coordinate descent of the paper's Figure 2 (see the module docstring).

    Args:
        energy: points ``(chains, D)`` -> energies ``(chains,)``.
        domain: the variation model's domain.
        chains: ``(chains,)`` chain indices.
        steps: iterations, two detector calls each (the probe and the new state).
        h: the finite-difference step (0.1).
        step_size: η (0.05): the move is ``η·(E(z + h·e_d) - E(z))``.
        seed: the run's seed (the uniform start, as MH's).
        trace_every: keep the current and best energies every this many detector calls (0: none).
        start: ``(chains, D)`` start points (default: uniform in the domain).

    Raises:
        ValueError: steps < 0, or h or step_size not positive.
    """
    if steps < 0 or h <= 0 or step_size <= 0:
        raise ValueError(f"coordinate descent needs steps >= 0, h > 0 and step_size > 0, got {steps}, {h}, "
                         f"{step_size}")
    x = (start if start is not None else start_points(domain, seed, chains)).to(chains.device)
    checked = _Counted(energy, chains)
    e = checked(x)
    tracker = _Tracker(x, e, trace_every, checked)
    for iteration in range(steps):
        coordinate = iteration % domain.dim
        probe = x.clone()
        probe[:, coordinate] += h
        e_probe = checked(domain.project(probe))
        difference = torch.nan_to_num((e_probe - e) / h, nan=0.0)  # a NaN probe: no move
        moved = x.clone()
        moved[:, coordinate] -= step_size * h * difference.to(x.dtype)
        moved = domain.project(moved)
        x, e = _kept_if_nan(moved, checked(moved), x, e)
        call = 2 * (iteration + 1)
        tracker.update(call, x, e)
        tracker.trace(call, e, iteration == steps - 1)
    return tracker.result(torch.full_like(e, float("nan"), dtype=torch.float64), 1 + 2 * steps)


def zeroth_order_linf(energy: Energy, domain: Domain, chains: Tensor, *, iterations: int = 20000,
                      h: float = 0.005, step_size: float = 0.1, momentum: float = 0.999, halve_every: int | None = 2000,
                      seed: int = 0, trace_every: int = 10, start: Tensor | None = None,
                      low: Tensor | None = None, high: Tensor | None = None) -> SearchResult:
    """The black-box l∞ baseline as the paper ran it (see the module docstring).

    The state is the perturbation ``z = x - x0`` of a :class:`PixelPerturbation`, whose domain is the ball
    ``[-ε, ε]^D``; the search starts at its centre (the clean image).

    Args:
        energy: perturbations ``(chains, D)`` -> energies ``(chains,)`` (of ``clamp(x0 + z, 0, 1)``).
        domain: the l∞ ball ``[-ε, ε]^D``.
        chains: ``(chains,)`` chain indices (keys of their random generators).
        iterations: 20,000 (``n_step`` of ``svhn_coord.yml``); two detector calls each.
        h, step_size, momentum: 0.005, 0.1, 0.999.
        halve_every: halve ``step_size`` and ``h`` after iteration ``k·halve_every`` (counted from 0, as the
            authors' ``i_iter > 0 and i_iter % half_every == 0``); ``None``: never.
        seed: the run's seed.
        trace_every: keep the current and best energies every this many detector calls (0: none).
        start: ``(chains, D)`` start perturbations (default: 0).
        low, high: ``(chains, D)`` the pixel range as a perturbation, ``-x0`` and ``1 - x0``
            (:meth:`PixelPerturbation.state_bounds`): the authors clamp the state image to ``[0, 1]``; without
            them only the ball bounds the state.

    Raises:
        ValueError: a domain that is not a box, iterations < 0, h or step_size not positive, a momentum
            outside ``[0, 1)`` or halve_every < 1.
    """
    if domain.kind != "box":
        raise ValueError("the l-infinity search works on a box domain (a PixelPerturbation)")
    if iterations < 0 or h <= 0 or step_size <= 0 or not 0 <= momentum < 1:
        raise ValueError(f"the l-infinity search needs iterations >= 0, h > 0, step_size > 0 and momentum in [0, 1), "
                         f"got {iterations}, {h}, {step_size}, {momentum}")
    if halve_every is not None and halve_every < 1:
        raise ValueError(f"halve_every must be positive (or None), got {halve_every}")
    x = (start if start is not None else torch.full((chains.numel(), domain.dim), (domain.low + domain.high) / 2))
    x = x.to(chains.device)

    def pixel_range(points: Tensor) -> Tensor:
        if low is not None:
            points = torch.maximum(points, low.to(points))
        if high is not None:
            points = torch.minimum(points, high.to(points))
        return points

    x = pixel_range(x)
    checked = _Counted(energy, chains)
    e = checked(x)
    tracker = _Tracker(x, e, trace_every, checked)
    velocity = torch.zeros_like(x)
    numbers = ChainNumbers(seed, chains)
    for iteration in range(1, iterations + 1):
        direction = h * numbers.normal(iteration, STREAM_PROPOSAL, domain.dim, last_step=iterations).to(x.dtype)
        e_probe = checked(pixel_range(x + direction))
        gradient = direction * torch.nan_to_num((e_probe - e) / h, nan=0.0).to(x.dtype).unsqueeze(1)
        velocity = step_size * gradient + momentum * velocity
        moved = pixel_range(domain.project(x - velocity))
        x, e = _kept_if_nan(moved, checked(moved), x, e)
        tracker.update(2 * iteration, x, e)
        tracker.trace(2 * iteration, e, iteration == iterations)
        if halve_every is not None and iteration - 1 > 0 and (iteration - 1) % halve_every == 0:
            step_size, h = step_size / 2.0, h / 2.0
    return tracker.result(torch.full_like(e, float("nan"), dtype=torch.float64), 1 + 2 * iterations)


SAMPLERS: dict[str, Callable[..., SearchResult]] = {
    "mh": metropolis_hastings,
    "random": random_search,
    "coordinate": coordinate_descent,
    "linf": zeroth_order_linf,
}

OWN_BUDGET = frozenset({"linf"})
"""Samplers with their own budget (the l∞ baseline's ``iterations``), not the search's ``steps``."""


def budget_of(sampler: str, steps: int) -> dict[str, int]:
    """The budget keyword the search passes to a sampler: ``steps`` for every sampler but :data:`OWN_BUDGET`
    (whose defaults, or their ``sampler_args``, decide)."""
    return {} if sampler in OWN_BUDGET else {"steps": steps}
