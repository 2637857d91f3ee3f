"""Every benchmark in its ``--tiny`` mode (the ``benchmark`` tier): each case runs and reports what it was
configured to measure, with the references' agreement checks passed.

These keep the scripts working between full measurements; they assert on what the tables report, never on
how fast anything ran.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from benchmarks import (
    data_throughput,
    ensemble_training,
    evg_sampler,
    fit_overlap,
    generators_benchmark,
    gpu_throughput,
    interval_coverage,
    intervals_benchmark,
    ood_metrics_benchmark,
    oscr_benchmark,
    report_card,
    severity_benchmark,
    training_overhead,
)
from benchmarks.common import open_set_data
from datamodules import imagenet_protocol

pytestmark = pytest.mark.benchmark


def test_oscr_tiny_runs_both_branches_of_the_reference_loop() -> None:
    rows = oscr_benchmark.main(["--tiny", "--sizes", "2000", "9000", "--classes", "4"])

    assert [row["n"] for row in rows] == [2000, 9000]
    assert [row["loop_full"] for row in rows] == [True, False]  # 9000 > the tiny limit: timed on 50 thresholds
    for row in rows:
        probs, target = (t.numpy() for t in open_set_data(row["n"], 4))
        known = target >= 0
        distinct = np.unique(np.r_[probs[known, target[known]], probs[target == -2].max(axis=1)])
        assert row["distinct"] == len(distinct)
        assert all(math.isfinite(row[key]) and row[key] > 0 for key in ("ours_s", "sort_s", "loop_s"))


def test_severity_tiny_shares_one_pass_per_set_between_the_kappas() -> None:
    result = severity_benchmark.main(["--tiny", "--classes", "150", "--group", "12"])

    built, passes = result["construction"], result["kappa_passes"]
    assert (built["classes"], built["group"]) == (150, 12)
    assert built["scores"] == 150 * 200 + built["id_images"]
    assert built["auroc_difference"] <= 1e-12  # ours and the straightforward procedure: the same 11 AUROCs
    kappas = len(severity_benchmark.LOGIT_KAPPAS)
    assert (passes["shared_passes"], passes["separate_passes"]) == (3, 3 * kappas)  # ID, OOD estimation, OOD test
    assert passes["images"]["ood_estimation"] == 2 * passes["images"]["ood_test"]  # 20 and 10 per OOD class


def test_training_overhead_tiny_runs_the_same_steps_in_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    # every timed epoch as its loop measured it (its own step and image counts, its loop time), with a second
    # clock around the whole call; the warm-ups (a few steps, ``max_steps``) apart
    timed: dict[str, list[tuple[training_overhead.Run, float]]] = {"lightning": [], "plain": []}

    def spy(side: str, epoch: Callable[..., training_overhead.Run]) -> Callable[..., training_overhead.Run]:
        def measured(*args: Any, **kwargs: Any) -> training_overhead.Run:
            start = time.perf_counter()
            run = epoch(*args, **kwargs)
            if kwargs.get("max_steps") is None:
                timed[side].append((run, time.perf_counter() - start))
            return run
        return measured

    for side in timed:
        monkeypatch.setattr(training_overhead, f"{side}_epoch", spy(side, getattr(training_overhead, f"{side}_epoch")))
    repeat = 2  # two timed epochs of each loop: a spread and a best epoch that can differ from any one epoch
    result = training_overhead.main(["--tiny", "--repeat", str(repeat)])

    demo, resnet = result["comparisons"]
    demo_data = training_overhead.DemoData(max_train_per_class=50, batch_size=128, num_workers=0)
    demo_data.setup("fit")  # the tiny demo's training split, counted apart from both loops
    assert demo["images"] == len(demo_data.train_set)
    assert demo["steps"] == math.ceil(demo["images"] / 128) and demo["batch_size"] == 128
    assert (resnet["steps"], resnet["batch_size"], resnet["images"]) == (2, 2, 4)
    assert (demo["paired_steps"], resnet["paired_steps"]) == (repeat * demo["steps"], resnet["steps"])  # lockstep
    assert [len(epochs) for epochs in timed.values()] == [2 * repeat, 2 * repeat]  # the demo's, then the ResNet's
    for number, row in enumerate((demo, resnet)):
        lightning, plain = (timed[side][number * repeat:(number + 1) * repeat] for side in ("lightning", "plain"))
        assert row["loss_difference"] == 0  # the same initial weights and batches: the same first losses
        assert row["epochs"] == len(lightning) + len(plain)
        # both loops did the same work, each counting the steps and images it ran
        assert {(run.steps, run.images) for run, _ in lightning + plain} == {(row["steps"], row["images"])}
        # each epoch loop lies inside the wall time of its own call, and the row's timings are the best timed
        # epochs of each loop (not a warm-up, not the whole call): Lightning's over the plain loop's
        assert all(0 < run.loop_s < wall for run, wall in lightning + plain)
        best_lightning, best_plain = (min(run.loop_s for run, _ in side) for side in (lightning, plain))
        assert (row["lightning_s"], row["plain_s"]) == (best_lightning, best_plain)
        assert row["ratio"] == pytest.approx(best_lightning / best_plain, rel=1e-12)
        loops = [run.loop_s for run, _ in plain]
        assert row["plain_spread"] == pytest.approx(max(loops) / min(loops), rel=1e-12)  # slowest / fastest
    assert result["log_calls"] == 20 * min(10, demo["steps"])
    labels = [cost["label"] for cost in result["callbacks"]]
    assert len(labels) == 4 and labels[1].startswith("+ `OpenSetEvaluation") and "plots=False" in labels[3]
    baseline, oscr, severity, severity_no_plots = result["callbacks"]
    assert baseline["hooks_s"] == 0.0  # no callback: nothing timed inside hooks
    assert oscr["hooks_s"] > 0 and severity["hooks_s"] > 0 and severity_no_plots["hooks_s"] > 0


def test_generators_tiny_checks_the_ensemble_against_its_members() -> None:
    result = generators_benchmark.main(["--tiny"])

    assert [(row["members"], row["kind"]) for row in result["forward"]] == [(2, "small_cnn"), (2, "resnet18")]
    for row in result["forward"]:
        assert row["difference"] < 1e-5  # vmap and the default path give the members' own logits
    assert [row["generator"] for row in result["steps"]] == ["shift (Pix2Pix)", "near-OOD (DCGAN)"]
    for row in result["steps"]:
        assert 0 <= row["lpips_share"] <= 1 and 0 <= row["ensemble_share"] <= 1
        assert row["plain_s"] > 0 and row["regularised_s"] > 0


def test_ensemble_training_tiny_trains_every_case_from_the_members_own_seeds() -> None:
    result = ensemble_training.main(["--tiny"])

    assert result["members"] == 2 and result["steps"] == 4  # 4 x 32 training images in batches of 32
    assert result["init_equal"] is True  # the batched model starts from each member's own seeded weights
    assert [row["case"] for row in result["rows"]] == [
        "`train.py ensemble`: M sequential Lightning fits", "one batched model (`torch.func` vmap, one Adam)",
        "M plain PyTorch loops, one after the other"]
    for row in result["rows"]:
        assert row["seconds"] > 0 and len(row["accuracies"]) == 2 and all(0 <= a <= 1 for a in row["accuracies"])


def test_intervals_tiny_checks_the_bootstrap_against_sklearn_on_the_same_resamples() -> None:
    result = intervals_benchmark.main(["--tiny"])
    # the sklearn loop on the same resamples agrees exactly (the benchmark raises otherwise)
    assert result["max_difference"] <= 1e-12
    for key in ("auroc_s", "delong_s", "bootstrap_s", "bootstrapper_s", "sklearn_s", "open_set_s"):
        assert result[key] > 0, key


def test_ood_metrics_tiny_agrees_with_openood_and_pytorch_ood_and_builds_every_table() -> None:
    result = ood_metrics_benchmark.main(["--tiny"])

    alone, tables = result["alone"], result["tables"]
    assert alone["pairs"] == 3 * len(ood_metrics_benchmark.SETS)
    assert alone["difference"]["fpr openood"] == 0.0 and alone["difference"]["fpr pytorch-ood"] == 0.0
    assert max(alone["difference"].values()) <= 1e-9  # the same definitions agree to rounding
    assert len(tables["seconds"]) == 3 and tables["resamples"] == 20
    names = [row["set"] for row in tables["tables"][0].rows]
    assert names == [*ood_metrics_benchmark.SETS, "near", "far", "all"]
    for table in tables["tables"]:
        assert all(values.shape == (20,) for values in table.replicates.values())
        assert all(row["auroc low"] <= row["auroc"] <= row["auroc high"] for row in table.rows)


def test_interval_coverage_tiny_runs_every_study() -> None:
    result = interval_coverage.main(["--tiny"])
    assert {r["family"] for r in result["auroc"]} == {"binormal"} and len(result["auroc"]) == 3 * 2
    for row in result["auroc"]:
        assert all(row[m].total == 8 for m in ("auto", "logit", "newcombe", "delong"))
        assert row["auto"].zero == 0  # never an interval of zero width
    assert [r["detectors"] for r in result["marks"]] == [5, 10, 10]
    assert all(0 <= r["after"] <= 1 for r in result["marks"])
    for name in ("open_set", "ece", "severity", "evg", "difference", "seeds"):
        assert result[name], name
    assert [r["n"] for r in result["ood_mean"]] == [20, 50]
    for row in result["ood_mean"]:  # 2 repetitions (8 // 4), every mean and every set's interval counted
        assert (row["all auroc"].total, row["set auroc"].total) == (2, 10)


def test_fit_overlap_tiny_finds_the_copies_and_the_links_and_nothing_in_the_training_split() -> None:
    result = fit_overlap.main(["--tiny"])

    cases, val = result["cases"], 20 * 2  # 20 classes, 2 validation files each (8 training files)
    disjoint = cases["train/ vs val/ (nothing shared)"]
    assert (disjoint["images"], disjoint["count"], disjoint["wholes"]) == (20 * 10, 0, 0)
    copy = cases["a copy of val/ vs val/"]
    assert (copy["count"], copy["hows"]["same bytes"], copy["heads"], copy["wholes"]) == (val, val, 2 * val, 2 * val)
    links = cases["links to val/ vs val/"]
    assert (links["count"], links["hows"]["same file"], links["heads"], links["wholes"]) == (val, val, 0, 0)
    (fashion,) = [r for name, r in cases.items() if name.startswith("Fashion-MNIST")]
    assert (fashion["images"], fashion["count"]) == (1200, 0)  # the demo's splits share no image
    # PNG exports of the training images against the test tensors: every header read, every 28 x 28 file decoded
    (exports,) = [r for name, r in cases.items() if name.startswith("PNG exports")]
    assert (exports["images"], exports["headers"], exports["decoded"], exports["count"]) == (900, 300, 300, 0)
    # the pool: a second run takes both sets' identities from the cache and reads no file
    pool = cases["train/ vs pool/ (the severity pool)"]
    assert pool["images"] == 20 * (8 + 20) and pool["second_count"] == pool["count"] == 0
    assert pool["second_reads"] == {"stats": 0, "heads": 0, "wholes": 0, "opened": 0} and pool["second_s"] > 0
    estimate = result["estimate"]
    assert 0 < estimate["share_fit"] < estimate["share_val"] < 1 and estimate["check_s"] > estimate["fingerprint_s"] > 0
    big = estimate["pool"]
    assert big["heads"] > estimate["heads"] and big["check_s"] > estimate["check_s"] and big["second_s"] > 0


def test_report_card_tiny_shares_the_passes_and_runs_the_commands_alone() -> None:
    row = report_card.main(["--tiny"])
    # one model, OSCR (its protocol test set) and severity (its ID test, estimation and test sets): each pass once
    assert (row["requests"], row["run"]) == (4, 4)
    assert row["sections"] == "open_set, severity" and row["models"] == 1
    assert row["card_s"] > 0 and row["separately_s"] > 0


@pytest.mark.parametrize("module", [oscr_benchmark, severity_benchmark, training_overhead, generators_benchmark,
                                    gpu_throughput, evg_sampler, report_card, intervals_benchmark,
                                    ensemble_training, interval_coverage, data_throughput, fit_overlap,
                                    ood_metrics_benchmark])
def test_a_tiny_run_never_writes_results(module, capsys) -> None:
    with pytest.raises(SystemExit):
        module.main(["--tiny", "--write"])
    assert "--write records a full run" in capsys.readouterr().err


class RecordingStepTimer(gpu_throughput.StepTimer):
    """A :class:`~benchmarks.gpu_throughput.StepTimer` that also notes, apart from the timer's own clock, when
    each step was reported (a clock read before and after it) and how many images it had."""

    made: list[RecordingStepTimer] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[float, float, int]] = []  # (before, after, images) per step
        RecordingStepTimer.made.append(self)

    def step_done(self, images: int) -> None:
        before = time.perf_counter()
        super().step_done(images)
        self.calls.append((before, time.perf_counter(), images))


def hook_clock(cls: type, durations: list[float]) -> Callable[..., Any]:
    """``cls.on_validation_epoch_end`` (where an evaluation callback does its work) timed into ``durations``."""
    hook = cls.on_validation_epoch_end

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return hook(self, *args, **kwargs)
        finally:
            durations.append(time.perf_counter() - start)

    return timed


def test_gpu_throughput_tiny_reports_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batch, steps, warmup = 3, 2, 1  # not the tiny defaults (4, 2 after 1): the table must report what was configured
    monkeypatch.setattr(RecordingStepTimer, "made", [])
    monkeypatch.setattr(gpu_throughput, "StepTimer", RecordingStepTimer)
    epoch_ends: dict[str, list[float]] = {"OSCR": [], "severity": []}
    for cls, durations in zip((gpu_throughput.OpenSetEvaluation, gpu_throughput.SeverityAUROC), epoch_ends.values(),
                              strict=True):
        monkeypatch.setattr(cls, "on_validation_epoch_end", hook_clock(cls, durations))
    table = gpu_throughput.main(["--tiny", "--work-dir", str(tmp_path), "--batch-sizes", str(batch),
                                 "--steps", str(steps), "--warmup-steps", str(warmup)])

    assert [row["row"] for row in table] == list(gpu_throughput.ROWS)
    rows = {row["row"]: row for row in table}
    for row in table:
        assert math.isfinite(row["images_per_s"]) and row["images_per_s"] > 0, row
        assert math.isfinite(row["seconds"]) and row["seconds"] > 0, row
        assert row["batch_size"] == batch, row
    # the batch-size probe's timer (1 + 1 steps), then one per training row, in the order of the rows
    timers = RecordingStepTimer.made
    assert [(timer.warmup, timer.steps) for timer in timers] == [(1, 1)] + [(warmup, steps)] * 3
    for name, timer in zip(gpu_throughput.TRAINING_ROWS, timers[1:], strict=True):
        assert rows[name]["steps"] == steps and len(timer.calls) == warmup + steps  # the steps that ran
        timed = timer.calls[warmup:]
        assert rows[name]["images"] == sum(images for _, _, images in timed) == steps * batch  # within one epoch
        # the timed span runs from the end of the last warm-up step to the end of the last timed step: between
        # the reports of those two steps as the second clock saw them (the warm-up step is not in it)
        shortest = timed[-1][0] - timer.calls[warmup - 1][1]
        longest = timed[-1][1] - timer.calls[warmup - 1][0]
        assert shortest <= rows[name]["seconds"] <= longest, (name, shortest, longest)
        assert rows[name]["images"] / longest <= rows[name]["images_per_s"] <= rows[name]["images"] / shortest
        assert rows[name]["added_s"] is None

    # P2 has 30 known + 31 negative classes with 5 training images each in the tiny folder: the protocol's
    # stratified 80/20 split keeps one per class for validation.
    protocol = imagenet_protocol(gpu_throughput.PROTOCOL)
    val_images = len(protocol.known) + len(protocol.negative)
    validation = rows["validation epoch"]
    assert (validation["images"], validation["steps"]) == (val_images, math.ceil(val_images / batch))
    assert validation["added_s"] is None

    oscr, severity = (rows[name] for name in gpu_throughput.CALLBACK_ROWS)
    settings = gpu_throughput.TINY
    assert oscr["images"] == val_images
    assert severity["images"] == (len(protocol.known) * settings.val_per_class
                                  + len(protocol.unknown) * (settings.estimation + settings.severity_test))
    for row, durations in zip((oscr, severity), epoch_ends.values(), strict=True):
        assert row["steps"] == validation["steps"]
        assert math.isfinite(row["added_wall_s"])  # a difference of two timings: may be negative by noise
        # one timed validate call per variant (tiny: no warm-up round), whose callback evaluated once; the time
        # in its hooks holds its epoch end (timed apart) and lies inside the wall time of that validate call
        assert len(durations) == gpu_throughput.TINY.val_repeat == 1
        for key in ("seconds", "added_s"):
            assert durations[0] <= row[key] < validation["seconds"] + row["added_wall_s"], (row["row"], key)
    assert (tmp_path / "protocols" / "p2_train.csv").is_file()  # the data pipeline row read the generated folder
    files = len(list((tmp_path / "imagenet").rglob("*.JPEG")))
    for name in gpu_throughput.DECODE_ROWS:  # every JPEG of the folder once, from files and from shards
        assert (rows[name]["images"], rows[name]["steps"]) == (files, math.ceil(files / batch)), name
    assert (tmp_path / "shards" / "shards.json").is_file()


def note_sampler_runs(notes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Have each measuring child of :mod:`benchmarks.evg_sampler` (forked, so it writes to ``notes``, one JSON
    line per event) note every sampler run (method, chains, steps, the chain states its energy evaluated, a
    second clock around it), the end of the ``gc.collect()`` before the timed runs and the start of the random
    number timing after them: the timed runs lie between these two."""

    def note(**event: Any) -> None:
        with notes.open("a") as file:
            file.write(json.dumps(event) + "\n")

    run_sampler, collect, random_ms = evg_sampler.run_sampler, gc.collect, evg_sampler.random_numbers_ms

    def counted(method: str, energy: Callable[..., Any], domain: Any, chains: int, steps: int) -> Any:
        states: list[int] = []

        def counting(points: Any) -> Any:
            states.append(points.shape[0])
            return energy(points)

        start = time.perf_counter()
        found = run_sampler(method, counting, domain, chains, steps)
        note(event="run", method=method, chains=chains, steps=steps, states=sum(states), start=start,
             end=time.perf_counter())
        return found

    def collected() -> None:
        collect()
        note(event="collected", at=time.perf_counter())

    def timed_random(*args: Any, **kwargs: Any) -> float:
        note(event="random", at=time.perf_counter())
        return random_ms(*args, **kwargs)

    monkeypatch.setattr(evg_sampler, "run_sampler", counted)
    monkeypatch.setattr(evg_sampler, "gc", SimpleNamespace(collect=collected))
    monkeypatch.setattr(evg_sampler, "random_numbers_ms", timed_random)


