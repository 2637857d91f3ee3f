"""The ImageNet path of `evaluate.py severity` end to end: ImageNet-shaped folders with real wnids, tiny
JPEGs, a tiny randomly initialised timm model whose eval transform comes from its own data config."""

import csv

import numpy as np
import pytest

import evaluate
from datamodules.imagenet21k import ood_classes
from datamodules.protocols import imagenet1k_wnids
from tests.conftest import make_imagenet_folder, write_jpeg

pytestmark = pytest.mark.journey


def test_imagenet_severity_end_to_end(tmp_path):
    id_root = make_imagenet_folder(tmp_path / "in1k", imagenet1k_wnids(), train=0, val=1) / "val"
    rng = np.random.default_rng(0)
    pool = ood_classes()[:1010]  # real pool classes; 2 estimation + 1 test image each (the real split is 150/50)
    rows = []
    for wnid in pool:
        for i, split in enumerate(("estimation", "estimation", "test")):
            write_jpeg(tmp_path / "in21k" / wnid / f"{wnid}_{i}.JPEG", rng, size=8)
            rows.append((f"{wnid}/{wnid}_{i}.JPEG", wnid, split))
    with open(tmp_path / "pool.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([("path", "wnid", "split"), *rows])
    arguments = [
        "severity", "--model", "timm:test_resnet", "--random-weights", "--kappa", "softmax", "entropy",
        "--data", "imagenet", "--data-arg", f"id_root={id_root}", "--data-arg", f"pool_root={tmp_path / 'in21k'}",
        "--data-arg", f"pool_file={tmp_path / 'pool.csv'}", "--num-workers", "0", "--batch-size", "200",
        "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "out"), "--accelerator", "cpu",
        "--devices", "1", "--wandb-mode", "disabled", "--no-progress-bar",
    ]
    tables = evaluate.main(arguments)
    assert len(tables["softmax"]) == 11
    with open(tmp_path / "out" / "levels_test_resnet_softmax.csv") as handle:
        levels = list(csv.DictReader(handle))
    # 1010 pool classes, G = 1000: 11 windows, every level holds 1000 distinct classes named by wnid
    assert len(levels) == 11 * 1000
    level0 = {r["class"].split()[0] for r in levels if r["severity level"] == "0"}
    level10 = {r["class"].split()[0] for r in levels if r["severity level"] == "10"}
    assert len(level0) == 1000 and level0 <= set(pool) and level0 != level10
    assert all(0 <= r["ood-auroc"] <= 1 and r["id-acc"] <= 1 for r in tables["entropy"])
    cached = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache").glob("*.pt"))
    assert cached == ["test_resnet-id_test-logits", "test_resnet-ood_estimation-logits", "test_resnet-ood_test-logits"]
    # a model with another head (1001 classes) is refused with both numbers, not scored
    with pytest.raises(SystemExit, match="outputs 1001 logits but the severity data has 1000 ID classes"):
        evaluate.main([*arguments, "--model-arg", "num_classes=1001"])
