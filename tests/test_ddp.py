"""2 processes equal 1 process, for every evaluation command: one harness, one scenario per evaluation.

Each scenario runs an ``evaluate.py`` command once in this process (1 device) and once as a script on 2
gloo processes (``--devices 2 --strategy ddp``; Lightning launches the second rank), then compares what
both wrote. Every scenario has more processes than batches somewhere (one image to generate, one batch of
chains, sets smaller than the shards), so a rank without data must still join every collective: a hang
ends in the timeout instead of blocking the suite.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import evaluate
from tests.conftest import ROOT, child_env
from tests.test_generate import generate, train_generators

pytestmark = [pytest.mark.ddp, pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings(r"ignore:LPIPS\(alex, RANDOM backbone:UserWarning")]

QUIET = ["--wandb-mode", "disabled", "--no-progress-bar", "--accelerator", "cpu"]


def run_two_processes(argv: list[str], cwd: Path) -> str:
    env = child_env(WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    command = [sys.executable, str(ROOT / "evaluate.py"), *argv, *QUIET, "--devices", "2", "--strategy", "ddp"]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def assert_rows_close(one: Path, two: Path, *, tolerance: float = 0.0) -> None:
    """The same table: text equal, numbers within ``tolerance`` (0: exactly)."""
    left, right = rows(one), rows(two)
    assert len(left) == len(right) and left and list(left[0]) == list(right[0]), one.name
    for a, b in zip(left, right, strict=True):
        for key in a:
            try:
                x, y = float(a[key]), float(b[key])
            except ValueError:
                assert a[key] == b[key], (one.name, key)
                continue
            assert x == pytest.approx(y, abs=tolerance, nan_ok=True), (one.name, key, a[key], b[key])


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory, demo_checkpoint: Path) -> dict:
    generators = train_generators(str(tmp_path_factory.getbasetemp() / "generators"))
    sets = tmp_path_factory.mktemp("sets")
    return {"checkpoint": str(demo_checkpoint), "generators": generators,
            "members": [str(p) for p in generators["members"]],
            "near_ood": generate(generators["near_ood"], sets / "near", "--num", "6", "--reference", "3"),
            "shift": generate(generators["shift"], sets / "shift", "--num", "5")}


def check_oscr(one: Path, two: Path, out: str) -> None:
    first, second = (json.loads((p / "metrics.json").read_text()) for p in (one, two))
    assert second["counts"] == first["counts"] == {"known": 4000, "negatives": 3000, "unknowns": 3000,
                                                   "skipped_images": 0}
    assert second["scalars"] == first["scalars"]
    assert second["intervals"] == first["intervals"] and first["intervals"]["unknowns/ccr@fpr=0.1"][0] is not None
    for group in ("negatives", "unknowns"):
        assert (two / f"oscr_{group}.csv").read_text() == (one / f"oscr_{group}.csv").read_text()


def check_severity(one: Path, two: Path, out: str) -> None:
    assert "4 model passes" in out  # estimation, test, ID images, and the fit pass of the fitted detectors
    # the tables hold every κ's mean scores (per level, per pool class: levels_*.csv) and AUROCs: the scores of
    # the fitted detectors as well, to the last digit
    for name in ("severity.csv", "demo-best_softmax_n11.csv", "levels_demo-best_entropy.csv",
                 "demo-best_mahalanobis_n11.csv", "levels_demo-best_mahalanobis.csv", "levels_demo-best_knn.csv",
                 "demo-best_vim_n11.csv", "levels_demo-best_vim.csv"):
        assert (two / name).read_text() == (one / name).read_text(), name
    # the fitted detectors: fitted on the same gathered fit outputs, the same state on 2 processes as on 1 (the
    # 1-process run on 2 threads, each of the 2 processes on 1: MKL's eigh and Cholesky run on one thread), so the
    # same state fingerprint, which keys EvG's chains, and the same cache keys
    first, second = (torch.load(p / "fitted_detectors.pt", weights_only=False) for p in (one, two))
    assert sorted(e["kappa"] for e in first.values()) == ["knn", "mahalanobis", "vim"]
    assert first.keys() == second.keys()
    assert {k: e["state"] for k, e in first.items()} == {k: e["state"] for k, e in second.items()}
    for key, entry in first.items():
        state, other = entry["state_dict"], second[key]["state_dict"]
        assert state.keys() == other.keys() and all(torch.equal(state[n], other[n]) for n in state), entry["kappa"]
    assert all(e["samples"] == 80 for e in first.values())  # 20 training images of each of the 4 known classes
    # the 2-process cache holds each sample once, in dataset order
    tensors = torch.load(next((two.parent / "cache-two").glob("demo-best-id_test-*.pt")), weights_only=True)["tensors"]
    assert tensors["logits"].shape == (4000, 4)
    from datamodules.severity import FashionSeverityData

    assert torch.equal(tensors["targets"], FashionSeverityData()["id_test"].labels())


def check_generate(one: Path, two: Path, out: str) -> None:
    for name in ("single", "padded"):
        assert (two / name / "images.pt").read_bytes() == (one / name / "images.pt").read_bytes(), name
        # one image per batch (ONE_IMAGE): the images exactly; MI and LPIPS as written, to float tolerance
        assert_rows_close(one / name / "manifest.csv", two / name / "manifest.csv", tolerance=1e-5)
    assert len(rows(two / "single" / "manifest.csv")) == 1  # one image on two processes: written once
    assert len(rows(two / "padded" / "manifest.csv")) == 13  # the sampler's padding duplicate is not written


def check_generated(one: Path, two: Path, out: str) -> None:
    """``one``: the 1-process run on the 2-process run's cached passes (REPLAYED): the same tables exactly."""
    for name in ("detectors.csv", "sets.csv", "agreement.csv"):
        assert_rows_close(one / name, two / name)
    # the passes the 2 processes sharded and gathered are the 1-process passes: every set, model and pass (logits,
    # the LPIPS to the nearest reference), each sample in its place, to float32 rounding (batched otherwise)
    check_generated_passes(two)


