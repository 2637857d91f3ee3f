"""Samplers of EvG (DESIGN.md §5.4): the chain generators, Metropolis–Hastings against a per-chain NumPy
implementation of the authors' rule, MH against coordinate descent on a multimodal energy, the trajectory
minimum, random search, the l∞ baseline, and chains independent of their batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from lightning_modules.evg.chain_random import (
    STREAM_ACCEPT,
    STREAM_PROPOSAL,
    STREAM_START,
    chain_normal,
    chain_uniform,
)
from lightning_modules.evg.samplers import (
    coordinate_descent,
    metropolis_hastings,
    random_search,
    start_points,
    zeroth_order_linf,
)
from lightning_modules.evg.variations import Domain

BOX2 = Domain("box", 2)
LOCAL, GLOBAL = np.array([0.2, 0.2]), np.array([0.8, 0.8])


def two_wells(points: torch.Tensor) -> torch.Tensor:
    """A shallow well (-1) at (0.2, 0.2) and a deep one (-3) at (0.8, 0.8), flat (0) between."""
    local = torch.tensor(LOCAL, dtype=points.dtype)
    deep = torch.tensor(GLOBAL, dtype=points.dtype)
    width = 2 * 0.06**2
    return (-1.0 * torch.exp(-((points - local) ** 2).sum(1) / width)
            - 3.0 * torch.exp(-((points - deep) ** 2).sum(1) / width))


def test_chain_generators_are_uniform_normal_and_independent() -> None:
    chains = torch.arange(2000)
    u = chain_uniform(7, chains, 3, STREAM_PROPOSAL, 5)
    assert u.shape == (2000, 5) and float(u.min()) > 0 and float(u.max()) < 1
    assert stats.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    n = chain_normal(7, chains, 3, STREAM_PROPOSAL, 5)
    assert stats.kstest(n.flatten().numpy(), "norm").pvalue > 1e-3
    # neighbouring chains, steps, streams and seeds are uncorrelated
    for other in (chain_normal(7, chains + 1, 3, STREAM_PROPOSAL, 5), chain_normal(7, chains, 4, STREAM_PROPOSAL, 5),
                  chain_normal(7, chains, 3, STREAM_ACCEPT, 5), chain_normal(8, chains, 3, STREAM_PROPOSAL, 5)):
        assert abs(float(np.corrcoef(n.flatten().numpy(), other.flatten().numpy())[0, 1])) < 0.05
    # a chain's numbers do not depend on the other chains asked for at the same time
    assert torch.equal(chain_normal(7, torch.tensor([5, 1999]), 3, STREAM_PROPOSAL, 5), n[[5, 1999]])


def reference_mh(energy, start: np.ndarray, normals: np.ndarray, uniforms: np.ndarray, *, step_size: float,
                 temperature: float) -> tuple[np.ndarray, float, int, float]:
    """One chain of the authors' rule in NumPy, given its random numbers: (best point, best energy, its step,
    acceptance rate). The trajectory is kept whole and its minimum taken at the end, as they do."""
    x = start.copy()
    e = energy(x)
    trajectory, energies, accepted = [x.copy()], [e], 0
    for step in range(len(normals)):
        proposal = np.clip(x + step_size * normals[step], 0.0, 1.0)
        e_new = energy(proposal)
        if np.exp(-(e_new - e) / temperature) >= uniforms[step]:
            x, e = proposal, e_new
            accepted += 1
        trajectory.append(x.copy())
        energies.append(e)
    best = int(np.argmin(energies))  # the first of equal minima
    return trajectory[best], energies[best], best, accepted / len(normals)


def numpy_two_wells(point: np.ndarray) -> float:
    width = 2 * 0.06**2
    return float(-1.0 * np.exp(-((point - LOCAL) ** 2).sum() / width) - 3.0 * np.exp(-((point - GLOBAL) ** 2).sum() / width))


@pytest.mark.parametrize("temperature", [0.3, 1.0])
def test_mh_equals_the_authors_rule_chain_by_chain(temperature: float) -> None:
    chains, steps, seed = torch.arange(12), 150, 4
    result = metropolis_hastings(lambda z: two_wells(z.double()), BOX2, chains, steps=steps, temperature=temperature,
                                 seed=seed, trace_every=0, start=start_points(BOX2, seed, chains, torch.float64))
    for chain in chains.tolist():
        index = torch.tensor([chain])
        normals = np.stack([chain_normal(seed, index, t, STREAM_PROPOSAL, 2)[0].numpy() for t in range(1, steps + 1)])
        uniforms = np.array([float(chain_uniform(seed, index, t, STREAM_ACCEPT, 1)) for t in range(1, steps + 1)])
        start = chain_uniform(seed, index, 0, STREAM_START, 2)[0].numpy()
        point, energy, step, acceptance = reference_mh(numpy_two_wells, start, normals, uniforms, step_size=0.1,
                                                       temperature=temperature)
        np.testing.assert_allclose(result.points[chain].numpy(), point, atol=1e-12)
        assert float(result.energy[chain]) == pytest.approx(energy, abs=1e-12)
        assert int(result.best_step[chain]) == step
        assert float(result.acceptance[chain]) == pytest.approx(acceptance)
    assert result.calls == steps + 1


def test_mh_finds_the_global_minimum_where_coordinate_descent_stays_local() -> None:
    chains = torch.arange(64)
    start = torch.tensor(LOCAL, dtype=torch.float32).expand(64, -1).clone()  # every chain in the shallow well
    mh = metropolis_hastings(two_wells, BOX2, chains, steps=2000, step_size=0.1, temperature=1.0, seed=0, start=start)
    descent = coordinate_descent(two_wells, BOX2, chains, steps=2000, step_size=0.1, seed=0, start=start)
    assert float((mh.energy < -2.5).double().mean()) >= 0.95  # the deep well, -3
    assert torch.allclose(mh.points[mh.energy < -2.5], torch.tensor(GLOBAL, dtype=torch.float32), atol=0.06)
    assert float(descent.energy.max()) == pytest.approx(-1.0, abs=1e-6)  # never left the shallow one
    assert torch.equal(descent.points, start)


def test_high_temperature_accepts_almost_everything() -> None:
    result = metropolis_hastings(two_wells, BOX2, torch.arange(32), steps=300, temperature=1e6, seed=1)
    assert float(result.acceptance.mean()) > 0.999
    cold = metropolis_hastings(two_wells, BOX2, torch.arange(32), steps=300, temperature=1e-3, seed=1)
    assert float(cold.acceptance.mean()) < float(result.acceptance.mean())


def test_the_result_is_the_trajectory_minimum_not_the_last_state() -> None:
    chains = torch.arange(32)
    result = metropolis_hastings(two_wells, BOX2, chains, steps=400, temperature=5.0, seed=2, trace_every=1)
    assert result.trace_steps.tolist() == list(range(401))
    minimum = result.trace_energy.min(dim=0).values
    torch.testing.assert_close(result.energy, minimum)  # over the whole trajectory, step 0 included
    torch.testing.assert_close(result.trace_best[-1], minimum)
    torch.testing.assert_close(two_wells(result.points), result.energy)
    assert bool((result.energy < result.trace_energy[-1]).any())  # hot chains wander off their minimum
    steps_of_minimum = result.trace_energy.argmin(dim=0)
    assert torch.equal(result.best_step, steps_of_minimum)


def test_thinned_trace_keeps_every_kth_step_and_the_last() -> None:
    result = metropolis_hastings(two_wells, BOX2, torch.arange(3), steps=25, seed=0, trace_every=10)
    assert result.trace_steps.tolist() == [0, 10, 20, 25]
    assert result.trace_energy.shape == (4, 3) and result.trace_best.shape == (4, 3)


def test_random_search_is_the_minimum_over_uniform_draws() -> None:
    chains, steps = torch.arange(10), 50
    result = random_search(two_wells, BOX2, chains, steps=steps, seed=3, trace_every=1)
    draws = torch.stack([chain_uniform(3, chains, t, STREAM_START, 2).float() for t in range(steps + 1)])  # (T, C, 2)
    energies = torch.stack([two_wells(d) for d in draws])
    torch.testing.assert_close(result.energy, energies.min(dim=0).values)
    assert torch.equal(result.best_step, energies.argmin(dim=0))
    assert bool(result.acceptance.isnan().all()) and result.calls == steps + 1


def test_sphere_domain_stays_on_the_sphere() -> None:
    sphere = Domain("sphere", 6)
    target = torch.zeros(6)
    target[0] = 1.0
    result = metropolis_hastings(lambda z: ((z - target) ** 2).sum(1), sphere, torch.arange(8), steps=300, seed=0)
    torch.testing.assert_close(result.points.norm(dim=1), torch.ones(8))
    assert float(result.energy.mean()) < 0.5 * float(result.start_energy.mean())


def test_chains_do_not_depend_on_their_batch() -> None:
    chains = torch.arange(64)
    whole = metropolis_hastings(two_wells, BOX2, chains, steps=100, seed=5)
    parts = [metropolis_hastings(two_wells, BOX2, part, steps=100, seed=5) for part in chains.split(7)]
    assert torch.equal(whole.points, torch.cat([p.points for p in parts]))
    assert torch.equal(whole.energy, torch.cat([p.energy for p in parts]))
    assert torch.equal(whole.best_step, torch.cat([p.best_step for p in parts]))
    other_seed = metropolis_hastings(two_wells, BOX2, chains, steps=100, seed=6)
    assert not torch.equal(whole.points, other_seed.points)


def test_linf_baseline_descends_inside_the_ball() -> None:
    ball = Domain("box", 16, -0.01, 0.01)
    weights = torch.linspace(-1, 1, 16)

    def linear(z: torch.Tensor) -> torch.Tensor:
        return z @ weights * 100.0

    result = zeroth_order_linf(linear, ball, torch.arange(4), steps=400, seed=0)
    assert result.calls == 401  # two detector calls per iteration: 200 iterations
    assert float(result.points.abs().max()) <= 0.01 + 1e-9
    assert bool((result.energy < result.start_energy).all())
    assert float(result.start_energy.abs().max()) == 0.0  # starts at the clean image (the centre)
    # the minimum of a linear energy on the box is the corner -0.01·sign(w); the search gets most of the way
    assert float(result.energy.mean()) < 0.5 * float(linear(-0.01 * torch.sign(weights)[None]))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="temperature > 0"):
        metropolis_hastings(two_wells, BOX2, torch.arange(2), steps=10, temperature=0.0)
    with pytest.raises(ValueError, match="NaN"):
        metropolis_hastings(lambda z: torch.full((z.shape[0],), math.nan), BOX2, torch.arange(2), steps=3)
    with pytest.raises(ValueError, match="one value per chain"):
        random_search(lambda z: z, BOX2, torch.arange(2), steps=3)
