"""The batched Metropolis–Hastings sampler of the adversarial evaluation (EvG) against a reimplementation of
the authors' loop, side by side in the same run.

Both samplers minimise the same energy for the same chains (the same seed image per chain), with the same
proposal (``clamp(z + 0.1·N(0, I), 0, 1)``), acceptance rule (``exp(-(E' - E) / T) >= U``, T = 1) and
result (per chain, the lowest-energy state of the whole trajectory); only the random numbers differ.

- *batched*: :func:`lightning_modules.evg.samplers.metropolis_hastings` -- counter-based random numbers computed
  for all chains at once, only the running minimum and a thinned energy trace (``trace_every=10``) kept.
- *authors' loop*: :func:`authors_loop`, written here from the description of the authors' ``sample_mh``:
  NumPy ``default_rng`` normals and uniforms drawn every step and converted to tensors, and the whole
  trajectory kept in Python lists (``x.cpu()``, ``E.cpu()``, ``accept.cpu()`` appended every step), stacked
  at the end for the per-chain argmin. One deviation: the NumPy normals are cast to the state's dtype
  (float32); taken as they come (float64) they would promote the state, and the stored trajectory would
  double.

Energies:

- *detector*: ``BlackBox(ScoringModel(OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)), KAPPAS["softmax"].detector)``
  (the demo's network, randomly initialised, not trained), standardised on the κ of 64 random images, over
  ``AffineVariation()`` (D = 5) of one random 28x28 grayscale seed image per chain:
  ``E(z) = detector.energy(variation(z, seeds))``.
- *toy*: ``E(z) = 20·||z - 0.25||²`` on the same domain, no network, so that the samplers' own cost per step
  is visible apart from the detector's.

Every (energy, chains, steps, sampler) runs in its own forked child process (a freshly spawned interpreter
would spend most of the run importing torch and Lightning), the two samplers in alternating order: one
warm-up run of 2 steps, then the fastest of a few timed runs (3 on the toy energy, 2 with the detector), with
one torch thread (``--threads``). *Chain-steps/s*: ``chains · steps / seconds`` (one chain-step = one energy
evaluation of one chain). Each sampler's random numbers are also timed alone, per step, in the same child
right after its timed runs. Memory, two ways: *kept* -- the bytes of the tensors each sampler keeps
(the loop: ``l_x + l_E + l_accept`` just before stacking; batched: every tensor of its ``SearchResult``,
i.e. the running minimum, the per-chain counters and the thinned trace); *RSS growth* -- the child's peak
resident set size (``ru_maxrss``) after the timed runs minus the same before them (after the warm-up), so
that the forward pass's own buffers are not counted. On the CPU ``x.cpu()`` is a no-op (the loop keeps the
tensors, but copies nothing and never waits on a device), so the loop's per-step device-to-host copy and
synchronisation are not part of these timings.

    python -m benchmarks.evg_sampler [--tiny] [--write]
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks.common import benchmark_parser, best_time, finish, load_average, parse

SECTION = "EvG sampler: batched Metropolis–Hastings against the authors' loop"
STEP_SIZE, TEMPERATURE, TRACE_EVERY, SEED = 0.1, 1.0, 10, 0
TOY_CENTRE, TOY_SCALE = 0.25, 20.0
WARMUP_STEPS = 2
METHODS = ("reference", "batched")
METHOD_NAMES = {"reference": "authors' loop", "batched": "batched"}


@dataclass(frozen=True)
class Settings:
    """One run: the chain counts and step counts of each energy, and the timed runs per configuration."""

    chains: tuple[int, ...]
    toy_steps: tuple[int, ...]
    detector_steps: tuple[int, ...]
    toy_repeat: int
    detector_repeat: int


FULL = Settings(chains=(16, 64, 256), toy_steps=(100, 400, 2000), detector_steps=(25, 100), toy_repeat=3,
                detector_repeat=2)
TINY = Settings(chains=(4,), toy_steps=(3, 6), detector_steps=(3,), toy_repeat=1, detector_repeat=1)


@dataclass
class Measurement:
    """One sampler on one configuration.

    Attributes:
        seconds: the fastest timed run.
        chain_steps_per_s: ``chains · steps / seconds``.
        kept_bytes: bytes of the tensors the sampler keeps (see the module docstring).
        rss_growth_kib: peak RSS growth over the timed runs (KiB); None without ``fork``.
        lowest: mean over chains of the lowest energy found.
        lowest_se: its standard error over chains.
        start: mean energy of the start states.
        acceptance: mean acceptance rate.
        random_ms: milliseconds per step of the sampler's random numbers alone (:func:`random_numbers_ms`).
    """

    seconds: float
    chain_steps_per_s: float
    kept_bytes: int
    rss_growth_kib: int | None
    lowest: float
    lowest_se: float
    start: float
    acceptance: float
    random_ms: float


@dataclass
class LoopResult:
    """What the authors' loop returns: per chain, the lowest-energy state of its trajectory."""

    points: Tensor
    energy: Tensor
    start_energy: Tensor
    acceptance: Tensor
    trajectory_bytes: int  # l_x + l_E + l_accept, just before stacking


