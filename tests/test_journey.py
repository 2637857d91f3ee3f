"""The ImageNet journey of the docs (``docs/journey.md``), as a researcher with ImageNet walks it: every command of its
``# journey:`` blocks, run as written (a subprocess each, in a fresh working folder), on a tiny
ILSVRC2012-shaped tree of the real P1 classes, a tiny ImageNet-21k pool and an OOD folder, shrunk only by
options the commands document (the page lists them). Each command reads what the one before it wrote;
each exits 0 and writes finite numbers. Then the same for a user's own class folders, and EvG with P1
classifiers on a timm backbone of each family timm sizes differently (ResNet, ConvNeXt, MobileNetV3).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datamodules.imagenet21k import ood_classes
from datamodules.openood import BENCHMARKS, openood_tree
from tests.conftest import ROOT, child_env, make_imagenet_folder, protocol_wnids, write_jpeg

JOURNEY_PAGE = ROOT / "docs" / "journey.md"  # the page whose commands this test runs as written

pytestmark = [pytest.mark.journey, pytest.mark.timeout(1800)]  # a long walk: longer than one test

# -- the options that shrink the journey (docs/journey.md, "Trying the journey on a small machine") --------

CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
       "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]
SMALL_DATA = ["--data.init_args.resize_size", "36", "--data.init_args.crop_size", "32", "--data.init_args.num_workers",
              "0", "--data.init_args.batch_size", "32", "--data.init_args.pin_memory", "false"]
CLASSIFIER = [*CPU, *SMALL_DATA, "--trainer.max_epochs", "1", "--model.init_args.backbone", "small_cnn"]
SEVERITY_CALLBACK = ["--trainer.callbacks.init_args.data_args", '{"protocol": 1, "estimation": 3, "test": null}',
                     "--trainer.callbacks.init_args.every_n_epochs", "1"]
GENERATOR = [*CPU, *SMALL_DATA, "--data.init_args.batch_size", "8", "--trainer.max_steps", "4",
             "--model.init_args.image_size", "32", "--model.init_args.base_width", "8",
             "--model.init_args.lpips_net", "alex", "--model.init_args.lpips_random_backbone", "true",
             # the tiny ensemble (1 epoch on 5 random images a class) is below the sanity bar: allowed by name
             "--model.init_args.allow_weak_ensemble", "true"]
EVALUATE = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar"]
# the OpenOOD ImageNet-1K tree: a few images of each list, named as in the published lists (datamodules.openood_tree)
OPENOOD_SETS = ("id_val", "id_test", "ood_val", "ssb_hard", "ninco", "inaturalist", "textures", "openimage_o")
OPENOOD_SUBSETS = {name: f"openood-subsets/{name}.txt" for name in OPENOOD_SETS}
SHRINK = {
    "protocol": [],
    "train": [*CLASSIFIER, *SEVERITY_CALLBACK],
    "oscr": EVALUATE,
    "severity": [*EVALUATE, "--data-arg", "estimation=3"],
    "pool": [],
    "severity-21k": [*EVALUATE, "--data-arg", "estimation=3"],
    "severity-plot": [],
    "shards": ["--workers", "2", "--part-size", "500"],
    "shards-pool": ["--workers", "1"],
    "oscr-shards": EVALUATE,
    "severity-21k-shards": [*EVALUATE, "--data-arg", "estimation=3"],
    "severity-21k-device": [*EVALUATE, "--data-arg", "estimation=3"],
    "ensemble": [*CLASSIFIER, "--members", "2"],
    "shift-generator": GENERATOR,
    "near-ood-generator": [*GENERATOR, "--model.init_args.architecture", "dcgan"],  # DCGAN: the 32 px family
    "generate": [*EVALUATE, "--num", "4", "--batch-size", "4", "--reference", "4"],
    "generated": [*EVALUATE, "--random-weights", "--allow-weak-ensemble"],
    "ood-gan": [*CPU, "--trainer.max_steps", "4", "--model.init_args.image_size", "32", "--data.init_args.image_size",
                "32", "--model.init_args.architecture", "dcgan", "--model.init_args.base_width", "8",
                "--data.init_args.num_workers", "0", "--data.init_args.batch_size", "8"],
    "evg": [*EVALUATE, "--chains", "4", "--steps", "3", "--chains-per-batch", "4", "--trace-every", "1"],
    "report": [*EVALUATE, "--severity", '{"kappa": [softmax, energy], "data_args": {"estimation": 3}}',
               "--generated", '{"near_ood": [data/p1-near-ood], "shift": [data/p1-shift], '
               '"ensemble": runs/p1-ensemble/ensemble.txt, "allow_weak_ensemble": true}',
               "--intervals", '{"resamples": 100}'],
    "openood": [*EVALUATE, "--random-weights", "--data-arg", f"subset_lists={json.dumps(OPENOOD_SUBSETS)}",
                "--intervals", '{"resamples": 100}'],
    "openood-scores": ["--data-arg", f"subset_lists={json.dumps(OPENOOD_SUBSETS)}", "--intervals",
                       '{"resamples": 100}'],
    "folders-train": CLASSIFIER,
}
TIMM_FAMILIES = {"resnet": "timm:resnet10t", "convnext": "timm:convnext_atto", "mobilenetv3": "timm:mobilenetv3_small_050"}
ANIMALS = ["bat", "cat", "dog", "emu", "fox", "owl", "yak"]


def journey_commands() -> dict[str, str]:
    """``step -> command`` of ``docs/journey.md``'s ``# journey: <step>`` blocks, continuation lines joined."""
    text = JOURNEY_PAGE.read_text()
    blocks = re.findall(r"```bash\n# journey: ([\w-]+)\n(.*?)```", text, flags=re.S)
    return {step: " ".join(line.rstrip("\\").strip() for line in body.strip().splitlines()) for step, body in blocks}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny data of the journey and a working folder in which the page's relative paths resolve."""
    root = tmp_path_factory.mktemp("journey")
    imagenet = make_imagenet_folder(root / "ILSVRC2012", protocol_wnids(1), train=5, val=2)
    rng = np.random.default_rng(7)
    pool = [w for w in ood_classes() if w not in set(protocol_wnids(1))][:3]
    for wnid in pool:  # 200 images each: the sampler's minimum
        for i in range(200):
            write_jpeg(root / "imagenet21k" / wnid / f"{wnid}_{i}.JPEG", rng, size=8)
    for i in range(12):
        write_jpeg(root / "ood" / "misc" / f"{i}.JPEG", rng, size=20)
    mine = make_imagenet_folder(root / "my-images", ANIMALS, train=6, val=2, seed=3)
    for animal in ("cat", "dog"):  # a real shift set of the known classes (laid out as ImageNet-R)
        for i in range(3):
            write_jpeg(root / "my-shift" / animal / f"{i}.jpg", rng, size=24)
    work = root / "work"
    work.mkdir()
    lists = openood_tree(root / "openood", "imagenet1k", sets=list(OPENOOD_SETS), per_set=6, seed=5, size=12)
    (work / "openood-subsets").mkdir()
    for name, path in lists.items():
        (work / "openood-subsets" / f"{name}.txt").write_text(path.read_text())
    (root / "openood" / "images_largescale" / "ninco").rename(root / "NINCO")  # NINCO elsewhere: --set-root
    for name in ("train.py", "evaluate.py", "configs", "datamodules"):
        (work / name).symlink_to(ROOT / name)
    return {"work": work, "/data/ILSVRC2012": imagenet, "/data/imagenet21k": root / "imagenet21k",
            "/data/ood": root / "ood", "/data/my-images": mine, "/data/my-shift": root / "my-shift",
            "/data/openood": root / "openood", "/data/NINCO": root / "NINCO"}


