"""Samplers of EvG (DESIGN.md §5.4): the chain generators, Metropolis–Hastings against a per-chain NumPy
implementation of the authors' rule, MH against coordinate descent on a multimodal energy, the trajectory
minimum, random search, the l∞ baseline and the coordinate descent against NumPy transcriptions of the authors'
``coordinate_descent`` given the same random numbers, the l∞ budget, and chains independent of their batch."""

from __future__ import annotations

import inspect
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
    OWN_BUDGET,
    SAMPLERS,
    budget_of,
    coordinate_descent,
    metropolis_hastings,
    random_search,
    start_points,
    zeroth_order_linf,
)
from lightning_modules.evg.variations import Domain, PixelPerturbation

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
    # the finite-difference descent stays in the shallow well: its minimum is the start, -1
    assert float(descent.energy.max()) == pytest.approx(-1.0, abs=1e-6)
    assert torch.equal(descent.points, start) and bool((descent.best_step == 0).all())


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
    """``steps`` draws in all, as the authors' ``RandomSampler`` (``n_step`` = 2000 draws, 2,000 detector calls;
    MH makes 2,001: its start and 2,000 proposals)."""
    chains, steps = torch.arange(10), 50
    calls: list[int] = []

    def counted(points: torch.Tensor) -> torch.Tensor:
        calls.append(points.shape[0])
        return two_wells(points)

    result = random_search(counted, BOX2, chains, steps=steps, seed=3, trace_every=1)
    draws = torch.stack([chain_uniform(3, chains, t, STREAM_START, 2).float() for t in range(steps)])  # (T, C, 2)
    energies = torch.stack([two_wells(d) for d in draws])
    torch.testing.assert_close(result.energy, energies.min(dim=0).values)
    assert torch.equal(result.best_step, energies.argmin(dim=0))
    assert bool(result.acceptance.isnan().all()) and result.calls == steps == len(calls)
    assert result.trace_steps.tolist() == list(range(steps))
    mh = metropolis_hastings(two_wells, BOX2, chains, steps=steps, seed=3)
    assert mh.calls == steps + 1
    torch.testing.assert_close(result.start_energy, mh.start_energy)  # the first draw is MH's start
    assert random_search(two_wells, BOX2, chains, steps=1).calls == 1
    with pytest.raises(ValueError, match="at least one draw, got steps=0"):
        random_search(two_wells, BOX2, chains, steps=0)


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

    result = zeroth_order_linf(linear, ball, torch.arange(4), iterations=200, step_size=0.01, seed=0)
    assert result.calls == 401  # two detector calls per iteration
    assert float(result.points.abs().max()) <= 0.01 + 1e-9
    assert bool((result.energy < result.start_energy).all())
    assert float(result.start_energy.abs().max()) == 0.0  # starts at the clean image (the centre)
    # the minimum of a linear energy on the box is the corner -0.01·sign(w); the search gets most of the way
    assert float(result.energy.mean()) < 0.5 * float(linear(-0.01 * torch.sign(weights)[None]))


def authors_linf(energy, x0: np.ndarray, normals: np.ndarray, *, h: float, stepsize: float, momentum: float,
                 linf: float, half_every: int) -> tuple[np.ndarray, float, int]:
    """The authors' ``coordinate_descent`` (attacks/mcmc.py, ``save_only_min``) for one image, in NumPy, given
    its standard normals ``(n_step, D)``: (lowest-energy image, its energy, its iteration counted from 1)."""
    x = x0.copy()
    e = energy(x)
    min_x, min_e, min_step = x0.copy(), e, 0
    v = 0.0
    for i_iter in range(len(normals)):
        direction = normals[i_iter] * h
        e_new = energy(np.clip(x + direction, 0.0, 1.0))
        grad = direction * ((e_new - e) / h)
        v = stepsize * grad + momentum * v
        x = x - v
        x = np.clip(x, x0 - linf, x0 + linf)
        x = np.clip(x, 0.0, 1.0)
        e = energy(x)
        if min_e > e:
            min_x, min_e, min_step = x.copy(), e, i_iter + 1
        if i_iter > 0 and i_iter % half_every == 0:
            stepsize /= 2.0
            h /= 2.0
    return min_x, min_e, min_step


