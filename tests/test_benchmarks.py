"""``benchmarks.gpu_throughput`` in its tiny CPU mode: every row of the table with sane values.

A smoke test that keeps the GPU script working between the days a GPU is lent; it asserts on what the
table reports, never on how fast anything ran.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import gpu_throughput
from datamodules import imagenet_protocol

pytestmark = pytest.mark.benchmark


def test_gpu_throughput_tiny_reports_every_row(tmp_path: Path) -> None:
    batch, steps = 3, 2  # not the tiny defaults (4, 2 after 1): the table must report what was configured
    table = gpu_throughput.main(["--tiny", "--work-dir", str(tmp_path), "--batch-sizes", str(batch),
                                 "--steps", str(steps), "--warmup-steps", "1"])

    assert [row["row"] for row in table] == list(gpu_throughput.ROWS)
    rows = {row["row"]: row for row in table}
    for row in table:
        assert math.isfinite(row["images_per_s"]) and row["images_per_s"] > 0, row
        assert math.isfinite(row["seconds"]) and row["seconds"] > 0, row
        assert row["batch_size"] == batch, row
    for name in gpu_throughput.TRAINING_ROWS:
        assert rows[name]["steps"] == steps
        assert rows[name]["images"] == steps * batch  # the timed steps stay within one epoch
        assert rows[name]["images_per_s"] == rows[name]["images"] / rows[name]["seconds"]
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
    for row in (oscr, severity):
        assert row["steps"] == validation["steps"]
        assert math.isfinite(row["added_s"]) and row["added_s"] >= 0
        assert row["added_s"] == row["seconds"]
        assert math.isfinite(row["added_wall_s"])  # a difference of two timings: may be negative by noise
    assert (tmp_path / "protocols" / "p2_train.csv").is_file()  # the data pipeline row read the generated folder


def test_evg_sampler_tiny_reports_both_samplers() -> None:
    from benchmarks import evg_sampler

    chains, toy_steps, detector_steps = 3, (2, 11), (4,)  # not the tiny defaults: report what was configured
    table = evg_sampler.main(["--tiny", "--chains", str(chains), "--toy-steps", *map(str, toy_steps),
                              "--detector-steps", *map(str, detector_steps)])

    assert [(row["energy"], row["steps"]) for row in table] == (
        [("toy", steps) for steps in toy_steps] + [("detector", steps) for steps in detector_steps])
    for row in table:
        assert (row["chains"], row["chain_steps"], row["dim"]) == (chains, chains * row["steps"], 5)
        for method in evg_sampler.METHODS:
            measured = row[method]
            assert math.isfinite(measured["seconds"]) and measured["seconds"] > 0, row
            assert measured["chain_steps_per_s"] == row["chain_steps"] / measured["seconds"]
            assert math.isfinite(measured["lowest"]) and measured["lowest"] <= measured["start"], row
            assert 0 <= measured["acceptance"] <= 1
            assert measured["rss_growth_kib"] is None or measured["rss_growth_kib"] >= 0
            assert measured["random_ms"] > 0
        # the loop keeps its whole trajectory, the batched sampler the running minimum and a thinned trace
        assert row["reference"]["kept_bytes"] == evg_sampler.loop_kept_bytes(chains, 5, row["steps"])
        assert row["batched"]["kept_bytes"] == evg_sampler.batched_kept_bytes(chains, 5, row["steps"])
    toy = [row for row in table if row["energy"] == "toy"]
    assert toy[1]["reference"]["kept_bytes"] > toy[1]["batched"]["kept_bytes"]  # 11 steps: 3 states per chain traced
