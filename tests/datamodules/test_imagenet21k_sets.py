"""ImageNet-OOD and SSB easy/hard read from an ImageNet-21k folder: the shipped lists against their manifest and
the published counts, a tiny ImageNet-21k tree (real wnids and file names) read as a folder and as a shard set,
the seeded per-class choice, missing images counted per set before any image is read, the WordNet check of the
classes against ImageNet-1k, the relation of SSB-hard to OpenOOD's ssb_hard list, and bad input."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import lzma
import os
import re
import shutil
import warnings
from collections import Counter
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import NonImageFilesWarning, imagenet21k_sets
from datamodules.imagenet21k_sets import (
    MANIFEST,
    SETS,
    WordNetClashError,
    WordNetClashWarning,
    imagenet21k_ood_sets,
    shipped_clashes,
)
from datamodules.protocols import imagenet1k_wnids
from datamodules.shards import folder_rows, write_shards
from tests.conftest import write_jpeg

DATA = Path(str(resources.files("datamodules").joinpath("data/imagenet21k_sets")))

# the tiny tree: classes of each list (ImageNet-OOD: every listed image of them)
IMAGENET_OOD = ["n02855089", "n04477387", "n12638218"]  # blower (clashes: a hypernym of hair dryer), treadmill, plum
SSB_EASY = ["n00005787", "n00006484"]  # benthos, cell
SSB_HARD = ["n00474568", "n02129837"]  # ball (the game), Bengal tiger (clashes: a hyponym of ID class tiger)
EASY_FILES = 5  # images per SSB-easy class
EXTRA = 999_999  # an SSB-hard file number that OpenOOD's list does not hold

# the tree's note in a class folder is counted where a test looks at it (test_the_sets_read_from_a_folder)
pytestmark = pytest.mark.filterwarnings("ignore::datamodules.images.NonImageFilesWarning")


def published_imagenet_ood() -> list[str]:
    return lzma.decompress((DATA / "imagenet_ood.txt.xz").read_bytes()).decode().splitlines()


def published_ssb(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO((DATA / f"{name}.csv").read_text())))


def openood_ssb_hard() -> list[str]:
    """OpenOOD v1.5's ssb_hard list (``ssb_hard/<wnid>/<file> -1``), read here from its xz file."""
    data = lzma.decompress(resources.files("datamodules").joinpath("data/openood/imagenet/test_ssb_hard.txt.xz")
                           .read_bytes())
    return [line.split(" ")[0].split("/", 1)[1] for line in data.decode().splitlines()]


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# -- the shipped lists ------------------------------------------------------------------------------------------


def test_the_manifest_records_the_published_lists():
    rows = {row["set"]: row for row in csv.DictReader(io.StringIO((DATA / "manifest.csv").read_text()))}
    assert list(rows) == list(SETS) == ["imagenet_ood", "ssb_easy_21k", "ssb_hard_21k"]
    imagenet_ood = lzma.decompress((DATA / "imagenet_ood.txt.xz").read_bytes())
    # the bytes are the authors' file: its git blob id is the one of imagenetood.txt at their commit
    assert git_blob(imagenet_ood) == rows["imagenet_ood"]["source_git_blob"] == "faae3ea7b5e4d938ca966a0c5cb9b1da60fc1471"
    assert hashlib.sha256(imagenet_ood).hexdigest() == rows["imagenet_ood"]["sha256"]
    assert (rows["imagenet_ood"]["repository"], rows["imagenet_ood"]["commit"], rows["imagenet_ood"]["path"]) == (
        "princetonvisualai/imagenetood", "a8ff81750902b73340163d4d7c643f528ce3bae7", "imagenetood.txt")
    for name in ("ssb_easy_21k", "ssb_hard_21k"):
        assert hashlib.sha256((DATA / f"{name}.csv").read_bytes()).hexdigest() == rows[name]["sha256"]
        assert (rows[name]["repository"], rows[name]["commit"], rows[name]["path"], rows[name]["source_git_blob"]) == (
            "sgvaze/osr_closed_set_all_you_need", "3258f058d4fd75cb88e23d0bd638d24b629e60d3",
            "data/open_set_splits/imagenet_osr_splits_winter21.pkl", "511397ffb0a4f3743bcf8051f74a50acbddba1a9")
    for name, row in rows.items():  # the module reads the same manifest
        assert dataclasses.asdict(MANIFEST[name]) == {**row, "lines": int(row["lines"]), "classes": int(row["classes"])}
        assert hashlib.sha256(imagenet21k_sets.list_bytes(name)).hexdigest() == row["sha256"]