def authors_loop(energy: Callable[[Tensor], Tensor], dim: int, chains: int, *, steps: int,
                 step_size: float = STEP_SIZE, temperature: float = TEMPERATURE, seed: int = SEED,
                 device: torch.device | str = "cpu") -> LoopResult:
    """Metropolis–Hastings as the authors' ``sample_mh`` does it (see the module docstring)."""
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.uniform(size=(chains, dim)), dtype=torch.float32).to(device)
    e = energy(x)
    l_x, l_e, l_accept = [x.cpu()], [e.cpu()], []
    for _ in range(steps):
        randn = torch.tensor(rng.standard_normal(size=tuple(x.shape))).to(device=x.device, dtype=x.dtype)
        x_new = torch.clamp(x + step_size * randn, 0.0, 1.0)
        e_new = energy(x_new)
        p_accept = torch.exp(-(e_new - e) / temperature)
        rand = torch.tensor(rng.uniform(size=chains)).to(x.device)
        accept = p_accept >= rand
        x_new[~accept] = x[~accept]
        e_new[~accept] = e[~accept]
        x, e = x_new, e_new
        l_x.append(x.cpu())
        l_e.append(e.cpu())
        l_accept.append(accept.cpu())
    kept = sum(t.nbytes for t in (*l_x, *l_e, *l_accept))
    trajectory, energies = torch.stack(l_x), torch.stack(l_e)  # (steps + 1, chains, D), (steps + 1, chains)
    best = energies.argmin(dim=0)
    index = torch.arange(chains)
    acceptance = (torch.stack(l_accept).double().mean(dim=0) if l_accept
                  else torch.full((chains,), math.nan, dtype=torch.float64))
    return LoopResult(trajectory[best, index], energies[best, index], energies[0], acceptance, kept)