def test_evg_sampler_tiny_reports_both_samplers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chains, toy_steps, detector_steps = 3, (2, 11), (4,)  # not the tiny defaults: report what was configured
    notes = tmp_path / "runs.jsonl"
    note_sampler_runs(notes, monkeypatch)
    table = evg_sampler.main(["--tiny", "--chains", str(chains), "--toy-steps", *map(str, toy_steps),
                              "--detector-steps", *map(str, detector_steps)])

    # one measurement per (row, sampler), in the order they ran: a warm-up run, the collection, the timed run
    # (one in the tiny settings), the random numbers' timing
    events = [json.loads(line) for line in notes.read_text().splitlines()]
    starts = [i for i, event in enumerate(events) if event["event"] == "run" and events[i + 1]["event"] == "collected"]
    measurements = [events[start:end] for start, end in zip(starts, [*starts[1:], len(events)], strict=True)]
    assert [[event["event"] for event in m] for m in measurements] == [["run", "collected", "run", "random"]] * (
        2 * len(table))

    assert [(row["energy"], row["steps"]) for row in table] == (
        [("toy", steps) for steps in toy_steps] + [("detector", steps) for steps in detector_steps])
    for number, row in enumerate(table):
        assert (row["chains"], row["chain_steps"], row["dim"], row["repeat"]) == (chains, chains * row["steps"], 5, 1)
        timed = {m[2]["method"]: m for m in measurements[2 * number:2 * number + 2]}
        assert set(timed) == set(evg_sampler.METHODS)
        for method in evg_sampler.METHODS:
            measured = row[method]
            _, collected, run, random_start = timed[method]
            # both samplers did the row's work: its chains for its steps, each step one energy evaluation per
            # chain (one chain-step), after the chains' start states
            assert (run["chains"], run["steps"]) == (row["chains"], row["steps"])
            chain_steps = run["states"] - run["chains"]
            assert chain_steps == row["chain_steps"]
            # the benchmark's timing of the run lies between the second clock's span of the run itself and the
            # span from the collection before it to the random numbers after it; so does its rate
            inside, outside = run["end"] - run["start"], random_start["at"] - collected["at"]
            assert 0 < inside <= measured["seconds"] <= outside, (row, method)
            assert chain_steps / outside <= measured["chain_steps_per_s"] <= chain_steps / inside, (row, method)
            assert math.isfinite(measured["lowest"]) and measured["lowest"] <= measured["start"], row
            assert 0 <= measured["acceptance"] <= 1
            assert measured["rss_growth_kib"] is None or measured["rss_growth_kib"] >= 0
            assert measured["random_ms"] > 0
        # the loop keeps its whole trajectory, the batched sampler the running minimum and a thinned trace
        assert row["reference"]["kept_bytes"] == evg_sampler.loop_kept_bytes(chains, 5, row["steps"])
        assert row["batched"]["kept_bytes"] == evg_sampler.batched_kept_bytes(chains, 5, row["steps"])
    toy = [row for row in table if row["energy"] == "toy"]
    assert toy[1]["reference"]["kept_bytes"] > toy[1]["batched"]["kept_bytes"]  # 11 steps: 3 states per chain traced