def test_the_published_counts():
    # ImageNet-OOD (Yang et al., ICLR 2024): 31,802 images of 637 ImageNet-21k classes, 47 to 50 per class
    paths = published_imagenet_ood()
    assert len(paths) == len(set(paths)) == 31_802 == MANIFEST["imagenet_ood"].lines
    assert all(re.fullmatch(r"(n\d{8})/\1_\d+\.JPEG", path) for path in paths)
    per_class = Counter(path.split("/")[0] for path in paths)
    assert len(per_class) == 637 == MANIFEST["imagenet_ood"].classes
    assert Counter(per_class.values()) == {50: 599, 49: 30, 48: 6, 47: 2}
    assert imagenet21k_sets.imagenet_ood_paths() == paths
    # SSB (Vaze et al., ICLR 2022), the winter 2021 splits the authors' code loads: 1,000 easy and 980 hard classes,
    # disjoint, none an ImageNet-1k class, each with its nearest ImageNet-1k class
    easy, hard = published_ssb("ssb_easy_21k"), published_ssb("ssb_hard_21k")
    assert (len(easy), len(hard)) == (1000, 980) == (MANIFEST["ssb_easy_21k"].classes, MANIFEST["ssb_hard_21k"].classes)
    easy_wnids, hard_wnids = {r["wnid"] for r in easy}, {r["wnid"] for r in hard}
    assert len(easy_wnids) == 1000 and len(hard_wnids) == 980 and not easy_wnids & hard_wnids
    ids = set(imagenet1k_wnids())
    assert not (easy_wnids | hard_wnids | set(per_class)) & ids
    assert {r["closest_imagenet1k"] for r in easy + hard} <= ids
    assert imagenet21k_sets.ssb_classes("ssb_hard_21k") == {r["wnid"]: r["closest_imagenet1k"] for r in hard}
    # SSB-hard's classes are exactly those of OpenOOD v1.5's ssb_hard list, which holds 50 images of each
    assert Counter(path.split("/")[0] for path in openood_ssb_hard()) == {wnid: 50 for wnid in hard_wnids}
    assert imagenet21k_sets.set_classes("ssb_hard_21k") == sorted(hard_wnids)


def test_a_package_copy_that_is_not_the_manifests_is_refused(monkeypatch):
    imagenet21k_sets.list_bytes.cache_clear()
    wrong = dataclasses.replace(MANIFEST["ssb_easy_21k"], sha256="0" * 64)
    monkeypatch.setitem(MANIFEST, "ssb_easy_21k", wrong)
    try:
        with pytest.raises(RuntimeError, match=r"ssb_easy_21k: the package's copy datamodules/data/imagenet21k_sets/"
                                               r"ssb_easy_21k.csv \(1000 entries, sha256 ebef47.*reinstall"):
            imagenet21k_sets.list_bytes("ssb_easy_21k")
    finally:
        imagenet21k_sets.list_bytes.cache_clear()


def test_the_shipped_wordnet_clashes_hold_the_hand_checked_cases():
    table = list(csv.DictReader(io.StringIO((DATA / "wordnet_clashes.csv").read_text())))
    found = {(r["set"], r["wnid"]): (r["rule"], r["id_wnid"]) for r in table}
    assert found[("ssb_hard_21k", "n02129837")] == ("hyponym", "n02129604")  # Bengal tiger, a kind of tiger
    assert found[("ssb_hard_21k", "n02481103")] == ("hyponym", "n02480855")  # western lowland gorilla: gorilla
    assert found[("ssb_easy_21k", "n00015388")][0] == "hypernym"  # animal, above every ID animal
    assert found[("imagenet_ood", "n02855089")] == ("hypernym", "n03483316")  # blower, above hand blower
    assert ("ssb_hard_21k", "n00474568") not in found and ("imagenet_ood", "n04477387") not in found
    # per set, the counts (hand-tallied from the rules' output) and every wnid a class of its set
    assert Counter(r["set"] for r in table) == {"imagenet_ood": 47, "ssb_easy_21k": 184, "ssb_hard_21k": 237}
    assert Counter(r["rule"] for r in table if r["set"] == "ssb_hard_21k") == {
        "hyponym": 160, "hypernym": 32, "duplicate": 28, "ambiguous_manmade": 15, "part_whole": 2}
    for name in SETS:
        assert {r["wnid"] for r in table if r["set"] == name} <= set(imagenet21k_sets.set_classes(name))
        assert [(c.wnid, c.rule, c.id_wnid) for c in shipped_clashes(name)] == [
            (r["wnid"], r["rule"], r["id_wnid"]) for r in table if r["set"] == name]