def run(world: dict[str, Path], command: str, extra: list[str]) -> str:
    for placeholder, path in world.items():
        if placeholder.startswith("/"):
            command = command.replace(placeholder, str(path))
    argv = shlex.split(command)
    assert argv[0] == "python", command
    env = child_env(WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="2")
    result = subprocess.run([sys.executable, *argv[1:], *extra], cwd=world["work"], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert "found in sys.modules" not in result.stderr, f"{command}: runpy warns of a second copy of the module"
    return result.stdout


def numbers(path: Path, columns: tuple[str, ...]) -> list[float]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows, path
    return [float(row[c]) for row in rows for c in columns if row.get(c) not in (None, "")]


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def assert_device_passes_match(cache: Path) -> None:
    """Every pass decoded on the device has a CPU-decoded twin in the cache (the same pass of the same set under
    another key): the same samples in the same order, the logits within what 1/255 of input changes."""
    import torch

    entries = [torch.load(path, weights_only=False) for path in sorted(cache.glob("*.pt"))]
    device = [e for e in entries if e["meta"].get("decode") == "device"]
    assert device, "no device-decoded pass in the cache"
    def identity(meta: dict) -> dict:  # what the pass is, not what it cost (its seconds and hardware)
        return {k: v for k, v in meta.items() if k not in ("decode", "seconds", "hardware")}

    for entry in device:
        meta = identity(entry["meta"])
        twins = [e for e in entries if e["meta"].get("decode") != "device" and identity(e["meta"]) == meta]
        assert len(twins) == 1, meta
        assert torch.equal(entry["tensors"]["targets"], twins[0]["tensors"]["targets"])
        torch.testing.assert_close(entry["tensors"]["logits"], twins[0]["tensors"]["logits"], atol=0.05, rtol=0)


def assert_finite(values: list[float], what: str) -> None:
    assert values and all(math.isfinite(v) for v in values), (what, values[:10])


def test_the_readme_journey_runs_as_written(world: dict[str, Path]) -> None:
    commands = journey_commands()
    assert list(SHRINK) == list(commands), "every journey block of docs/journey.md has its shrink options here"
    work = world["work"]
    for step, command in commands.items():
        run(world, command, SHRINK[step])
        if step == "train":
            assert (work / "runs/p1-eos/checkpoints/best.ckpt").is_file()
            history = work / "runs/p1-eos/checkpoints/severity-val/history.csv"
            assert_finite(numbers(history, ("ood-auroc",)), "severity during training")
        elif step == "oscr":
            report = json.loads((work / "runs/p1-eos/checkpoints/best-oscr/metrics.json").read_text())
            assert report["counts"]["known"] == 116 * 2 and report["counts"]["unknowns"] == 166 * 2
            assert_finite(list(report["scalars"].values()), "oscr")
        elif step in ("severity", "severity-21k"):
            folder = work / "runs/p1-eos" / step
            assert_finite(numbers(folder / "severity.csv", ("ood-auroc", "id-acc", "ood_avg_conf")), step)
            levels = numbers(folder / "levels_p1-eos-best_softmax.csv", ("class index",))
            assert max(levels) == (166 + 3 - 1 if step == "severity-21k" else 166 - 1)  # the 21k classes joined
        elif step == "oscr-shards":  # the same numbers from the shard set as from the folders
            shards = json.loads((work / "runs/p1-eos/oscr-shards/metrics.json").read_text())
            folders = json.loads((work / "runs/p1-eos/checkpoints/best-oscr/metrics.json").read_text())
            assert shards["counts"] == folders["counts"] and shards["scalars"] == folders["scalars"]
        elif step == "severity-21k-shards":
            for name in ("severity.csv", "levels_p1-eos-best_softmax.csv"):
                assert rows_of(work / "runs/p1-eos/severity-21k-shards" / name) == rows_of(
                    work / "runs/p1-eos/severity-21k" / name), name
        elif step == "severity-21k-device":  # its passes beside the CPU-decoded ones of the same images
            assert_device_passes_match(work / "runs/cache-shards")
            device = rows_of(work / "runs/p1-eos/severity-21k-device/severity.csv")
            cpu = rows_of(work / "runs/p1-eos/severity-21k-shards/severity.csv")
            assert [list(row)[:3] for row in device] == [list(row)[:3] for row in cpu] and len(device) == len(cpu)
        elif step == "severity-plot":
            assert (work / "runs/p1-eos/severity.png").stat().st_size > 10_000
        elif step == "openood":  # every list's few images, each set a row per κ, the lists' hashes recorded
            rows = rows_of(work / "runs/openood-resnet50/sets.csv")
            tested = {"ssb_hard", "ninco", "inaturalist", "textures", "openimage_o"}
            assert {r["set"] for r in rows if r["group"] != "mean"} == tested
            assert {r["κ"] for r in rows} == {"softmax", "energy", "gen", "ash_b"}
            assert_finite([float(r["auroc"]) for r in rows], "openood")
            provenance = json.loads((work / "runs/openood-resnet50/provenance.json").read_text())
            hashes = {s["set"]: s["sha256"] for s in provenance["sets"]}  # the published lists', as shipped
            assert hashes == {name: BENCHMARKS["imagenet1k"].sets[name].sha256 for name in OPENOOD_SETS}
            assert all(s.get("subset of it") for s in provenance["sets"])  # the run says it read a subset
            assert provenance["presets"]["ash_b"]["parameters"] == {"percentile": 0.9}
        elif step == "openood-scores":  # the scores alone give the model's numbers back
            again, first = (rows_of(work / f"runs/{name}/sets.csv") for name in ("openood-rescored", "openood-resnet50"))
            assert [(r["κ"], r["set"]) for r in again] == [(r["κ"], r["set"]) for r in first]
            for a, b in zip(again, first, strict=True):
                for metric in ("auroc", "auroc low", "fpr@95tpr", "fpr@95tpr-openood", "aupr-in", "aurc"):
                    assert float(a[metric]) == pytest.approx(float(b[metric]), abs=1e-12), (a["set"], metric)
        elif step == "generate":
            for name in ("p1-shift", "p1-near-ood"):
                assert_finite(numbers(work / "data" / name / "manifest.csv", ("mi",)), name)
        elif step == "generated":
            detectors = work / "runs/p1-generated/detectors.csv"
            assert_finite(numbers(detectors, ("auroc",)), "generated")
            with open(detectors, newline="") as handle:
                rows = list(csv.DictReader(handle))
            assert {row["model"] for row in rows} == {"p1-eos-best", "resnet50", "ensemble2-p1-ensemble"}
            sets = {row["set"] for row in rows}  # the ID baseline and the label filter's rows
            assert {"id_test", "shift:p1-shift", "shift:p1-shift (label kept)"} <= sets, sets
            assert_finite(numbers(work / "runs/p1-generated/sets.csv", ("mean MI",)), "sets")
        elif step == "evg":
            assert_finite(numbers(work / "runs/p1-evg/results.csv", ("clean auroc", "worst-case auroc", "min rank")),
                          "evg")
        elif step == "report":
            card = json.loads((work / "runs/p1-report/report.json").read_text())
            rows = {(row["model"], row["kappa"]): row["cells"] for row in card["leaderboard"]["rows"]}
            assert len(rows) == 3 and {s["method"] for s in card["sections"]} == {"open_set", "severity", "generated",
                                                                                "cost"}
            costs = {(r["model"], r["κ"]) for r in next(s for s in card["sections"] if s["method"] == "cost")["tables"][0]["rows"]}
            assert costs >= set(rows)  # what each row's detector cost, beside it
            model = next(m for m, k in rows if k == "softmax")
            oscr = json.loads((work / "runs/p1-report/open_set" / model / "metrics.json").read_text())
            assert rows[(model, "softmax")]["oscr_auroc"]["value"] == oscr["scalars"]["unknowns/auroc"]
            cells = [c for found in rows.values() for c in found.values()]
            assert cells and all(c["low"] is not None and c["low"] <= c["high"] for c in cells)
            # the generated passes of step 5 and the severity passes of step 4 are reused from runs/cache
            assert any(entry["source"] == "cache" for entry in card["passes"])
            assert (work / "runs/p1-report/index.html").stat().st_size > 10_000

    # the same commands on the checkpoint of a user's own class folders
    mine = commands["oscr"].replace("runs/p1-eos", "runs/mine-eos")
    run(world, mine, EVALUATE)
    report = json.loads((work / "runs/mine-eos/checkpoints/best-oscr/metrics.json").read_text())
    # known: cat, dog; negatives: fox, owl; unknowns: bat, emu, yak; two val/ images each
    assert report["counts"] == {"known": 4, "negatives": 4, "unknowns": 6, "skipped_images": 0}
    assert_finite(list(report["scalars"].values()), "oscr of class folders")
    run(world, commands["severity"].replace("runs/p1-eos", "runs/mine-eos"), [*EVALUATE, "--data-arg", "estimation=3"])
    assert_finite(numbers(work / "runs/mine-eos/severity/severity.csv", ("ood-auroc",)), "severity of class folders")
    # 3 unknown classes against 2 known ones: M - G + 1 = 2 windows, so 2 levels, not 11 of which 9 repeat
    assert len(rows_of(work / "runs/mine-eos/severity/mine-eos-best_softmax_n2.csv")) == 2
    refused = subprocess.run([sys.executable, "evaluate.py", "generated", "--model", "runs/mine-eos/checkpoints/best.ckpt",
                              "--near-ood", "data/p1-near-ood", "--output-dir", "runs/mine-refused", *EVALUATE],
                             cwd=work, env=child_env(WANDB_MODE="offline"), capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "classes" in refused.stderr  # a set generated for P1's classes
    run(world, "python evaluate.py generated --model runs/mine-eos/checkpoints/best.ckpt --kappa softmax energy "
        "--real-shift sketches=/data/my-shift --real-ood ood=/data/ood --output-dir runs/mine-generated", EVALUATE)
    assert_finite(numbers(work / "runs/mine-generated/detectors.csv", ("auroc",)), "generated of class folders")
    with open(work / "runs/mine-generated/detectors.csv", newline="") as handle:
        sets = {row["set"] for row in csv.DictReader(handle)}
    assert {"id_test", "real_shift:sketches", "real:ood"} <= sets, sets
    run(world, "python evaluate.py evg --model runs/mine-eos/checkpoints/best.ckpt --kappa softmax "
        "--ood /data/ood --variation affine colour --output-dir runs/mine-evg", SHRINK["evg"])
    assert_finite(numbers(work / "runs/mine-evg/results.csv", ("worst-case auroc",)), "evg of class folders")

    # EvG with P1 classifiers on timm backbones of each family that timm sizes differently
    checkpoints = []
    for family, backbone in TIMM_FAMILIES.items():
        train = commands["train"].replace("runs/p1-eos", f"runs/p1-{family}").replace(
            " --config configs/severity/p1.yaml", "")
        run(world, train, [*CLASSIFIER, "--model.init_args.backbone", backbone])
        checkpoints.append(f"runs/p1-{family}/checkpoints/best.ckpt")
    run(world, f"python evaluate.py evg --model runs/p1-eos/checkpoints/best.ckpt {' '.join(checkpoints)} "
        "--kappa softmax energy --ood /data/ood --variation affine colour --output-dir runs/p1-evg-timm", SHRINK["evg"])
    with open(work / "runs/p1-evg-timm/results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["detector"].split("/")[0] for row in rows} == {
        "p1-eos-best", "p1-resnet-best", "p1-convnext-best", "p1-mobilenetv3-best"}
    assert_finite([float(row["worst-case auroc"]) for row in rows], "evg with timm backbones")


TWO_PROCESSES = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--no-progress-bar"]


def test_generate_and_evg_on_two_processes_and_resumed(world: dict[str, Path]) -> None:
    """The journey's ``generate`` and ``evg`` on 2 CPU processes (gloo) give the 1-process files; EvG's chains
    split into fewer batches than processes (a fresh run with one batch, a resumed run with one left)."""
    commands, work = journey_commands(), world["work"]
    assert (work / "runs/p1-generators/shift/last.ckpt").is_file(), "the docs' journey runs first"
    generate = commands["generate"].replace("data/p1-shift data/p1-near-ood", "data/p1-shift-2 data/p1-near-ood-2")
    run(world, generate, [*SHRINK["generate"][len(EVALUATE):], *TWO_PROCESSES])
    for name in ("p1-shift", "p1-near-ood"):
        with open(work / "data" / name / "manifest.csv", newline="") as one, \
                open(work / "data" / f"{name}-2" / "manifest.csv", newline="") as two:
            first, second = list(csv.DictReader(one)), list(csv.DictReader(two))
        assert [r["file"] for r in first] == [r["file"] for r in second] and len(first) == 4, name
        for a, b in zip(first, second, strict=True):
            for key in ("mi", "lpips"):
                if a.get(key):
                    # the ranks batch other images through the networks: equal to float32 rounding
                    assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-4, abs=1e-5), (name, key)

    # --batch-size 1: the passes over the fixed sets (ID test, standardisation set, seeds) run one image at a time,
    # so the 2 processes' shards give every image the arithmetic of the 1-process run (in batches, other images
    # share a convolution, whose float32 output may then differ in the last bits on some CPUs)
    evg = ("python evaluate.py evg --model runs/p1-eos/checkpoints/best.ckpt --kappa softmax energy --ood /data/ood "
           "--variation affineV2 colorV2 --chains 6 --steps 3 --trace-every 1 --seed 2 --batch-size 1")  # 224 px presets
    run(world, f"{evg} --chains-per-batch 4 --output-dir runs/evg-one", EVALUATE)
    run(world, f"{evg} --chains-per-batch 6 --output-dir runs/evg-two-fresh", TWO_PROCESSES)  # 1 batch, 2 processes
    run(world, f"{evg} --chains-per-batch 4 --output-dir runs/evg-two", TWO_PROCESSES)
    files = sorted((work / "runs/evg-two/chains").glob("*/chains-*.pt"))
    assert [p.name for p in files] == ["chains-0000000-0000003.pt", "chains-0000004-0000005.pt"]
    files[1].unlink()  # interrupted: one batch left for two processes
    (work / "runs/evg-two/report.json").unlink()
    output = run(world, f"{evg} --chains-per-batch 4 --output-dir runs/evg-two", TWO_PROCESSES)
    assert "chains 0-3 have results" in output and files[1].is_file()
    # the same batches of chains on 2 processes: the same bytes; other batches of chains (6 in one, not 4 + 2):
    # the detector scores other proposals together, and the convolution's blocking may move the last bit of an
    # energy or a score between batch sizes. A worst case may then swap places with an ID score it nearly ties:
    # each swap moves the worst-case AUROC by 1 / (ID images x chains) and a MinRank by 1. The seeds' clean
    # AUROC comes from the passes, the same in both runs.
    assert (work / "runs/evg-two/results.csv").read_text() == (work / "runs/evg-one/results.csv").read_text()
    with open(work / "runs/evg-one/results.csv", newline="") as one, \
            open(work / "runs/evg-two-fresh/results.csv", newline="") as fresh:
        pairs = list(zip(csv.DictReader(one), csv.DictReader(fresh), strict=True))
    for a, b in pairs:
        same = ("detector", "variation", "sampler", "chains", "id test images", "seed auroc")
        assert [a[k] for k in same] == [b[k] for k in same]
        swap = 1 / (int(a["id test images"]) * int(a["chains"]))
        assert float(b["worst-case auroc"]) == pytest.approx(float(a["worst-case auroc"]), abs=3 * swap + 1e-12)
        assert abs(float(b["min rank"]) - float(a["min rank"])) <= 3
    assert (work / "runs/evg-two-fresh/report.json").is_file() and (work / "runs/evg-two/report.json").is_file()
    assert_finite(numbers(work / "runs/evg-two/results.csv", ("worst-case auroc", "seed auroc")), "evg on 2 processes")
    with open(work / "runs/evg-two/results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["sampler"] for row in rows} == {"mh", "random", "eV1"}
    assert {row["preset"] for row in rows} == {"affineV2", "colorV2"}