def test_generator_defaults_tiny_runs_the_grid_and_measures_the_spread_as_documented() -> None:
    import itertools

    import torch

    from benchmarks import generator_defaults

    result = generator_defaults.main(["--tiny"])

    rows, judge = result["rows"], result["judge"]
    assert [(row["pairing"], row["k"], row["regularised"]) for row in rows] == [
        ("random", 1, True), ("nearest", 1, True), ("random", 4, True), ("nearest", 4, True), ("random", 1, False)]
    for row in rows:  # k = 4 regularises steps 0, 4, ...: ceil(steps / 4) of them
        assert row["regularised_steps"] == (math.ceil(result["steps"] / row["k"]) if row["regularised"] else 0)
        assert 0 <= row["mi"] <= math.log(4) and row["lpips_nearest"] >= 0
    # the spread: the mean of LPIPS's own forward over the ordered pairs of distinct images
    for images, reported in [(row["samples"], row["spread"]) for row in rows] + [(result["real"], result["real_spread"])]:
        pairs = list(itertools.permutations(range(images.shape[0]), 2))
        with torch.no_grad():
            by_hand = judge.perceptual(images[[i for i, _ in pairs]], images[[j for _, j in pairs]]).mean()
        assert reported == pytest.approx(float(by_hand), abs=1e-5)
    assert result["real_spread"] > 0.01  # distinct real images are apart: the check above can fail