@pytest.mark.slow
def test_the_shipped_wordnet_clashes_are_current():
    """The table is what WordNet 3.0 and the severity pool's rules give now (loads WordNet: a few seconds)."""
    assert imagenet21k_sets.clash_table() == (DATA / "wordnet_clashes.csv").read_text()
    clashes = imagenet21k_sets.wordnet_clashes(["n02129837", "n00474568", "n01440764"])
    assert [(c.wnid, c.rule, c.id_wnid) for c in clashes] == [("n01440764", "id_class", "n01440764"),
                                                              ("n02129837", "hyponym", "n02129604")]


# -- a tiny ImageNet-21k tree -----------------------------------------------------------------------------------


def make_tree(root: Path) -> dict[str, list[str]]:
    """``root/<wnid>/<wnid>_<n>.JPEG`` for the classes above: every ImageNet-OOD image of its classes, 5 images of
    each SSB-easy class (and a note that is no image), and of each SSB-hard class the first 3 of OpenOOD's file
    names and one more. Returns each set's expected paths, in the order the set reads them."""
    rng = np.random.default_rng(0)
    listed = [p for p in published_imagenet_ood() if p.split("/")[0] in IMAGENET_OOD]
    easy = [f"{w}/{w}_{n}.JPEG" for w in SSB_EASY for n in (3, 11, 12, 40, 107)]  # sorted by name: 107, 11, 12, 3, 40
    openood = openood_ssb_hard()
    hard = [p for w in SSB_HARD for p in ([q for q in openood if q.startswith(f"{w}/")][:3] + [f"{w}/{w}_{EXTRA}.JPEG"])]
    for path in listed + easy + hard:
        write_jpeg(root / path, rng, size=8)
    (root / SSB_EASY[0] / "README.txt").write_text("not an image")
    return {"imagenet_ood": listed, "ssb_easy_21k": sorted(easy, key=lambda p: p.split("/")),
            "ssb_hard_21k": sorted(hard, key=lambda p: p.split("/"))}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet21k")
    return root, make_tree(root)


CLASSES = {"imagenet_ood": IMAGENET_OOD, "ssb_easy_21k": SSB_EASY, "ssb_hard_21k": SSB_HARD}