def test_linf_equals_the_authors_coordinate_descent_chain_by_chain() -> None:
    """A toy image energy, seed images with saturated pixels (the pixel-range clamp acts), momentum 0.9 and
    halving every 5 iterations so that both schedules act within 40 iterations."""
    dim, seed, iterations = 12, 3, 40
    chains = torch.arange(5)
    generator = torch.Generator().manual_seed(0)
    x0 = torch.rand(5, dim, generator=generator, dtype=torch.float64)
    x0[:, :3] = torch.tensor([0.0, 1.0, 0.995], dtype=torch.float64)
    target = torch.rand(dim, generator=generator, dtype=torch.float64)
    weights = torch.linspace(-2.0, 3.0, dim, dtype=torch.float64)

    def image_energy(x: torch.Tensor) -> torch.Tensor:
        return 40.0 * ((x - target) ** 2).sum(-1) + (x * weights).sum(-1)

    def numpy_energy(x: np.ndarray) -> float:
        return float(40.0 * ((x - target.numpy()) ** 2).sum() + (x * weights.numpy()).sum())

    pixel = PixelPerturbation((1, 3, 4), radius=0.01)
    images = x0.view(5, 1, 3, 4)
    low, high = pixel.state_bounds(images)
    settings = {"h": 0.005, "step_size": 0.1, "momentum": 0.9}
    result = zeroth_order_linf(lambda z: image_energy(pixel(z, images).view(5, dim)), pixel.domain, chains,
                               iterations=iterations, halve_every=5, seed=seed, trace_every=0,
                               start=torch.zeros(5, dim, dtype=torch.float64), low=low, high=high, **settings)
    assert result.calls == 1 + 2 * iterations
    for chain in chains.tolist():
        normals = np.stack([chain_normal(seed, torch.tensor([chain]), t, STREAM_PROPOSAL, dim)[0].numpy()
                            for t in range(1, iterations + 1)])
        best, energy, step = authors_linf(numpy_energy, x0[chain].numpy(), normals, h=0.005, stepsize=0.1,
                                          momentum=0.9, linf=0.01, half_every=5)
        np.testing.assert_allclose((x0[chain] + result.points[chain]).numpy(), best, atol=1e-12, rtol=0)
        assert float(result.energy[chain]) == pytest.approx(energy, abs=1e-10)
        assert int(result.best_step[chain]) == 2 * step  # detector calls
    assert bool((result.energy < result.start_energy).all())


def test_linf_defaults_are_svhn_coord_and_its_budget_is_its_own() -> None:
    defaults = {k: p.default for k, p in inspect.signature(zeroth_order_linf).parameters.items()
                if p.default is not inspect.Parameter.empty}
    assert {k: defaults[k] for k in ("iterations", "step_size", "momentum", "h", "halve_every")} == {
        "iterations": 20000, "step_size": 0.1, "momentum": 0.999, "h": 0.005, "halve_every": 2000}
    assert "steps" not in defaults
    assert PixelPerturbation((1, 2, 2)).radius == 0.01  # ε
    assert OWN_BUDGET == {"linf"} and SAMPLERS["linf"] is zeroth_order_linf
    assert budget_of("linf", 2000) == {} and budget_of("mh", 2000) == {"steps": 2000}
    assert budget_of("coordinate", 50) == {"steps": 50} and budget_of("random", 7) == {"steps": 7}


def test_the_search_gives_linf_its_own_budget_and_the_pixel_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_modules.evg import search as search_module

    seen: dict[str, dict] = {}

    def recorder(name: str):
        def sampler(energy, domain, chains, **kwargs):
            seen[name] = kwargs
            return "done"
        return sampler

    monkeypatch.setitem(search_module.SAMPLERS, "linf", recorder("linf"))
    monkeypatch.setitem(search_module.SAMPLERS, "mh", recorder("mh"))
    seeds = torch.rand(3, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    module = search_module.EvGSearch({"d": torch.nn.Identity()}, {"linf": PixelPerturbation((1, 2, 2))},
                                     {"linf": {"iterations": 30}}, seeds, steps=77)
    assert module.search(None, module.variations["linf"], "linf", torch.arange(4)) == "done"
    kwargs = seen["linf"]
    assert "steps" not in kwargs and kwargs["iterations"] == 30  # sampler_args override, --steps does not reach it
    expected = seeds[torch.arange(4) % 3].reshape(4, 4)
    torch.testing.assert_close(kwargs["low"], -expected)
    torch.testing.assert_close(kwargs["high"], 1 - expected)
    mh = search_module.EvGSearch({"d": torch.nn.Identity()}, {"affine": _Affine()}, {"mh": {}}, seeds, steps=77)
    mh.search(None, mh.variations["affine"], "mh", torch.arange(2))
    assert seen["mh"]["steps"] == 77 and "low" not in seen["mh"]


class _Affine(torch.nn.Module):
    conditional = True
    domain = Domain("box", 5)


def authors_figure2_descent(energy, x0: np.ndarray, steps: int, *, h: float, stepsize: float
                            ) -> tuple[np.ndarray, float, int]:
    """The authors' deterministic ``coordinate_descent`` (the commented-out one of attacks/mcmc.py, the paper's
    Figure 2) for one chain in NumPy: (lowest-energy point, its energy, its iteration counted from 1)."""
    x = x0.copy()
    e = energy(x)
    best = (x.copy(), e, 0)
    for i in range(steps):
        dd = i % x.shape[0]
        step = np.zeros_like(x)
        step[dd] = 1 * h
        e_new = energy(np.clip(x + step, 0.0, 1.0))
        de = (e_new - e) / h
        x = x - step * de * stepsize
        x = np.clip(x, 0.0, 1.0)
        e = energy(x)
        if e < best[1]:
            best = (x.copy(), e, i + 1)
    return best


def test_coordinate_descent_equals_the_authors_figure_2_update() -> None:
    chains, steps, seed = torch.arange(6), 60, 2

    def bowl(z: torch.Tensor) -> torch.Tensor:
        return 30.0 * ((z - torch.tensor([0.3, 0.7], dtype=z.dtype)) ** 2).sum(1) + two_wells(z)

    def numpy_bowl(z: np.ndarray) -> float:
        return float(30.0 * ((z - np.array([0.3, 0.7])) ** 2).sum()) + numpy_two_wells(z)

    start = start_points(BOX2, seed, chains, torch.float64)
    result = coordinate_descent(bowl, BOX2, chains, steps=steps, seed=seed, trace_every=0, start=start)
    assert result.calls == 1 + 2 * steps  # two detector calls per step
    defaults = inspect.signature(coordinate_descent).parameters
    assert (defaults["h"].default, defaults["step_size"].default) == (0.1, 0.05)
    for chain in chains.tolist():
        point, energy, step = authors_figure2_descent(numpy_bowl, start[chain].numpy(), steps, h=0.1, stepsize=0.05)
        np.testing.assert_allclose(result.points[chain].numpy(), point, atol=1e-12, rtol=0)
        assert float(result.energy[chain]) == pytest.approx(energy, abs=1e-12)
        assert int(result.best_step[chain]) == 2 * step
    assert bool((result.energy < result.start_energy).all())


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="temperature > 0"):
        metropolis_hastings(two_wells, BOX2, torch.arange(2), steps=10, temperature=0.0)
    with pytest.raises(ValueError, match="one value per chain"):
        random_search(lambda z: z, BOX2, torch.arange(2), steps=3)