def test_generator_defaults_tiny_never_writes_results(capsys) -> None:
    from benchmarks import generator_defaults

    with pytest.raises(SystemExit):
        generator_defaults.main(["--tiny", "--write"])
    assert "--write records a full run" in capsys.readouterr().err


def test_detectors_tiny_reports_every_case_and_agrees_with_pytorch_ood(capsys) -> None:
    from benchmarks import detectors_benchmark as bench
    from metrics.detectors import DETECTORS

    # every built-in detector that fits or reads the head (and GradNorm, scoring only) is a case or skipped, said why
    fitted = {name for name, cls in DETECTORS.items() if cls.needs_fit} | {"gradnorm"}
    assert bench.covered() | set(bench.SKIPPED) == fitted and not bench.covered() & set(bench.SKIPPED)
    assert {DETECTORS[name].kind for name in bench.SKIPPED} == {"model", "features"}  # AdaSCALE-A/-L, knn
    # a budget of 0.6 MiB for pytorch-ood's fits: RMD, ViM, ReAct, VRA and SHE run on fewer rows (not the defaults:
    # report what was configured)
    result = bench.main(["--tiny", "--fit", "2000", "--knn-fit", "300", "--pood-score-rows", "50",
                         "--pood-subset", "120", "--pood-memory", str(0.6 / 1024), "--weiper-fit", "40",
                         "--weiper-rows", "150"])
    rows = result["rows"]
    scored = result["id"] + result["ood"]
    by_case = {(row["detector"], row["phase"], row["rows"]): row for row in rows}
    assert len(by_case) == len(rows)
    shrunk = {"relative_mahalanobis": 500, "vim": 1000, "react": 1000, "vra": 1000, "she": 500}
    expected = []
    for case in bench.CASES:
        name = case.detector
        fit = {"cap": 300, "head": 0}.get(case.fit, 2000) if name != "weiper_kld" else 2000  # 300 per class > N
        if case.fit != "none" and (case.fit != "head" or name == "weiper"):
            expected.append((name, "fit", fit))
        if name in shrunk:
            expected.append((name, "fit", shrunk[name]))
        expected.append((name, "score", scored))
    assert [(row["detector"], row["phase"], row["rows"]) for row in rows] == expected
    # pytorch-ood where it has the detector, on its own rows where its estimated memory is over the budget
    has_pood = set(bench.POOD)
    for (name, phase, n), row in by_case.items():
        assert ("pood_s" in row or "pood_note" in row) == (name in has_pood and n != 0), row
        if name in shrunk and phase == "fit":
            if n == 2000:
                assert f"run on {bench._size(shrunk[name])} only" in row["pood_note"] and "over the budget of" in row["pood_note"]
            else:
                assert row["pood_rows"] == n and row["pood_estimate_mib"] <= 0.6
        assert math.isfinite(row["ours_s"]) and row["ours_s"] > 0, row
        assert "pood_s" not in row or (math.isfinite(row["pood_s"]) and row["pood_s"] > 0), row
    assert by_case["mahalanobis", "fit", 2000]["pood_rows"] == 2000  # estimated to hold no copy of the features
    # scoring: the per-class loops on --pood-score-rows, DICE, GradNorm and OpenMax on --pood-subset, extrapolated
    for name, part in [("mahalanobis", 50), ("relative_mahalanobis", 50), ("dice", 120), ("gradnorm", 120),
                       ("openmax", 120), ("vim", scored), ("nnguide", scored)]:
        row = by_case[name, "score", scored]
        assert (row["pood_rows"], row["pood_extrapolated"]) == (part, part < scored), name
    # WeiPer timed on --weiper-rows, WeiPer+KLD's fit on --weiper-fit per class (K = 10), both extrapolated
    assert by_case["weiper", "score", scored]["ours_rows"] == by_case["weiper_kld", "score", scored]["ours_rows"] == 150
    assert by_case["weiper_kld", "fit", 2000]["ours_rows"] == 400
    # the same scores as pytorch-ood, fitted on the same rows: float32 there, float64 here (ViM: pytorch-ood in
    # float64); OpenMax's ranks (another Weibull fit); VRA not compared (another detector), said why
    for row in rows:
        if "difference" in row:
            assert row["difference"] < (1e-10 if row["detector"] == "vim" else 1e-5), row
    compared = {row["detector"] for row in rows if "difference" in row}
    assert compared == has_pood - {"openmax", "vra"}
    assert by_case["openmax", "score", scored]["rank_correlation"] > 0.999
    assert "per feature dimension" in by_case["vra", "score", scored]["not_compared"]
    # the goal column from the numbers: ours within 2 GiB, no slower than pytorch-ood on the same rows
    for row in rows:
        same_rows = "pood_s" in row and (row["pood_rows"] == row["rows"] or row["pood_extrapolated"])
        slower = same_rows and row["ours_s"] > row["pood_s"]
        assert (row["goal"] == "yes") == (not slower and row["ours_peak_mib"] <= 2048), row
        assert ("pytorch-ood's time" in row["goal"]) == slower, row
    body = capsys.readouterr().out
    assert "| vim | fit | 2k |" in body and "| goal met |" in body and "GPU: not measured here" in body
    assert "knn (the paper's CIFAR setting" in body
    # a part of the cases: its rows replace those of its detectors in the block written before, the others kept
    part = bench.main(["--tiny", "--only", "nci,klm"])
    assert [(row["detector"], row["phase"]) for row in part["rows"]] == [
        ("nci", "fit"), ("nci", "score"), ("klm", "fit"), ("klm", "score")]
    merged = bench.merge(bench.markdown(result), part)
    table_lines = [line.split(" | ")[:3] for line in merged.splitlines() if line.startswith("| ")][1:]  # no header
    assert [cells[1] for cells in table_lines] == [row["detector"] for row in rows]  # the order of the cases
    assert {cells[1] for cells in table_lines if cells[0] == "| B"} == {"nci", "klm"}
    assert {cells[1] for cells in table_lines if cells[0] == "| A"} == bench.covered() - {"nci", "klm"}
    assert [line[:8] for line in merged.splitlines() if line.startswith("- Run ")] == ["- Run A,", "- Run B,"]
    assert "nci, klm; features generated" in merged and f"Goal met in {sum(r['goal'] == 'yes' for r in rows)}" not in \
        bench.merge(None, part)
    assert bench.merge(bench.merge(bench.markdown(result), part), part).count("- Run ") == 2  # B replaced by B
    # pytorch-ood's fDBD fit holds the K × K × D differences of the head's rows, whatever N: over a budget, its
    # scoring is still timed, with the same denominators computed without them
    lean = bench.main(["--tiny", "--only", "fdbd", "--pood-memory", str(10 / 2**20)])  # 10 KiB < 4·10²·64 bytes
    fit_row, score_row = lean["rows"]
    assert "pood_s" not in fit_row and "its fit not run" in fit_row["pood_note"] and "torch.cdist" in fit_row["pood_note"]
    assert score_row["pood_rows"] == scored and score_row["difference"] < 1e-5 and "torch.cdist" in score_row["pood_note"]
    capsys.readouterr()
    for argv, message in [(["--tiny", "--write"], "--write records a full run"),
                          (["--tiny", "--only", "knn"], "--only: no case 'knn'")]:
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert message in capsys.readouterr().err