def read(root, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sets = imagenet21k_ood_sets(None, root, classes=CLASSES, **options)
    return sets, caught


def test_the_sets_read_from_a_folder(tree):
    root, expected = tree
    sets, caught = read(root)
    assert list(sets) == list(SETS)
    for name, paths in expected.items():
        found = sets[name]
        assert found.role == "ood" and found.name == name
        assert found.info["paths"] == paths and len(found) == len(paths)
        assert found.labels().tolist() == [-2] * len(paths)
        classes = sorted(CLASSES[name])
        assert found.info["classes"] == classes and found.info["num_classes"] == len(classes)
        assert found.dataset.source_classes.tolist() == [classes.index(p.split("/")[0]) for p in paths]
        assert found.info["list_sha256"] == MANIFEST[name].sha256 and found.info["root"] == str(root)
        assert found.info["subset"] is True and found.info["subset_classes"] == len(classes)  # 2-3 classes of the list
        assert found.info["per_class"] is None and found.info["excluded_classes"] == []
        with Image.open(root / paths[1]) as written:
            assert np.array_equal(np.asarray(found.dataset[1].image), np.asarray(written.convert("RGB")))
    # ImageNet-OOD's images in its list's order, 50 + 47 + 47 of them
    assert len(sets["imagenet_ood"]) == 144
    assert sets["imagenet_ood"].info["list_source"] == ("princetonvisualai/imagenetood@a8ff817:imagenetood.txt")
    assert sets["ssb_hard_21k"].info["closest_imagenet1k"]["n02129837"] == "n02129604"
    # SSB-hard: 6 of its 8 images are images of OpenOOD's ssb_hard list, which is not this set
    assert sets["ssb_hard_21k"].info["openood_ssb_hard"] == {"shared": 6, "of": 49_000, "identical": False}
    assert "openood_ssb_hard" not in sets["ssb_easy_21k"].info
    # the note in a class folder is left out and counted; the clashing classes are reported, not dropped
    ignored = [str(w.message) for w in caught if issubclass(w.category, NonImageFilesWarning)]
    assert ignored == ["ignored 1 files in 1 class folders that are not images (by extension, any case: "
                       ".jpg .jpeg .png .bmp .gif .tif .tiff .webp .ppm .pgm): ssb_easy_21k n00005787 (1)"]
    clashing = [str(w.message) for w in caught if issubclass(w.category, WordNetClashWarning)]
    assert len(clashing) == 2
    assert clashing[0].startswith("imagenet_ood: 1 of its 3 classes clash with ImageNet-1k under the severity pool's "
                                  "WordNet rules (hypernym 1): n02855089 (blower) hypernym of n03483316 (hand blower)")
    assert clashing[1].startswith("ssb_hard_21k: 1 of its 2 classes clash with ImageNet-1k under the severity pool's "
                                  "WordNet rules (hyponym 1): n02129837 (Bengal tiger) hyponym of n02129604 (tiger)")
    assert sets["ssb_hard_21k"].info["wordnet_clashes"] == [{"wnid": "n02129837", "rule": "hyponym",
                                                            "id_wnid": "n02129604"}]
    assert sets["ssb_easy_21k"].info["wordnet_clashes"] == []


def test_a_shard_set_of_the_tree_reads_as_the_tree(tree, tmp_path):
    root, _ = tree
    with pytest.warns(NonImageFilesWarning):
        rows = folder_rows(root)
    shards = write_shards(root, rows, tmp_path / "shards", source={"kind": "folder", "root": str(root)}, workers=1,
                          log=lambda message: None)
    from_folder, _ = read(root)
    from_shards, _ = read(shards.root, per_class=None)
    for name in SETS:
        assert from_shards[name].dataset.in_shards(0)
        assert from_shards[name].info["paths"] == from_folder[name].info["paths"]
        assert from_shards[name].labels().tolist() == from_folder[name].labels().tolist()
        assert torch.equal(from_shards[name].dataset.source_classes, from_folder[name].dataset.source_classes)
        assert from_shards[name].fingerprint() == from_folder[name].fingerprint()
        assert np.array_equal(np.asarray(from_shards[name].dataset[2].image),
                              np.asarray(from_folder[name].dataset[2].image))
    # an image the shard set does not hold is missing there as in a folder
    del_root = tmp_path / "less"
    shutil.copytree(root, del_root)
    gone = tree[1]["imagenet_ood"][5]
    os.remove(del_root / gone)
    less = write_shards(del_root, folder_rows(del_root), tmp_path / "less_shards",
                        source={"kind": "folder", "root": str(del_root)}, workers=1, log=lambda message: None)
    with pytest.raises(FileNotFoundError, match=f"imagenet_ood: 1 of 144 images missing under {less.root} "
                                                f"\\(first: {gone}\\)"):
        imagenet21k_ood_sets("imagenet_ood", less.root, classes={"imagenet_ood": IMAGENET_OOD})


def test_per_class_chooses_seeded_images_of_each_class(tree):
    root, expected = tree
    sets, _ = read(root, per_class=3, seed=7)
    for name in SETS:
        chosen: list[str] = []
        short = {}
        for wnid in sorted(CLASSES[name]):
            paths = [p for p in expected[name] if p.split("/")[0] == wnid]
            if len(paths) > 3:  # the documented rule: numpy's generator seeded with (seed, the wnid's number)
                keep = np.sort(np.random.default_rng([7, int(wnid[1:])]).choice(len(paths), size=3, replace=False))
                paths = [paths[i] for i in keep]
            else:
                short[wnid] = len(paths)
            chosen += paths
        if name == "imagenet_ood":  # kept in the list's order
            chosen = [p for p in expected[name] if p in set(chosen)]
        assert sets[name].info["paths"] == chosen, name
        assert sets[name].info["classes_below_per_class"] == short
        assert sets[name].info["per_class"] == 3 and sets[name].info["seed"] == 7
        assert "up to 3" in sets[name].info["selection"]
    assert len(sets["imagenet_ood"]) == 9 and len(sets["ssb_easy_21k"]) == 6
    # a class's choice does not depend on the other classes read
    alone, _ = read(root, per_class=3, seed=7)
    only = imagenet21k_ood_sets("ssb_easy_21k", root, per_class=3, seed=7, classes={"ssb_easy_21k": SSB_EASY[:1]})
    assert only["ssb_easy_21k"].info["paths"] == [p for p in alone["ssb_easy_21k"].info["paths"]
                                                  if p.startswith(SSB_EASY[0])]
    # the same choice from the same seed, another from another
    again, _ = read(root, per_class=3, seed=7)
    other, _ = read(root, per_class=3, seed=8)
    assert again["ssb_easy_21k"].info["paths"] == sets["ssb_easy_21k"].info["paths"]
    assert other["imagenet_ood"].info["paths"] != sets["imagenet_ood"].info["paths"]


def test_missing_images_and_classes_are_counted_per_set_before_any_image_is_read(tree, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(tree[0], root)
    listed = tree[1]["imagenet_ood"]
    for path in (listed[40], listed[3], listed[100]):
        os.remove(root / path)
    shutil.rmtree(root / SSB_EASY[1])
    (root / SSB_HARD[0]).mkdir(exist_ok=True)
    for file in (root / SSB_HARD[0]).iterdir():
        file.unlink()  # a class folder without an image
    (root / listed[0]).write_bytes(b"not a JPEG")  # never decoded: the missing images are named first
    with pytest.raises(FileNotFoundError) as error:
        read(root)
    message = str(error.value)
    assert (f"imagenet_ood: 3 of 144 images missing under {root} (first: {listed[3]}, {listed[40]}, {listed[100]})"
            in message)
    assert (f"ssb_easy_21k: 1 of 2 classes missing under {root} (no class folder, or no image in it; first: "
            f"{SSB_EASY[1]})" in message)
    assert f"ssb_hard_21k: 1 of 2 classes missing under {root} (no class folder, or no image in it; first: " \
           f"{SSB_HARD[0]})" in message
    # a root that is no folder, and one root per set
    with pytest.raises(FileNotFoundError, match=f"ssb_easy_21k: its root {tmp_path / 'nowhere'} does not exist"):
        imagenet21k_ood_sets(["ssb_easy_21k"], tmp_path / "nowhere")
    sets = imagenet21k_ood_sets(["ssb_easy_21k", "imagenet_ood"], {"ssb_easy_21k": tree[0], "imagenet_ood": tree[0]},
                                classes={"ssb_easy_21k": SSB_EASY, "imagenet_ood": IMAGENET_OOD[1:]})
    assert list(sets) == ["imagenet_ood", "ssb_easy_21k"] and len(sets["imagenet_ood"]) == 94


def test_the_wordnet_check_fails_or_excludes_on_request(tree, tmp_path):
    root, expected = tree
    empty = tmp_path / "empty"
    empty.mkdir()
    # refused before any folder is listed (this root holds no image at all)
    with pytest.raises(WordNetClashError, match=r"ssb_hard_21k: 1 of its 2 classes clash .*n02129837 \(Bengal tiger\) "
                                                r"hyponym of n02129604 \(tiger\)"):
        imagenet21k_ood_sets("ssb_hard_21k", empty, classes={"ssb_hard_21k": SSB_HARD}, clashes="fail")
    with warnings.catch_warnings():
        warnings.simplefilter("error", WordNetClashWarning)  # nothing left to warn about
        sets = imagenet21k_ood_sets(["imagenet_ood", "ssb_hard_21k"], root, clashes="exclude",
                                    classes={"imagenet_ood": IMAGENET_OOD, "ssb_hard_21k": SSB_HARD})
    hard = sets["ssb_hard_21k"]
    assert hard.info["excluded_classes"] == ["n02129837"] and hard.info["classes"] == ["n00474568"]
    assert hard.info["paths"] == [p for p in expected["ssb_hard_21k"] if p.startswith("n00474568/")]
    assert hard.info["subset"] is True and hard.info["clash_policy"] == "exclude"
    assert hard.dataset.source_classes.tolist() == [0] * 4
    assert sets["imagenet_ood"].info["excluded_classes"] == ["n02855089"] and len(sets["imagenet_ood"]) == 94
    # a set with no clash among the classes read passes "fail"
    assert len(imagenet21k_ood_sets("ssb_easy_21k", root, classes={"ssb_easy_21k": SSB_EASY}, clashes="fail")
               ["ssb_easy_21k"]) == 10
    with pytest.raises(ValueError, match="every class read clashes with ImageNet-1k"):
        imagenet21k_ood_sets("ssb_hard_21k", root, classes={"ssb_hard_21k": ["n02129837"]}, clashes="exclude")


def test_ssb_hard_from_the_21k_p_validation_images_is_openood_s_list(tree, monkeypatch):
    """With every image of the classes read being one of OpenOOD's, and OpenOOD's list those images (here: its
    list cut to the classes the tree holds), the set says it is OpenOOD's list."""
    root, expected = tree
    held = frozenset(p for p in expected["ssb_hard_21k"] if str(EXTRA) not in p)
    monkeypatch.setattr(imagenet21k_sets, "_openood_ssb_hard", lambda: held)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WordNetClashWarning)
        full = imagenet21k_ood_sets("ssb_hard_21k", root, classes={"ssb_hard_21k": SSB_HARD})
    assert full["ssb_hard_21k"].info["openood_ssb_hard"] == {"shared": 6, "of": 6, "identical": False}
    monkeypatch.setattr(imagenet21k_sets, "_openood_ssb_hard", lambda: frozenset(expected["ssb_hard_21k"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WordNetClashWarning)
        full = imagenet21k_ood_sets("ssb_hard_21k", root, classes={"ssb_hard_21k": SSB_HARD})
    assert full["ssb_hard_21k"].info["openood_ssb_hard"] == {"shared": 8, "of": 8, "identical": True}


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"names": ["ssb_hard"]}, ValueError, r"\['ssb_hard'\] named; the sets: \['imagenet_ood', 'ssb_easy_21k'"),
    ({"names": []}, ValueError, "no set named"),
    ({"per_class": 0}, ValueError, "per_class must be a positive number of images or None .*got 0"),
    ({"per_class": True}, ValueError, "per_class must be a positive number .*got True"),
    ({"seed": 1.5}, ValueError, "seed must be an integer, got 1.5"),
    ({"clashes": "drop"}, ValueError, r"clashes must be one of \['warn', 'fail', 'exclude'\], got 'drop'"),
    ({"on_bad_image": "ignore"}, ValueError, "on_bad_image must be one of"),
    ({"names": "ssb_easy_21k", "classes": {"ssb_easy_21k": ["n01440764"]}}, ValueError,
     r"ssb_easy_21k: classes \['n01440764'\] named, which are not classes of the set \(1000 classes, "
     r"sgvaze/osr_closed_set_all_you_need@3258f05"),
    ({"classes": {"imagenet_ood": IMAGENET_OOD, "ninco": ["x"]}}, ValueError,
     r"classes names \['ninco'\], which are not among the sets read"),
])
def test_bad_input_is_named(tree, options, error, match):
    root, _ = tree
    arguments = {"names": "imagenet_ood", "classes": {"imagenet_ood": IMAGENET_OOD}, **options}
    with pytest.raises(error, match=match):
        imagenet21k_ood_sets(arguments.pop("names"), root, **arguments)


def test_bad_roots_are_named(tree):
    root, _ = tree
    with pytest.raises(ValueError, match=r"root names \['ssb_hard_21k'\], which are not among the sets read"):
        imagenet21k_ood_sets("imagenet_ood", {"imagenet_ood": root, "ssb_hard_21k": root})
    with pytest.raises(ValueError, match=r"no root for \['ssb_easy_21k'\]"):
        imagenet21k_ood_sets(["imagenet_ood", "ssb_easy_21k"], {"imagenet_ood": root})


def test_the_clashes_command_names_a_bad_output_folder_before_loading_wordnet(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    with pytest.raises(SystemExit, match=f"python -m datamodules.imagenet21k_sets clashes: .*{blocked}"):
        imagenet21k_sets.main(["clashes", "--out-dir", str(blocked / "out")])
    assert not (blocked.parent / "out").exists()