def batched_kept_bytes(chains: int, dim: int, steps: int, trace_every: int = TRACE_EVERY) -> int:
    """What :func:`metropolis_hastings` keeps: points (float32, D per chain), energy and start energy
    (float32), best step and acceptance (8 bytes each) per chain, and the thinned trace (step 0, every
    ``trace_every``-th step and the last one): its steps (int64) and two float32 energies per chain."""
    traced = 1 + (steps // trace_every if trace_every > 0 else 0)
    if trace_every > 0 and steps and steps % trace_every:
        traced += 1  # the last step
    return chains * (4 * dim + 4 + 4 + 8 + 8) + traced * (8 + 2 * 4 * chains)


def loop_kept_bytes(chains: int, dim: int, steps: int) -> int:
    """What :func:`authors_loop` keeps before stacking: ``steps + 1`` float32 states and energies and
    ``steps`` boolean accept masks per chain."""
    return (steps + 1) * chains * (4 * dim + 4) + steps * chains


def toy_energy(points: Tensor) -> Tensor:
    return TOY_SCALE * ((points - TOY_CENTRE) ** 2).sum(dim=1)


def make_detector() -> Any:
    """The demo's small CNN (random weights) scored by softmax response, standardised on random images."""
    from datamodules.transforms import ModelInput, TensorPipeline
    from lightning_modules import BlackBox, OpenSetClassifier, ScoringModel
    from metrics import KAPPAS

    torch.manual_seed(SEED)
    network = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
    model = ScoringModel(network, model_input=ModelInput(TensorPipeline(28, 1), size=(28, 28), channels=1), name="demo")
    model.network.to(memory_format=torch.channels_last)  # as evaluate.py evg runs it
    detector = BlackBox(model, KAPPAS["softmax"].detector, name="demo/softmax")
    generator = torch.Generator().manual_seed(SEED)
    detector.fit_standardisation(detector.scores(torch.rand(64, 1, 28, 28, generator=generator)))
    return detector


def make_energy(kind: str, chains: int, detector: Any) -> tuple[Callable[[Tensor], Tensor], Any]:
    """``(energy, domain)`` for ``chains`` chains: the toy quadratic or the detector over affine variations."""
    from lightning_modules.evg.variations import AffineVariation

    variation = AffineVariation()
    if kind == "toy":
        return toy_energy, variation.domain
    seeds = torch.rand(chains, 1, 28, 28, generator=torch.Generator().manual_seed(SEED + 1))

    def energy(points: Tensor) -> Tensor:
        return detector.energy(variation(points, seeds))

    return energy, variation.domain


def run_sampler(method: str, energy: Callable[[Tensor], Tensor], domain: Any, chains: int,
                steps: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """One run: ``(lowest energies, start energies, acceptance, kept bytes)``."""
    from lightning_modules.evg.samplers import metropolis_hastings

    if method == "reference":
        found = authors_loop(energy, domain.dim, chains, steps=steps)
        return found.energy, found.start_energy, found.acceptance, found.trajectory_bytes
    result = metropolis_hastings(energy, domain, torch.arange(chains), steps=steps, step_size=STEP_SIZE,
                                 temperature=TEMPERATURE, seed=SEED, trace_every=TRACE_EVERY)
    kept = sum(t.nbytes for t in (result.points, result.energy, result.best_step, result.start_energy,
                                  result.acceptance, result.trace_steps, result.trace_energy, result.trace_best))
    return result.energy, result.start_energy, result.acceptance, kept


def _max_rss_kib() -> int | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def measure(method: str, energy: Callable[[Tensor], Tensor], domain: Any, chains: int, steps: int,
            repeat: int) -> Measurement:
    """Warm up, then ``repeat`` timed runs; RSS growth from after the warm-up to after the timed runs."""
    run_sampler(method, energy, domain, chains, min(WARMUP_STEPS, steps))
    gc.collect()
    before = _max_rss_kib()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        lowest, first, acceptance, kept = run_sampler(method, energy, domain, chains, steps)
        times.append(time.perf_counter() - start)
    after = _max_rss_kib()
    seconds = min(times)
    random_ms = random_numbers_ms(method, chains, domain.dim)
    lowest = lowest.double()
    return Measurement(
        seconds=seconds, chain_steps_per_s=chains * steps / seconds, kept_bytes=int(kept),
        rss_growth_kib=None if before is None or after is None else after - before,
        lowest=float(lowest.mean()), lowest_se=float(lowest.std() / math.sqrt(chains)) if chains > 1 else math.nan,
        start=float(first.double().mean()), acceptance=float(acceptance.double().mean()), random_ms=random_ms)


def _child(connection: Any, job: Callable[[], Measurement]) -> None:
    try:
        connection.send(("ok", job()))
    except BaseException:  # noqa: B036 -- report anything to the parent, which raises it
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


def in_fresh_process(job: Callable[[], Measurement]) -> Measurement:
    """Run ``job`` in a forked child (its own peak RSS), or here where ``fork`` does not exist (no RSS)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return asdict_replace(job(), rss_growth_kib=None)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, job), daemon=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a process with threads (Python >= 3.12)
        process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError as error:
        process.join()
        raise RuntimeError(f"the measuring child process died (exit code {process.exitcode})") from error
    process.join()
    if status != "ok":
        raise RuntimeError(f"the measuring child process failed:\n{payload}")
    return payload


def asdict_replace(measurement: Measurement, **changes: Any) -> Measurement:
    return Measurement(**{**asdict(measurement), **changes})


def similar(a: Measurement, b: Measurement) -> bool:
    """Whether two mean lowest energies agree within 3 standard errors of their difference."""
    if not (math.isfinite(a.lowest_se) and math.isfinite(b.lowest_se)):
        return False
    return abs(a.lowest - b.lowest) <= 3 * math.hypot(a.lowest_se, b.lowest_se) + 1e-9


def random_numbers_ms(method: str, chains: int, dim: int, *, calls: int = 50, repeat: int = 3) -> float:
    """Milliseconds per step of one sampler's random numbers alone for ``chains`` chains (best of ``repeat``
    rounds of ``calls`` steps): the batched sampler's proposal normals and acceptance uniforms as it draws
    them (``ChainNumbers``: a block of up to 64 steps at a time), or the loop's NumPy normals and uniforms
    made tensors."""
    from lightning_modules.evg.chain_random import STREAM_ACCEPT, STREAM_PROPOSAL, ChainNumbers

    index = torch.arange(chains)
    rng = np.random.default_rng(SEED)

    def batched() -> None:
        numbers = ChainNumbers(SEED, index)
        for step in range(1, calls + 1):
            numbers.normal(step, STREAM_PROPOSAL, dim, last_step=calls).float()
            numbers.uniform(step, STREAM_ACCEPT, 1, last_step=calls).view(-1)

    def reference() -> None:
        for _ in range(calls):
            torch.tensor(rng.standard_normal(size=(chains, dim))).to(dtype=torch.float32)
            torch.tensor(rng.uniform(size=chains))

    return best_time(batched if method == "batched" else reference, repeat=repeat) / calls * 1e3


def run(settings: Settings) -> list[dict[str, Any]]:
    """Every configuration, the two samplers in alternating order; one row per (energy, chains, steps)."""
    detector = make_detector()
    rows = []
    order = list(METHODS)
    for kind, step_counts, repeat in (("toy", settings.toy_steps, settings.toy_repeat),
                                      ("detector", settings.detector_steps, settings.detector_repeat)):
        for chains in settings.chains:
            energy, domain = make_energy(kind, chains, detector)
            for steps in step_counts:
                row: dict[str, Any] = {"energy": kind, "chains": chains, "steps": steps, "chain_steps": chains * steps,
                                       "dim": domain.dim, "repeat": repeat}
                for method in order:  # alternating: a slow phase of a shared machine hits both in turn
                    row[method] = in_fresh_process(
                        lambda m=method, e=energy, d=domain, c=chains, s=steps, r=repeat: measure(m, e, d, c, s, r))
                row["similar"] = similar(row["reference"], row["batched"])
                print(f"{kind} {chains} x {steps}: " + ", ".join(
                    f"{METHOD_NAMES[m]} {row[m].seconds:.3f} s ({row[m].chain_steps_per_s:,.0f} chain-steps/s, "
                    f"lowest {row[m].lowest:.3f})" for m in METHODS), flush=True)
                rows.append(row)
                order.reverse()
    return rows


def _bytes(value: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def _rss(kib: int | None) -> str:
    return "n/a" if kib is None else _bytes(kib * 1024)


def _ms_per_step(measurement: Measurement, steps: int) -> float:
    return measurement.seconds / steps * 1e3


def markdown(rows: list[dict[str, Any]], settings: Settings, *, load: tuple[str, str], elapsed_s: float,
             threads: int) -> str:
    speed = ["| energy | chains | steps | chain-steps | authors' loop (s) | batched (s) | authors' loop "
             "(chain-steps/s) | batched (chain-steps/s) | batched / loop (speed) | ms/step: loop | batched | "
             "random numbers alone (ms/step): loop | batched | mean lowest energy: loop | batched |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    memory = ["| energy | chains | steps | kept: loop (l_x + l_E + l_accept) | kept: batched (minimum + trace) "
              "| loop / batched | peak RSS growth: loop | peak RSS growth: batched |",
              "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ref, bat = row["reference"], row["batched"]
        head = f"| {row['energy']} | {row['chains']} | {row['steps']} |"
        speed.append(f"{head} {row['chain_steps']:,} | {ref.seconds:.3f} | {bat.seconds:.3f} | "
                     f"{ref.chain_steps_per_s:,.0f} | {bat.chain_steps_per_s:,.0f} | "
                     f"{bat.chain_steps_per_s / ref.chain_steps_per_s:.2f}x | {_ms_per_step(ref, row['steps']):.2f} | "
                     f"{_ms_per_step(bat, row['steps']):.2f} | {ref.random_ms:.3f} | {bat.random_ms:.3f} | "
                     f"{ref.lowest:.3f} ± {ref.lowest_se:.3f} "
                     f"| {bat.lowest:.3f} ± {bat.lowest_se:.3f} |")
        memory.append(f"{head} {_bytes(ref.kept_bytes)} | {_bytes(bat.kept_bytes)} | "
                      f"{ref.kept_bytes / bat.kept_bytes:.1f}x | {_rss(ref.rss_growth_kib)} | "
                      f"{_rss(bat.rss_growth_kib)} |")
    toy = [row for row in rows if row["energy"] == "toy"]
    agree = sum(row["similar"] for row in toy)
    dim = rows[0]["dim"] if rows else 0
    lines = [
        "Metropolis–Hastings (step 0.1, T = 1, per chain the lowest-energy state of the whole trajectory), "
        "`lightning_modules.evg.samplers.metropolis_hastings` (*batched*: counter-based random numbers for all "
        f"chains at once, keeps the running minimum and an energy trace every {TRACE_EVERY} steps) against a "
        "reimplementation of the authors' `sample_mh` loop (*authors' loop*: NumPy `default_rng` numbers every "
        "step, `x.cpu()`, `E.cpu()`, `accept.cpu()` appended to Python lists every step, stacked at the end), "
        "the same energy and the same chains, in one run. Energies: *toy* `20·||z - 0.25||²` (no network: "
        "the samplers' own cost); *detector* the demo's small CNN (random weights) with κ = softmax "
        f"response, standardised, over `AffineVariation()` (D = {dim}) of one random 28x28 seed image per "
        "chain. Each (energy, chains, steps, sampler) runs in its own forked process, the two samplers in "
        f"alternating order: a {WARMUP_STEPS}-step warm-up, then best of {settings.toy_repeat} (toy) / "
        f"{settings.detector_repeat} (detector) timed runs. *Chain-steps/s*: chains x steps / seconds. Mean "
        "lowest energy ± its standard error over chains.",
        "",
        "\n".join(speed),
        "",
        "Memory: *kept* is the bytes of the tensors each sampler holds at the end (the loop's lists before "
        "stacking; stacking them for the argmin holds a second copy for a moment); *peak RSS growth* is the "
        "process's `ru_maxrss` after the timed runs minus before them (after the warm-up, so the forward "
        "pass's buffers are not counted; the allocator's granularity makes small values noise).",
        "",
        "\n".join(memory),
        "",
        f"On the toy energy the two samplers' mean lowest energies agree within 3 standard errors in {agree} of "
        f"{len(toy)} configurations (different random numbers, the same algorithm).",
        "",
        f"Machine: {os.cpu_count()} CPU cores, {threads} torch thread; 1-minute load average {load[0]} before "
        f"and {load[1]} after the run ({elapsed_s:.0f} s in all). On the CPU `x.cpu()` copies nothing, so the "
        "loop's device-to-host copy of every step is not in these timings; on a GPU it would add a copy and a "
        "synchronisation per step to the loop (the batched sampler synchronises every step too: its NaN checks "
        "of the energies, `_checked` and `standardised_energy`, read `isnan(...).any()` on the host).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark, print the tables and, with ``--write``, put them in RESULTS.md.

    Returns:
        One dict per (energy, chains, steps): ``energy``, ``chains``, ``steps``, ``chain_steps``, ``dim``,
        ``repeat``, ``similar`` and the fields of a :class:`Measurement` per sampler under ``reference`` and ``batched``.
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--chains", type=int, nargs="+", help="chain counts")
    parser.add_argument("--toy-steps", type=int, nargs="+", help="step counts on the toy energy")
    parser.add_argument("--detector-steps", type=int, nargs="+", help="step counts on the detector energy")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parse(parser, argv)
    settings = TINY if args.tiny else FULL
    settings = Settings(chains=tuple(args.chains or settings.chains),
                        toy_steps=tuple(args.toy_steps or settings.toy_steps),
                        detector_steps=tuple(args.detector_steps or settings.detector_steps),
                        toy_repeat=settings.toy_repeat, detector_repeat=settings.detector_repeat)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    load_before, began = load_average(), time.perf_counter()
    try:
        rows = run(settings)
    finally:  # main() also runs in-process (tests): leave the process as it was
        torch.set_num_threads(threads)
    body = markdown(rows, settings, load=(load_before, load_average()),
                    elapsed_s=time.perf_counter() - began, threads=args.threads)
    finish(args, SECTION, body, script="benchmarks.evg_sampler")
    return [{**row, **{m: asdict(row[m]) for m in METHODS}} for row in rows]


if __name__ == "__main__":
    main()