def test_detectors_phase_measures_one_phase_and_replaces_only_its_rows(capsys) -> None:
    from benchmarks import detectors_benchmark as bench

    both = bench.main(["--tiny", "--only", "nci,vim"])
    assert [(row["detector"], row["phase"]) for row in both["rows"]] == [
        ("vim", "fit"), ("vim", "score"), ("nci", "fit"), ("nci", "score")]
    # scoring only, pytorch-ood's ViM fit over a budget of 0.6 MiB (1000 rows): ours fitted once, on its rows, and
    # the scores compared as in a full run
    score = bench.main(["--tiny", "--only", "nci,vim", "--phase", "score", "--pood-memory", str(0.6 / 1024)])
    assert score["phase"] == "score"
    assert [(row["detector"], row["phase"]) for row in score["rows"]] == [("vim", "score"), ("nci", "score")]
    scored = score["id"] + score["ood"]
    for row in score["rows"]:
        assert row["rows"] == row["pood_rows"] == scored and row["difference"] < 1e-5, row
        assert math.isfinite(row["ours_s"]) and row["ours_s"] > 0 and (row["goal"] == "yes") != ("pytorch-ood's time" in
                                                                                  row["goal"])
    fit = bench.main(["--tiny", "--only", "nci", "--phase", "fit"])
    assert [(row["detector"], row["phase"], row["rows"]) for row in fit["rows"]] == [("nci", "fit", both["fit"])]
    assert fit["rows"][0]["pood_rows"] == both["fit"]
    # each run replaces the rows of its phase only: vim's fit stays with run A, both scorings come from B, nci's fit
    # from C, each detector's fit before its scoring
    merged = bench.merge(bench.merge(bench.markdown(both), score), fit)
    cells = [line.split(" | ")[:3] for line in merged.splitlines() if line.startswith("| ")][1:]
    assert [(c[0][2:], c[1], c[2]) for c in cells] == [("A", "vim", "fit"), ("B", "vim", "score"), ("C", "nci", "fit"),
                                                      ("B", "nci", "score")]
    runs = [line for line in merged.splitlines() if line.startswith("- Run ")]
    assert [line[:8] for line in runs] == ["- Run A,", "- Run B,", "- Run C,"]
    assert "vim, nci;" in runs[0] and "vim, nci (scoring only: --phase score" in runs[1] and \
        "nci (fits only: --phase fit)" in runs[2]
    assert "Goal met in" in merged
    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--phase", "scores"])
    assert "invalid choice: 'scores'" in capsys.readouterr().err


