"""Shard sets (datamodules.shards, datamodules.shard_store): written once from ImageNet-shaped folders of real
wnids, read wherever the folder is read, with the same samples, order, labels and fingerprint; resumable and
verified writes; every bad input a clear error naming the set, the part and the sample."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import datamodules.images as images_module
import datamodules.shard_store as shard_store
import datamodules.shards as shards_module
from datamodules.evaluation import dataset_fingerprint, fit_folder_set
from datamodules.imagenet import ImageNetProtocolDataModule
from datamodules.images import (
    ImageFileDataset,
    UnreadableImageError,
    image_files,
    image_files_under,
    read_rgb_image,
    subfolders,
)
from datamodules.protocols import write_protocol_csvs
from datamodules.shard_store import INDEX_FILE, PARTS_DIR, SHARDS_FILE, ShardError, ShardSet
from datamodules.shards import folder_rows, main, protocol_rows_of, verify, write_shards
from openset_common import files_fingerprint
from tests.conftest import make_imagenet_folder, protocol_wnids, write_jpeg

WNIDS = ["n01440764", "n01443537", "n01484850"]


def write(root: Path, out: Path, **kwargs) -> ShardSet:
    return write_shards(root, folder_rows(root), out, source={"kind": "folder", "root": str(root)},
                        workers=kwargs.pop("workers", 1), log=lambda message: None, **kwargs)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = make_imagenet_folder(tmp_path / "ILSVRC2012", WNIDS, train=4, val=2)
    write_jpeg(root / "train" / WNIDS[0] / "a-b.JPEG", np.random.default_rng(1), size=20)  # sorts between parts
    return root


def pixels(dataset: ImageFileDataset) -> list[np.ndarray]:
    return [np.asarray(dataset[i].image) for i in range(len(dataset))]


def test_a_shard_set_reads_as_its_folder_did(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards", part_size=5, workers=2)
    assert len(shards) == 19 and [p["count"] for p in shards.parts] == [5, 5, 5, 4]
    rows = [(path, i % 3) for i, (path, _) in enumerate(folder_rows(tree))][::-1]  # any order, any labels
    folder, sharded = ImageFileDataset(str(tree), rows), ImageFileDataset(str(shards.root), rows)
    assert dataset_fingerprint(folder) == dataset_fingerprint(sharded)
    assert all(np.array_equal(a, b) for a, b in zip(pixels(folder), pixels(sharded), strict=True))
    assert [sharded[i].target for i in range(len(rows))] == [label for _, label in rows]
    # the listing of folders, from the manifest, is the file system's
    assert image_files_under(tree) == image_files_under(shards.root)
    assert subfolders(tree / "train") == subfolders(Path(shards.root, "train")) == WNIDS
    assert image_files(tree / "train" / WNIDS[0]) == image_files(Path(shards.root, "train", WNIDS[0]))
    # the bytes are the files' own, each with its sha256
    assert verify(shards, full=True) == []
    manifest = shards.manifest_rows()
    assert [row["path"] for row in manifest] == [path for path, _ in folder_rows(tree)]
    assert all(int(row["size"]) == (tree / row["path"]).stat().st_size for row in manifest)


def test_a_fit_set_and_a_protocol_datamodule_read_shards(tmp_path: Path) -> None:
    root = make_imagenet_folder(tmp_path / "ILSVRC2012", protocol_wnids(2), train=5, val=1)
    protocols = tmp_path / "protocols"
    write_protocol_csvs(root, 2, protocols)
    out = tmp_path / "p2"
    assert main(["write", "--protocol", "2", "--imagenet-root", str(root), "--protocol-dir", str(protocols),
                 "--out", str(out), "--workers", "1", "--part-size", "50"]) == 0
    assert len(ShardSet.open(out)) == len(protocol_rows_of(2, protocols))
    loaded = []
    for where in (root, out):
        data = ImageNetProtocolDataModule(root=str(where), protocol=2, protocol_dir=str(protocols), batch_size=4,
                                          num_workers=0)
        data.setup()
        loaded.append({split: getattr(data, f"{split}_set") for split in ("train", "val", "test")})
    for split in ("train", "val", "test"):
        folder, sharded = loaded[0][split].without_transform(), loaded[1][split].without_transform()
        assert folder.rows == sharded.rows and dataset_fingerprint(folder) == dataset_fingerprint(sharded)
        if split != "train":  # a recorded section of the set: no lookup (training drops the negatives' rows here)
            assert loaded[1][split]._run["name"] == split
        assert all(np.array_equal(a, b) for a, b in zip(pixels(folder)[:6], pixels(sharded)[:6], strict=True))
    # a model's fit set from a shard set of its training folders
    mine = make_imagenet_folder(tmp_path / "mine", WNIDS, train=3, val=1)
    whole = tmp_path / "whole"
    write(mine, whole)
    fit_folder, fit_shards = (fit_folder_set(str(r / "train"), WNIDS) for r in (mine, whole))
    assert fit_folder.dataset.rows == fit_shards.dataset.rows and fit_folder.fingerprint() == fit_shards.fingerprint()


def test_a_killed_write_continues_and_a_finished_one_is_verified_not_redone(tree: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "shards"
    write(tree, out, part_size=5)
    reference = (out / "manifest.csv").read_text()
    # killed after two parts, in the middle of the third: no shards.json, a half-written part
    for name in ("00002", "00003"):
        shutil.rmtree(out / PARTS_DIR / name)
    (out / SHARDS_FILE).unlink()
    (out / PARTS_DIR / "00002.partial").mkdir()
    (out / ".writing.json").write_text(_writing(tree, 5))  # what the killed write had recorded
    written: list[int] = []
    real = shards_module._write_part
    monkeypatch.setattr(shards_module, "_write_part", lambda *job: written.append(job[2]) or real(*job))
    with pytest.raises(ShardError, match="has not finished"):
        ShardSet.open(out)
    shards = write(tree, out, part_size=5)
    assert written == [10, 15] and (out / "manifest.csv").read_text() == reference and verify(shards, full=True) == []
    written.clear()
    write(tree, out, part_size=5)
    assert written == []


def _writing(root: Path, part_size: int) -> str:
    from openset_common import digest

    rows = folder_rows(root)
    return json.dumps({"kind": "folder", "root": str(root), "rows_digest": digest(rows), "count": len(rows),
                       "part_size": part_size})


def test_a_folder_holding_another_set_is_refused(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    first = write(tree, out)
    write_jpeg(tree / "val" / WNIDS[1] / "extra.JPEG", np.random.default_rng(2))
    with pytest.raises(ValueError, match=rf"holds another shard set .*{first.source['rows_digest'][:16]}.*this write is of 20 images"):
        write(tree, out)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no shard set"):
        write(tree, other)


def test_rows_of_another_protocol_are_refused_with_both_fingerprints(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards")
    rows = [("train/n09999999/n09999999_1.JPEG", 0), ("train/n01440764/n01440764_1.JPEG", 0)]
    with pytest.raises(ShardError, match=r"does not hold 1 of its 2 images .*fingerprint [0-9a-f]{16}.*"
                                         r"n09999999.*") as error:
        ImageFileDataset(shards.root, rows)
    assert shards.source["rows_digest"][:16] in str(error.value)


def test_a_corrupt_image_in_a_shard_is_named_and_on_bad_image_is_honoured(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards", part_size=5)
    rows = [(path, 0) for path, _ in folder_rows(tree)]
    victim = 7
    data = (tree / rows[victim][0]).read_bytes()
    part = Path(shards.root, PARTS_DIR, "00001")
    for chunk in part.glob("chunk-*.bin"):
        content = chunk.read_bytes()
        if data in content:
            at = content.index(data)
            chunk.write_bytes(content[:at] + b"\0" * 16 + content[at + 16:])
    with pytest.raises(UnreadableImageError, match=rf"{rows[victim][0]} \(in the shard set {shards.root}\)"):
        ImageFileDataset(shards.root, rows)[victim]
    with pytest.warns(RuntimeWarning, match="skipping unreadable image"):
        assert ImageFileDataset(shards.root, rows, on_bad_image="skip")[victim].image is None
    assert ImageFileDataset(shards.root, rows)[victim - 1].image is not None
    assert any(rows[victim][0] in problem for problem in verify(ShardSet.open(shards.root), full=True))


def test_a_truncated_part_and_a_manifest_that_does_not_match_are_named(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards", part_size=5)
    rows = [(path, 0) for path, _ in folder_rows(tree)]
    chunk = next(Path(shards.root, PARTS_DIR, "00003").glob("chunk-*.bin"))
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 3])
    assert any("truncated" in problem and "00003" in problem for problem in verify(shards))
    with pytest.raises(UnreadableImageError, match=r"part 00003, sample 3"):
        ImageFileDataset(shards.root, rows)[18]
    # an index that sends a path to another image's place: refused, not read as the wrong image
    other = write(tree, tmp_path / "other", part_size=5)
    index = dict(np.load(Path(other.root, INDEX_FILE)))
    index["positions"] = np.roll(index["positions"], 1)
    np.savez(Path(other.root, INDEX_FILE), **index)
    fresh = ShardSet(other.root, other.meta)
    with pytest.raises(ShardError, match="the manifest does not match its shards"):
        fresh.read(int(fresh.positions([rows[0][0]], what="test")[0]), rows[0][0])


def test_a_missing_shard_set_or_part_is_a_clear_error(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(ShardError, match=r"no shards.json there .*python -m datamodules.shards write"):
        ShardSet.open(tmp_path / "nowhere")
    shards = write(tree, tmp_path / "shards", part_size=5)
    shutil.rmtree(Path(shards.root, PARTS_DIR, "00000"))
    with warnings.catch_warnings(), pytest.raises(UnreadableImageError, match=r"part .*00000 is missing"):
        ImageFileDataset(shards.root, [(folder_rows(tree)[0][0], 0)])[0]


def test_absolute_rows_read_from_the_shard_set_they_lie_in(tree: Path, tmp_path: Path) -> None:
    """A severity set's rows: the root's images and, as absolute paths, a pool's (each from its own shards)."""
    pool = make_imagenet_folder(tmp_path / "pool", ["n00005787"], train=3, val=0)
    ours, theirs = write(tree, tmp_path / "ours"), write(pool, tmp_path / "theirs")
    local = [(path, 0) for path, _ in folder_rows(tree)[:4]]
    for root_of_pool, root in ((pool, tree), (Path(theirs.root), Path(ours.root))):
        rows = local + [(str(root_of_pool / path), 1) for path, _ in folder_rows(pool)]
        dataset = ImageFileDataset(str(root), rows)
        if root == tree:
            folder = dataset
        else:
            assert [s.root for s in dataset.stores] == [ours.root, theirs.root]
    assert dataset_fingerprint(folder) != dataset_fingerprint(dataset)  # the absolute paths differ ...
    assert [np.asarray(folder[i].image).tolist() for i in range(7)] == [np.asarray(dataset[i].image).tolist()
                                                                       for i in range(7)]
    relative = [(path, 1) for path, _ in folder_rows(pool)]  # ... the relative ones fingerprint alike
    assert dataset_fingerprint(ImageFileDataset(str(pool), relative)) == dataset_fingerprint(
        ImageFileDataset(theirs.root, relative))