def check_ood(one: Path, two: Path, out: str) -> None:
    """``one``: the 1-process run on the 2-process run's cached passes (REPLAYED): every row, mean, interval, ▼,
    the summary and every score file exactly; the passes themselves as :func:`check_generated` compares them."""
    for name in ("sets.csv", "summary.csv"):
        assert_rows_close(one / name, two / name)
    first, second = (sorted(p.relative_to(folder / "scores") for p in (folder / "scores").rglob("*.csv"))
                     for folder in (one, two))
    assert first == second and len(first) == 3 * 6  # 3 κ x (ID test, near, far, 2 unit tests, 1 corruption)
    for path in first:
        assert (one / "scores" / path).read_bytes() == (two / "scores" / path).read_bytes(), path
    check_generated_passes(two)
    assert "OOD benchmark fashion written to" in out


def check_generated_passes(two: Path) -> None:
    first, second = (sorted((two.parent / cache).glob("*.pt")) for cache in ("cache-one", "cache-two"))
    assert [p.name for p in first] == [p.name for p in second] and first
    for a, b in zip(first, second, strict=True):
        left, right = (torch.load(p, weights_only=True)["tensors"] for p in (a, b))
        assert left.keys() == right.keys() and torch.equal(left["targets"], right["targets"]), a.name
        for key in left.keys() - {"targets"}:
            torch.testing.assert_close(right[key], left[key], rtol=1e-4, atol=1e-5, msg=f"{a.name}: {key}")


def check_evg(one: Path, two: Path, out: str) -> None:
    assert (two / "results.csv").read_bytes() == (one / "results.csv").read_bytes()
    assert (two / "standardisation.csv").read_bytes() == (one / "standardisation.csv").read_bytes()
    first = torch.load(one / "worst_cases.pt", weights_only=False)
    second = torch.load(two / "worst_cases.pt", weights_only=False)
    assert first.keys() == second.keys()
    for key in first:
        for name in ("points", "energy", "best_step"):
            assert torch.equal(first[key][name], second[key][name]), (key, name)