def test_data_throughput_tiny_scores_the_same_images_from_folders_and_shards(tmp_path: Path) -> None:
    # the script itself asserts that the shard set fingerprints as its files and scores them to the same sum
    body = data_throughput.main(["--tiny", "--work-dir", str(tmp_path)])
    passes = [line for line in body.splitlines() if line.startswith("| ") and "| 60 | 2 |" in line]
    assert [line.split(" | ")[0][2:] for line in passes] == ["folders (ImageFileDataset)", "litdata shards (ImageFileDataset)",
                                                          "webdataset tars (WebDataset)",
                                                          "litdata shards, reads unchecked (only to measure the check)"]
    index = [line.split(" | ")[0][2:] for line in body.splitlines() if line.startswith("| ") and "| 120 |" in line]
    assert index[:4] == ["folders: list the class folders, stat every file",
                        "litdata shards: the pool's rows (the set's listing: one digest, the recorded fingerprint)",
                        "litdata shards: the rows shuffled (look up and fingerprint every row)",
                        "  of which the shard index arrays"]
    where = body.split("| where the time goes (one process) |")[1].split("\n\n")[0].splitlines()[2:]
    assert [line.split(" | ")[0][2:] for line in where] == [
        "read the bytes of a file", "read the bytes from the shard set (litdata)", "decode (PIL, RGB)",
        "the model transform (grey, 28 x 28, tensor)"]
    checks = body.split("| checking an image's bytes (one process) |")[1].split("\n\n")[0].splitlines()[2:]
    assert [line.split(" | ")[0][2:] for line in checks[:4]] == list(data_throughput.DIGESTS)  # the candidates
    assert "30 class folders x 4 JPEG files" in body and list(tmp_path.iterdir()) == []