@pytest.mark.parametrize("chunk", [4, 1 << 16])
def test_the_whole_set_in_manifest_order_needs_no_lookup(tree: Path, tmp_path: Path, chunk: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's scoring set is its shard set's whole listing: positions 0..n-1 and the fingerprint recorded
    at write time, equal to the files' own; any other rows (reordered, a subset, a set written before the
    listing was recorded) are looked up and stat'ed from the manifest, with the same results, in one chunk
    or in many (a chunk of 4 rows)."""
    monkeypatch.setattr(shard_store, "CHUNK", chunk)
    monkeypatch.setattr(images_module, "CHUNK", chunk)
    shards = write(tree, tmp_path / "shards", part_size=5)
    listing = [path for path, _ in folder_rows(tree)]
    whole = ImageFileDataset(shards.root, [(path, 0) for path in listing])
    assert whole._run["name"] == "" and whole.positions.tolist() == list(range(19))
    assert whole.files_fingerprint() == files_fingerprint(tree, listing) == shards.runs()[0]["files_fingerprint"]
    assert whole.stores[0]._index is None  # the index was never read
    for rows in (listing[::-1], listing[3:11], listing[:-1]):
        dataset = ImageFileDataset(shards.root, [(path, 0) for path in rows])
        assert dataset._run is None
        assert dataset.positions.tolist() == [listing.index(path) for path in rows]
        assert dataset.files_fingerprint() == files_fingerprint(tree, rows)
    # under a subfolder of the set the rows are relative to it: looked up, fingerprinted as that folder's files
    train = [path.removeprefix("train/") for path in listing if path.startswith("train/")]
    below = ImageFileDataset(str(Path(shards.root, "train")), [(path, 0) for path in train])
    assert below._run is None and below.files_fingerprint() == files_fingerprint(tree / "train", train)
    # a set written before it recorded its listing: the slow path, the same positions and fingerprint
    meta = json.loads(Path(shards.root, SHARDS_FILE).read_text())
    del meta["listing"]
    Path(shards.root, SHARDS_FILE).write_text(json.dumps(meta))
    older = ImageFileDataset(shards.root, [(path, 0) for path in listing])
    assert older._run is None and older.positions.tolist() == list(range(19))
    assert older.files_fingerprint() == files_fingerprint(tree, listing)
    # rows the set lacks, in two chunks: every one counted, the first named
    strays = ["train/n01440764/stray-1.JPEG", *listing[:5], "val/n01443537/stray-2.JPEG"]
    with pytest.raises(ShardError, match=r"does not hold 2 of its 7 images .*stray-1.JPEG', 'val/n01443537/stray-2"):
        ImageFileDataset(shards.root, [(path, 0) for path in strays])


def test_path_objects_as_rows_read_as_their_strings(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards", part_size=5)
    rows = [(path, i % 3) for i, (path, _) in enumerate(folder_rows(tree))]
    for root in (str(tree), shards.root):
        as_paths = ImageFileDataset(root, [(Path(path), label) for path, label in rows])
        as_text = ImageFileDataset(root, rows)
        assert as_paths.rows == as_text.rows and dataset_fingerprint(as_paths) == dataset_fingerprint(as_text)
        assert np.array_equal(np.asarray(as_paths[4].image), np.asarray(as_text[4].image))


def test_an_empty_shard_set_holds_no_row(tree: Path, tmp_path: Path) -> None:
    empty = write_shards(tree, [], tmp_path / "empty", source={"kind": "folder"}, workers=1, log=lambda message: None)
    assert len(empty) == 0
    with pytest.raises(ShardError, match=r"does not hold 1 of its 1 images .*first missing: \['train/n01440764/x.JPEG'\]"):
        empty.positions(["train/n01440764/x.JPEG"], what="test")


def test_each_split_of_a_pool_is_a_recorded_section(tmp_path: Path) -> None:
    """The severity data read the pool's estimation and test images: each a section the set recorded
    (estimation images first), so neither needs a lookup, with the positions and the fingerprint a lookup and
    the files give (a protocol's splits: test_a_fit_set_and_a_protocol_datamodule_read_shards)."""
    pool_root = make_imagenet_folder(tmp_path / "in21k", ["n00005787", "n00006024", "n00006484"], train=5, val=0) / "train"
    pool = [(f"{wnid}/{name}", wnid, "estimation" if i < 3 else "test") for wnid in sorted(p.name for p in pool_root.iterdir())
            for i, name in enumerate(image_files(pool_root / wnid))]  # interleaved by class, as sampled
    pool_file = tmp_path / "pool.csv"
    pool_file.write_text("path,wnid,split\n" + "".join(f"{p},{w},{s}\n" for p, w, s in pool))
    out = tmp_path / "pool-shards"
    assert main(["write", "--pool-file", str(pool_file), "--pool-root", str(pool_root), "--out", str(out),
                 "--workers", "1"]) == 0
    shards = ShardSet.open(out)
    assert [(r["name"], r["start"], r["count"]) for r in shards.runs()] == [("", 0, 15), ("estimation", 0, 9),
                                                                           ("test", 9, 6)]
    for split, start in (("estimation", 0), ("test", 9)):
        paths = [p for p, _, s in pool if s == split]
        dataset = ImageFileDataset(str(out), [(p, 0) for p in paths])
        assert dataset._run["name"] == split and dataset.positions.tolist() == list(range(start, start + len(paths)))
        assert dataset.files_fingerprint() == files_fingerprint(pool_root, paths)
        looked_up = ImageFileDataset(str(out), [(p, 0) for p in paths[::-1]])
        assert looked_up._run is None and looked_up.positions.tolist()[::-1] == dataset.positions.tolist()
        assert [np.asarray(dataset[i].image).tolist() for i in (0, len(paths) - 1)] == [
            np.asarray(read_rgb_image(str(pool_root / paths[i]))).tolist() for i in (0, len(paths) - 1)]
    # a recorded run that does not match the manifest: verify names it
    assert verify(shards) == []
    meta = json.loads(Path(out, SHARDS_FILE).read_text())
    meta["listing"]["sections"][1]["start"] = 8
    Path(out, SHARDS_FILE).write_text(json.dumps(meta))
    assert verify(ShardSet.open(out)) == ["shards.json: its recorded run 'test' [8, 14) does not match the manifest"]