def check_report(one: Path, two: Path, out: str) -> None:
    first, second = (json.loads((p / "report.json").read_text()) for p in (one, two))
    assert second["leaderboard"] == first["leaderboard"] and len(first["leaderboard"]["rows"]) == 2
    assert {k for row in first["leaderboard"]["rows"] for k in row["cells"]} == {
        "oscr_ccr", "oscr_auroc", "severity_mean", "severity_hardest"}
    measured = {s["method"]: s for s in first["sections"]}, {s["method"]: s for s in second["sections"]}
    # every number of the methods' sections, exactly; the cost section's times and memory are measurements of each
    # run (what they are of, exactly)
    assert [s["tables"] for s in second["sections"] if s["method"] != "cost"] == \
        [s["tables"] for s in first["sections"] if s["method"] != "cost"]
    what = [[{k: row[k] for k in ("model", "κ", "parameters", "fit images", "scored images", "passes per image")}
             for row in runs["cost"]["tables"][0]["rows"]] for runs in measured]
    assert what[0] == what[1] and len(what[0]) == 2
    assert all(row["images/s"] > 0 for runs in measured for row in runs["cost"]["tables"][0]["rows"])
    assert "Report card written" in out and (two / "index.html").is_file()


# Every network runs on one image at a time (batch size 1) in both runs. Sharded over 2 processes, a batch
# holds other images than on 1 process, and a convolution's float32 output for an image may then differ in the
# last bits on some CPUs (oneDNN's blocking, the vector width): a flipped near-tie would move an AUROC or a
# CCR, a last bit an energy and so an MH decision. The claim tested here is about the evaluation code (sharding
# without padding, exact gathers, the duplicates dropped, every rank joining every collective): given the same
# per-sample outputs, 2 processes give the 1-process files bit for bit. One image per batch gives every image
# the same arithmetic in both runs (each process runs one thread), so the comparisons stay exact.
ONE_IMAGE = "1"
# Scenarios too slow at one image a batch: their passes are batched and cached, and the 1-process run is
# repeated on the 2-process run's cache (the same per-sample outputs), whose tables must then be the 2-process
# tables exactly; the two runs' own passes are compared to float32 tolerance (their check).
REPLAYED = {"generated", "ood"}
# The 1-process run of these scenarios on 2 intra-op threads, as a user's 1-process run takes the machine's cores
# while Lightning gives each of N processes 1/N of them (here 1): what runs on every thread (the convolutions of one
# image, the fitted detectors' matrix products) must not depend on the count, and the factorisations whose last
# bits do (MKL's eigh, Cholesky) run on one thread (metrics.detectors.base.thread_independent).
ONE_PROCESS_THREADS = {"severity": 2}


def scenario_arguments(name: str, artefacts: dict, out: Path, cache: Path) -> list[list[str]]:
    """The command line(s) of a scenario writing to ``out`` (and ``cache``)."""
    checkpoint, members = artefacts["checkpoint"], artefacts["members"]
    if name == "oscr":
        return [["oscr", "--model", checkpoint, "--output-dir", str(out), "--no-plots", "--data-arg",
                 f"batch_size={ONE_IMAGE}"]]
    if name == "severity":
        return [["severity", "--model", checkpoint, "--data", "fashion", "--data-arg", "estimation=20", "--data-arg",
                 "test=10", "--kappa", "softmax", "entropy", "mahalanobis", "knn", "vim", "--kappa-arg", "knn.k=3",
                 "--fit-arg", "mahalanobis.per_class=20", "--fit-arg", "knn.per_class=20", "--fit-arg",
                 "vim.per_class=20", "--cache-dir", str(cache),
                 "--output-dir", str(out), "--batch-size", ONE_IMAGE]]
    if name == "generate":
        near = str(artefacts["generators"]["near_ood"])
        return [["generate", "--model", near, "--output-dir", str(out / "single"), "--num", "1", "--reference", "3"],
                ["generate", "--model", near, "--output-dir", str(out / "padded"), "--num", "13", "--batch-size",
                 ONE_IMAGE, "--reference", "5", "--seed", "1"]]
    if name == "generated":
        return [["generated", "--model", checkpoint, f"ensemble:{','.join(members)}", "--kappa", "softmax", "entropy",
                 "ensemble_mi", "--data", "fashion", "--near-ood", str(artefacts["near_ood"]), "--shift",
                 str(artefacts["shift"]), "--real-ood", "digits", "--ensemble", *members, "--allow-weak-ensemble",
                 "--lpips-net", "alex",
                 "--lpips-random-backbone", "--reference", "2", "--output-dir", str(out), "--no-plots",
                 "--cache-dir", str(cache)]]  # batched (one image a batch is too slow here): REPLAYED
    if name == "ood":  # the demo's benchmark, small: 2 unit tests, 1 corruption (full-spectrum), a fitted detector
        return [["ood", "--model", checkpoint, "--data", "fashion", "--data-arg", "unit_images=5", "--data-arg",
                 "unit_tests=[uni, Gaussian]", "--data-arg", "corruptions=[contrast]", "--data-arg", "val_images=20",
                 "--full-spectrum", "--kappa", "softmax", "energy", "mahalanobis", "--fit-arg",
                 "mahalanobis.per_class=20", "--intervals", '{"resamples": 200}', "--cache-dir", str(cache),
                 "--output-dir", str(out), "--no-plots"]]  # batched: REPLAYED
    if name == "report":
        severity = {"data": "fashion", "data_args": {"estimation": 20, "test": 10}, "batch_size": int(ONE_IMAGE)}
        oscr = {"data_args": {"batch_size": int(ONE_IMAGE)}}
        return [["report", "--model", checkpoint, "--kappa", "softmax", "entropy", "--open_set", json.dumps(oscr), "--severity",
                 json.dumps(severity), "--intervals", '{"resamples": 200}', "--cache-dir", str(cache),
                 "--output-dir", str(out), "--no-plots"]]
    return [["evg", "--model", checkpoint, "--kappa", "softmax", "max_logit", "--ood", "digits", "--data", "fashion",
             "--data-arg", "max_train_per_class=60", "--variation", "affine", "colour", "--sampler", "mh", "random",
             "--chains", "6", "--steps", "5", "--chains-per-batch", "6", "--seed", "3", "--output-dir", str(out),
             "--cache-dir", str(cache), "--no-plots", "--batch-size", ONE_IMAGE]]  # the chains: one batch of 6 on rank 0