def holed(points: torch.Tensor) -> torch.Tensor:
    """The two wells with a NaN hole (x > 0.6, y < 0.5): a detector that fails on some images."""
    energy = two_wells(points.double())
    return torch.where((points[:, 0] > 0.6) & (points[:, 1] < 0.5), torch.nan, energy)


def numpy_holed(point: np.ndarray) -> float:
    return math.nan if point[0] > 0.6 and point[1] < 0.5 else numpy_two_wells(point)


def test_a_nan_energy_is_a_rejected_proposal_counted_per_chain() -> None:
    chains, steps, seed = torch.arange(16), 120, 2
    result = metropolis_hastings(holed, BOX2, chains, steps=steps, seed=seed, trace_every=0,
                                 start=start_points(BOX2, seed, chains, torch.float64))
    assert int(result.nan_proposals.sum()) > 0
    for chain in chains.tolist():
        index = torch.tensor([chain])
        normals = np.stack([chain_normal(seed, index, t, STREAM_PROPOSAL, 2)[0].numpy() for t in range(1, steps + 1)])
        uniforms = np.array([float(chain_uniform(seed, index, t, STREAM_ACCEPT, 1)) for t in range(1, steps + 1)])
        x = chain_uniform(seed, index, 0, STREAM_START, 2)[0].numpy()
        e, nans, energies = numpy_holed(x), 0, []
        nans += math.isnan(e)
        energies.append(e)
        for t in range(steps):  # the authors' rule: exp(-(E' - E)) >= U is false for a NaN E'
            proposal = np.clip(x + 0.1 * normals[t], 0.0, 1.0)
            e_new = numpy_holed(proposal)
            nans += math.isnan(e_new)
            current = math.inf if math.isnan(e) else e  # a NaN start takes the first finite proposal
            if np.exp(-(e_new - current)) >= uniforms[t]:
                x, e = proposal, e_new
            energies.append(e)
        assert int(result.nan_proposals[chain]) == nans
        finite = [v for v in energies if not math.isnan(v)]
        if finite:
            assert float(result.energy[chain]) == pytest.approx(min(finite), abs=1e-12)
        else:  # a start deep in the hole whose every proposal was NaN: the chain never had a finite state
            assert torch.isnan(result.energy[chain]) and nans == steps + 1
    assert sum(torch.isnan(result.energy).tolist()) < len(chains) // 4
    # random search: the minimum over the finite draws; coordinate descent: no move into the hole
    drawn = random_search(holed, BOX2, chains, steps=steps, seed=seed, trace_every=0)
    assert not torch.isnan(drawn.energy).any() and int(drawn.nan_proposals.sum()) > 0
    start = torch.tensor([[0.55, 0.3]], dtype=torch.float64)  # its probe at x + h = 0.65 is in the hole
    descent = coordinate_descent(holed, BOX2, torch.arange(1), steps=4, trace_every=0, start=start)
    assert int(descent.nan_proposals[0]) == 2  # the probes along x (iterations 0 and 2)
    assert not torch.isnan(descent.energy).any() and float(descent.points[0, 0]) == pytest.approx(0.55)