CHECKS: dict[str, Callable[[Path, Path, str], None]] = {
    "oscr": check_oscr, "severity": check_severity, "generate": check_generate, "generated": check_generated,
    "evg": check_evg, "report": check_report, "ood": check_ood,
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_two_processes_equal_one_process(name: str, artefacts: dict, tmp_path: Path) -> None:
    output = ""
    for one, two in zip(scenario_arguments(name, artefacts, tmp_path / "one", tmp_path / "cache-one"),
                        scenario_arguments(name, artefacts, tmp_path / "two", tmp_path / "cache-two"), strict=True):
        threads = torch.get_num_threads()
        torch.set_num_threads(ONE_PROCESS_THREADS.get(name, threads))
        try:
            evaluate.main([*one, *QUIET, "--devices", "1"])
        finally:
            torch.set_num_threads(threads)
        output += run_two_processes(two, cwd=tmp_path)
    if name in REPLAYED:  # the 1-process run once more, on the per-sample outputs the 2 processes computed
        for again in scenario_arguments(name, artefacts, tmp_path / "replay", tmp_path / "cache-two"):
            evaluate.main([*again, *QUIET, "--devices", "1"])
        CHECKS[name](tmp_path / "replay", tmp_path / "two", output)
        return
    CHECKS[name](tmp_path / "one", tmp_path / "two", output)


def test_every_evaluation_has_a_scenario() -> None:
    assert set(CHECKS) | {"severity-plot"} == set(evaluate.COMMANDS)  # severity-plot runs no model


def ood_folder_and_shards(tmp_path: Path) -> tuple[Path, str]:
    """9 OOD JPEGs in two class folders, and their shard set of 3 parts."""
    import numpy as np

    from datamodules.shards import folder_rows, write_shards
    from tests.conftest import write_jpeg

    folder = tmp_path / "ood"
    rng = np.random.default_rng(5)
    for i in range(9):
        write_jpeg(folder / ("misc" if i % 2 else "other") / f"{i}.JPEG", rng, size=30)
    shards = write_shards(folder, folder_rows(folder), tmp_path / "ood-shards", source={"kind": "folder"}, workers=1,
                          part_size=4, log=lambda message: None)
    return folder, shards.root


def evg_on(ood: str | Path, out: Path, cache: Path, artefacts: dict) -> list[str]:
    arguments = scenario_arguments("evg", artefacts, out, cache)[0]
    arguments[arguments.index("digits")] = str(ood)
    return arguments


def test_two_processes_on_shards_equal_one_process_on_the_folder(artefacts: dict, tmp_path: Path) -> None:
    """EvG's OOD images from a folder on 1 process and from its shard set on 2: the same chains bit for bit (the
    shard set reads as the folder, in the same order, each sample once over the ranks)."""
    folder, shards = ood_folder_and_shards(tmp_path)
    evaluate.main([*evg_on(folder, tmp_path / "one", tmp_path / "cache-one", artefacts), *QUIET, "--devices", "1"])
    two = evg_on(shards, tmp_path / "two", tmp_path / "cache-two", artefacts)
    check_evg(tmp_path / "one", tmp_path / "two", run_two_processes(two, cwd=tmp_path))


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_node(arguments: list[str], *, endpoint: str, run_id: str, cwd: Path) -> subprocess.Popen:
    """One "node" of a two-node ``evaluate.py`` run: ``torchrun --nnodes 2 --nproc-per-node 1`` (c10d rendezvous)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, str(ROOT / "evaluate.py"),
               *arguments, *QUIET, "--devices", "1", "--num_nodes", "2", "--strategy", "ddp"]
    return subprocess.Popen(command, cwd=cwd, env=child_env(WANDB_MODE="disabled", OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(nodes: list[subprocess.Popen], *, timeout: int) -> list[tuple[str, str]]:
    """Each node's (stdout, stderr); a node still running after ``timeout`` seconds (a hang) is killed, with the
    others, and fails the test."""
    try:
        return [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()


def test_a_shard_set_missing_on_one_node_is_a_clear_error_not_a_hang(demo_checkpoint: Path, tmp_path: Path) -> None:
    """Node 1 lacks the shard set node 0 reads: node 1 stops at set-up naming the path it looked for, and node 0
    stops too (torchrun's rendezvous ends the run when a node's worker fails) instead of waiting out the process
    group's 30-minute timeout."""
    _, shards = ood_folder_and_shards(tmp_path)
    artefacts = {"checkpoint": str(demo_checkpoint), "members": []}
    missing = tmp_path / "not-copied-here" / "ood-shards"
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [launch_node(evg_on(ood, tmp_path / f"node{rank}", tmp_path / f"cache{rank}", artefacts), endpoint=endpoint,
                         run_id="missing", cwd=tmp_path) for rank, ood in enumerate((shards, missing))]
    outputs = finish(nodes, timeout=240)  # a hang ends here, as a failure
    assert [node.returncode != 0 for node in nodes] == [True, True]
    assert f"real OOD set '{missing}': not one of ['digits', 'fashion'] (NAME or NAME:ARGUMENT) nor an existing " \
           "folder" in outputs[1][1], outputs[1][1][-3000:]
    assert "not one of" not in outputs[0][1]  # node 0 had its shards: it stopped for its peer


def test_two_nodes_equal_one_process(artefacts: dict, tmp_path: Path) -> None:
    """Two "nodes" on this machine, each one process, launched as the README launches ``evaluate.py`` on a cluster
    (``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on every node,
    ``--num_nodes 2``), reading the OOD images from one shard set: the EvG chains of 1 process from the folder,
    bit for bit; and the severity benchmark's tables and fitted detectors of 1 process."""
    folder, shards = ood_folder_and_shards(tmp_path)
    evaluate.main([*evg_on(folder, tmp_path / "one", tmp_path / "evg-cache-one", artefacts), *QUIET, "--devices", "1"])
    severity = {name: scenario_arguments("severity", artefacts, tmp_path / f"{name}-severity", tmp_path / f"cache-{name}")[0]
                for name in ("one", "two")}
    evaluate.main([*severity["one"], *QUIET, "--devices", "1"])
    for arguments, check in ((evg_on(shards, tmp_path / "two", tmp_path / "evg-cache-two", artefacts), "evg"),
                             (severity["two"], "severity")):
        endpoint = f"127.0.0.1:{free_port()}"
        nodes = [launch_node(arguments, endpoint=endpoint, run_id=check, cwd=tmp_path) for _ in range(2)]
        outputs = finish(nodes, timeout=300)
        for node, (_, err) in zip(nodes, outputs, strict=True):
            assert node.returncode == 0, err[-5000:]
        out = "".join(o + e for o, e in outputs)
        assert "Starting with 2 processes" in out  # one world of 2 processes over the two launches, not 2 of 1
        if check == "evg":
            check_evg(tmp_path / "one", tmp_path / "two", out)
        else:
            check_severity(tmp_path / "one-severity", tmp_path / "two-severity", out)
