"""Shard sets (datamodules.shards, datamodules.shard_store): written once from ImageNet-shaped folders of real
wnids, read wherever the folder is read, with the same samples, order, labels and fingerprint; resumable and
verified writes; every bad input a clear error naming the set, the part and the sample; a set that serves only
the bytes it was written with (every read checked), its own files checked against each other, stale sets
refused or updated, one write at a time."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from PIL import Image
from torchvision.transforms import PILToTensor

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
from datamodules.shards import folder_rows, main, protocol_source, verify, write_shards
from openset_common.artefacts import files_fingerprint
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
    assert len(ShardSet.open(out)) == len(protocol_source(2, protocols)[0])
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
    # killed again after its parts; continued with --full, every kept part is read back: a corrupt image's part
    # is written again
    (out / SHARDS_FILE).unlink()
    (out / ".writing.json").write_text(_writing(tree, 5))
    corrupt_stored_image(shards, tree / folder_rows(tree)[2][0])  # part 00000
    write(tree, out, part_size=5)
    assert written == []
    (out / SHARDS_FILE).unlink()
    (out / ".writing.json").write_text(_writing(tree, 5))
    shards = write(tree, out, part_size=5, full=True)
    assert written == [0] and verify(shards, full=True) == []


def _writing(root: Path, part_size: int) -> str:
    from openset_common.artefacts import digest

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
    # an index that sends a path to another image's place: refused at load (its array's digest), naming
    # index.npz; and were it taken, refused by the sample's own path, not read as the wrong image
    other = write(tree, tmp_path / "other", part_size=5)
    index = dict(np.load(Path(other.root, INDEX_FILE)))
    index["positions"] = np.roll(index["positions"], 1)
    np.savez(Path(other.root, INDEX_FILE), **index)
    fresh = ShardSet(other.root, other.meta)
    with pytest.raises(ShardError, match=r"its index .*index\.npz is not the one written \(its array 'positions'"):
        fresh.positions([rows[0][0]], what="test")
    fresh._index = {name: index[name] for name in shard_store.LOOKUP_ARRAYS}
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
    # a set without a recorded listing (its shards.json signed again, as a write would): the slow path, the same
    # positions and fingerprint
    meta = json.loads(Path(shards.root, SHARDS_FILE).read_text())
    del meta["listing"]
    Path(shards.root, SHARDS_FILE).write_text(json.dumps(shard_store.signed(meta)))
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
    # a recorded run that does not match the manifest: refused at open once edited (shards.json's own digest);
    # signed again (as by a faulty write), verify names the run
    assert verify(shards) == []
    meta = json.loads(Path(out, SHARDS_FILE).read_text())
    meta["listing"]["sections"][1]["start"] = 8
    Path(out, SHARDS_FILE).write_text(json.dumps(meta))
    with pytest.raises(ShardError, match=r"shards\.json is not the one its write recorded"):
        ShardSet.open(out)
    Path(out, SHARDS_FILE).write_text(json.dumps(shard_store.signed(meta)))
    assert verify(ShardSet.open(out)) == ["shards.json: its recorded run 'test' [8, 14) does not match the manifest"]


# -- a set serves only the bytes it was written with ----------------------------------------------------------


def flip_16_bytes(data: bytes) -> bytes:
    """The JPEG with 16 bytes of its quantisation table changed (each to another non-zero value): the same size,
    still a valid JPEG that decodes without a warning, other pixels; nothing but a digest can tell."""
    at = data.index(b"\xff\xdb") + 5  # marker, length (2 bytes), precision and table number
    return data[:at] + bytes(b % 254 + 1 for b in data[at:at + 16]) + data[at + 16:]


def corrupt_stored_image(shards: ShardSet, source: Path) -> Path:
    """Flip 16 bytes of the stored copy of ``source`` inside its chunk (the chunk's size unchanged); its chunk."""
    data = source.read_bytes()
    for chunk in Path(shards.root, PARTS_DIR).glob("*/chunk-*.bin"):
        content = chunk.read_bytes()
        if data in content:
            at = content.index(data)
            chunk.write_bytes(content[:at] + flip_16_bytes(data) + content[at + len(data):])
            assert chunk.stat().st_size == len(content)
            return chunk
    raise AssertionError(f"{source} is in no chunk")


def test_sixteen_flipped_bytes_in_a_stored_image_are_refused_before_decoding(tree: Path, tmp_path: Path) -> None:
    from datamodules.batch import collate_samples
    from datamodules.device_decode import encoded_set
    from datamodules.images import without_unreadable

    shards = write(tree, tmp_path / "shards", part_size=5)
    rows = [(path, 0) for path, _ in folder_rows(tree)]
    victim = 7  # part 00001, sample 2
    corrupt_stored_image(shards, tree / rows[victim][0])
    # a decoder takes the flipped bytes silently, with other pixels: only the recorded digest tells
    flipped = Image.open(io.BytesIO(flip_16_bytes((tree / rows[victim][0]).read_bytes()))).convert("RGB")
    assert not np.array_equal(np.asarray(flipped), np.asarray(read_rgb_image(str(tree / rows[victim][0]))))
    where = rf"shard set {shards.root}, part 00001, sample 2 \({rows[victim][0]}\): its bytes are not the ones written"
    with pytest.raises(UnreadableImageError, match=rf"{rows[victim][0]} \(in the shard set {shards.root}\).*{where}"):
        ImageFileDataset(shards.root, rows)[victim]
    with pytest.raises(UnreadableImageError, match=where):  # the device-decode path reads the same checked bytes
        encoded_set(ImageFileDataset(shards.root, rows))[victim]
    # on_bad_image="skip": counted like any unreadable image
    skipping = ImageFileDataset(shards.root, rows, transform=PILToTensor(), on_bad_image="skip")
    with pytest.warns(RuntimeWarning, match=rf"skipping unreadable image .*{rows[victim][0]}"):
        batch = collate_samples([skipping[i] for i in range(5, 10)])
    assert batch.skipped.tolist() == [victim] and batch.indices.tolist() == [5, 6, 8, 9]
    with pytest.warns(RuntimeWarning, match=r"skipping 1 unreadable image\(s\) of 19"):
        kept = without_unreadable(skipping, what="the test set")
    assert [path for path, _ in kept.rows] == [path for path, _ in rows if path != rows[victim][0]]
    # plain verify checks sizes (unchanged here), --full every byte
    assert verify(shards) == []
    source = (tree / rows[victim][0]).read_bytes()
    stored, recorded = xxhash.xxh3_64_intdigest(flip_16_bytes(source)), xxhash.xxh3_64_intdigest(source)
    assert verify(shards, full=True) == [f"shard set {shards.root}, part 00001, sample 2 ({rows[victim][0]}): its "
                                         f"bytes are not the ones written (xxh3_64 {stored:016x}, recorded "
                                         f"{recorded:016x}): the part is corrupt; rewrite it with `python -m "
                                         f"datamodules.shards write --folder {tree} --out {shards.root} --update "
                                         "--full`"]
    # the write that refreshes it: the corrupt part alone is written again, then the set serves the files' bytes
    with pytest.raises(ValueError, match=r"out of date: it does not verify: .*part 00001, sample 2"):
        write(tree, tmp_path / "shards", part_size=5, full=True)
    written: list[int] = []
    real = shards_module._write_part
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards_module, "_write_part", lambda *job: written.append(job[2]) or real(*job))
        repaired = write(tree, tmp_path / "shards", part_size=5, update=True, full=True)
    assert written == [5]
    assert np.array_equal(np.asarray(ImageFileDataset(repaired.root, rows)[victim].image),
                          np.asarray(read_rgb_image(str(tree / rows[victim][0]))))


def scoring(cache: Path | None, dataset: ImageFileDataset):
    """The logits of the engine's cached pass over ``dataset`` (an OOD set named ``val``, as ``evg --ood
    <folder>/val`` names both a folder's and a shard set's) with a tiny model, and the passes it ran."""
    from datamodules.evaluation import EvaluationSet
    from evaluation_engine.scoring import ScoringPasses
    from tests.evaluation_engine.test_scoring import fake_runner, scoring_model

    passes = ScoringPasses(cache)
    outputs = passes.outputs(fake_runner(0, 1), scoring_model(size=2), EvaluationSet("val", "ood", dataset),
                             batch_size=4)
    return outputs["logits"], passes.passes


def test_a_corrupt_set_never_poisons_its_folders_cached_pass(tree: Path, tmp_path: Path) -> None:
    """A shard row fingerprints as its source file, so a pass over shards and one over the folder share a cache
    entry: only because every byte read from the set is the one written (the per-image digest)."""
    from datamodules.images import without_unreadable

    rows = [(path, -2) for path, _ in folder_rows(tree)]
    intact, _ = scoring(None, ImageFileDataset(str(tree), rows))
    whole = write(tree, tmp_path / "whole")
    corrupt = write(tree, tmp_path / "corrupt", part_size=5)
    corrupt_stored_image(corrupt, tree / rows[7][0])
    cache = tmp_path / "cache"
    with pytest.raises(UnreadableImageError, match=rf"part 00001, sample 2 \({rows[7][0]}\)"):
        scoring(cache, ImageFileDataset(corrupt.root, rows))
    with pytest.warns(RuntimeWarning, match="skipping 1 unreadable image"):  # skip: a set of 18 images, its own key
        skipped, ran = scoring(cache, without_unreadable(ImageFileDataset(corrupt.root, rows, on_bad_image="skip"),
                                                         what="val"))
    assert ran == 1 and torch.equal(skipped, intact[[i for i in range(len(rows)) if i != 7]])
    folder, ran = scoring(cache, ImageFileDataset(str(tree), rows))  # then the folder, with the same cache
    assert ran == 1 and torch.equal(folder, intact)
    shared, ran = scoring(cache, ImageFileDataset(whole.root, rows))  # an intact set shares the folder's entry
    assert ran == 0 and torch.equal(shared, intact)


def test_an_edited_shards_json_never_takes_another_sets_cached_pass(tree: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    other = tmp_path / "other"
    shutil.copytree(tree, other)
    rng = np.random.default_rng(7)
    for path, _ in folder_rows(other):  # the same paths, other pixels
        write_jpeg(other / path, rng)
    first, second = write(tree, tmp_path / "a"), write(other, tmp_path / "b")
    rows = [(path, -2) for path, _ in folder_rows(tree)]
    scoring(tmp_path / "cache", ImageFileDataset(first.root, rows))
    meta = json.loads(Path(second.root, SHARDS_FILE).read_text())
    assert meta["listing"]["paths_sha256"] == first.meta["listing"]["paths_sha256"]
    meta["listing"]["files_fingerprint"] = first.meta["listing"]["files_fingerprint"]  # b claims a's files
    Path(second.root, SHARDS_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
    refused = rf"shard set {second.root}: {second.root}/shards\.json is not the one its write recorded"
    with pytest.raises(ShardError, match=refused):
        scoring(tmp_path / "cache", ImageFileDataset(second.root, rows))
    assert main(["verify", second.root]) == 1
    assert "shards.json is not the one its write recorded" in capsys.readouterr().err


def test_a_shards_json_copied_whole_from_another_set_is_refused_at_open(tree: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """Set b's shards.json replaced by set a's, unedited (so it matches its own digest): b's rows are a's listing,
    so b would take a's fingerprint and a cache hit (which reads no image) would serve a's pass. Opening b
    compares the identity shards.json records with the one b's index.npz was written with, and refuses it; the
    write that rewrites b (from its own files) gives b's own pass."""
    other = tmp_path / "other"
    shutil.copytree(tree, other)
    rng = np.random.default_rng(7)
    for path, _ in folder_rows(other):  # the same paths, other bytes and modification times
        write_jpeg(other / path, rng)
    first, second = write(tree, tmp_path / "a"), write(other, tmp_path / "b")
    rows = [(path, -2) for path, _ in folder_rows(tree)]
    cache = tmp_path / "cache"
    mine, _ = scoring(None, ImageFileDataset(str(other), rows))
    theirs, ran = scoring(cache, ImageFileDataset(first.root, rows))
    assert ran == 1 and not torch.equal(mine, theirs)
    shutil.copyfile(Path(first.root, SHARDS_FILE), Path(second.root, SHARDS_FILE))
    refused = (rf"shard set {second.root}: {second.root}/shards\.json is not this set's: it was written with "
               rf"another index\.npz \(another set's shards\.json, copied\?; it records the identity "
               rf"{first.meta['identity'][:16]}, index\.npz {second.meta['identity'][:16]}\); write the set again "
               rf"from its own files with `python -m datamodules\.shards write <its source> --out {second.root} --update`")
    with pytest.raises(ShardError, match=refused):
        ShardSet.open(second.root)
    with pytest.raises(ShardError, match=refused):
        scoring(cache, ImageFileDataset(second.root, rows))
    assert main(["verify", second.root]) == 1
    assert "shards.json is not this set's" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"out of date: it does not verify: .*shards\.json is not this set's"):
        write(other, Path(second.root))
    rewritten = write(other, Path(second.root), update=True)
    ours, ran = scoring(cache, ImageFileDataset(rewritten.root, rows))
    assert ran == 1 and torch.equal(ours, mine)


def test_a_source_file_touched_since_is_named_by_its_modification_time(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    write(tree, out)
    path = folder_rows(tree)[4][0]
    info = (tree / path).stat()
    os.utime(tree / path, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))  # the same bytes, touched
    with pytest.raises(ValueError, match=rf"1 source file\(s\) changed since it was written: {path} \(modification "
                                         rf"time only, the same size of {info.st_size} bytes\)\. Write it again"):
        write(tree, out)


def test_a_deleted_manifest_row_is_named_not_an_image_dropped(tree: Path, tmp_path: Path) -> None:
    shards = write(tree, tmp_path / "shards")
    assert fit_folder_set(str(Path(shards.root, "train")), WNIDS).dataset.rows == \
        fit_folder_set(str(tree / "train"), WNIDS).dataset.rows
    manifest = Path(shards.root, "manifest.csv")
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(lines[:3] + lines[4:]))  # one training image's row
    opened = ShardSet.open(shards.root)
    opened._listing = None  # as a new process would list it
    with pytest.raises(ShardError, match=rf"its manifest {shards.root}/manifest\.csv is not the one written"):
        fit_folder_set(str(Path(shards.root, "train")), WNIDS)
    assert any("manifest.csv is not the one written" in problem for problem in verify(opened))


def test_a_missing_index_is_reported_by_verify_and_by_a_read(tree: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    shards = write(tree, tmp_path / "shards")
    Path(shards.root, INDEX_FILE).unlink()
    for full in ([], ["--full"]):
        assert main(["verify", shards.root, *full]) == 1
        captured = capsys.readouterr()
        assert f"cannot read its index {shards.root}/index.npz (FileNotFoundError" in captured.err
        assert captured.out.strip() == f"{shards.root}: 1 problem(s)"
    fresh = ShardSet(shards.root, shards.meta)  # a process that has not loaded the index yet
    with pytest.raises(ShardError, match=r"cannot read its index .*index\.npz"):
        fresh.read(0, folder_rows(tree)[0][0])


def test_a_stale_set_is_refused_naming_the_changed_files_and_update_refreshes_it(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "shards"
    write(tree, out, part_size=5)
    rows = [(path, 0) for path, _ in folder_rows(tree)]
    changed = tree / rows[12][0]  # part 00002
    write_jpeg(changed, np.random.default_rng(11), size=16)  # the same path, other bytes
    with pytest.raises(ValueError, match=rf"out of date: 1 source file\(s\) changed since it was written: "
                                         rf"{rows[12][0]} \(size \d+ -> {changed.stat().st_size} bytes, modified "
                                         r"since\)\. Write it again with --update"):
        write(tree, out, part_size=5)
    assert ShardSet.open(out).source  # a refused write leaves the set as it was
    written: list[int] = []
    real = shards_module._write_part

    def killed(*job):
        raise OSError("killed")

    monkeypatch.setattr(shards_module, "_write_part", killed)
    with pytest.raises(OSError, match="killed"):  # an update killed half-way: the set is an unfinished write
        write(tree, out, part_size=5, update=True)
    with pytest.raises(ShardError, match="a write that has not finished"):
        ShardSet.open(out)
    monkeypatch.setattr(shards_module, "_write_part", lambda *job: written.append(job[2]) or real(*job))
    refreshed = write(tree, out, part_size=5, update=True)
    assert written == [10]  # the part that holds the changed file, nothing else
    dataset = ImageFileDataset(refreshed.root, rows)
    assert np.array_equal(np.asarray(dataset[12].image), np.asarray(read_rgb_image(str(changed))))
    assert dataset.files_fingerprint() == files_fingerprint(tree, [path for path, _ in rows])
    assert verify(refreshed, full=True) == []
    # other bytes at the same size and modification time: only --full sees them
    touched = tree / rows[3][0]
    info = touched.stat()
    touched.write_bytes(flip_16_bytes(touched.read_bytes()))
    os.utime(touched, ns=(info.st_atime_ns, info.st_mtime_ns))
    written.clear()
    write(tree, out, part_size=5)
    assert written == []
    with pytest.raises(ValueError, match=rf"{rows[3][0]} \(other bytes, the same size and modification time\)"):
        write(tree, out, part_size=5, full=True)
    write(tree, out, part_size=5, full=True, update=True)
    assert written == [0] and ShardSet.open(out).read(3, rows[3][0]) == touched.read_bytes()


def test_a_second_concurrent_write_is_a_clear_error(tree: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from filelock import FileLock

    out = tmp_path / "shards"
    out.mkdir()
    command = ["write", "--folder", str(tree), "--out", str(out), "--workers", "1"]
    with FileLock(out / shards_module.LOCK_FILE):  # a write that is running
        with pytest.raises(ShardError, match=rf"{out}: another write into this folder is running"):
            write(tree, out)
        assert main(command) == 2  # the command: its message, not a traceback
        assert re.match(rf"python -m datamodules\.shards write: {out}: another write into this folder is running",
                        capsys.readouterr().err)
        assert list(out.iterdir()) == [out / shards_module.LOCK_FILE]
    assert main(command) == 0  # its lock file left behind does not make the folder "not empty"
    assert verify(ShardSet.open(out), full=True) == []


def test_a_set_of_the_older_format_is_refused_saying_how_to_rewrite_it(tree: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "shards"
    command = ["write", "--folder", str(tree), "--out", str(out), "--workers", "1", "--part-size", "5"]
    assert main(command) == 0
    # what the last format wrote: no digests of its files or of its images
    meta = json.loads(Path(out, SHARDS_FILE).read_text())
    meta = {**{k: v for k, v in meta.items() if k not in ("index_sha256", shard_store.SELF_DIGEST)},
            "format": "openset-shards/1"}
    Path(out, SHARDS_FILE).write_text(json.dumps(meta))
    for part in Path(out, PARTS_DIR).iterdir():
        lines = (part / "manifest.csv").read_text().splitlines()
        (part / "manifest.csv").write_text("".join(line.rpartition(",")[0] + "\n" for line in lines))
    rows = [(path, 0) for path, _ in folder_rows(tree)]
    with pytest.raises(ShardError, match=rf"is of format 'openset-shards/1', not '{shard_store.FORMAT}' .*rewrite it with "
                                         rf"`python -m datamodules\.shards write --folder {tree} --out {out} --update`"):
        ImageFileDataset(str(out), rows)
    with pytest.raises(ValueError, match=r"out of date: it does not verify: .*format 'openset-shards/1'.*--update"):
        write(tree, out)
    written: list[int] = []
    real = shards_module._write_part
    monkeypatch.setattr(shards_module, "_write_part", lambda *job: written.append(job[2]) or real(*job))
    assert main([*command, "--update"]) == 0
    assert written == [0, 5, 10, 15] and verify(ShardSet.open(out), full=True) == []
    assert np.array_equal(np.asarray(ImageFileDataset(str(out), rows)[4].image),
                          np.asarray(read_rgb_image(str(tree / rows[4][0]))))
    # what the format before this one wrote: shards.json and index.npz without the identity that binds them;
    # refused, and its update keeps every part (checked against its files), writing the set's own files anew
    meta = {k: v for k, v in json.loads(Path(out, SHARDS_FILE).read_text()).items() if k != shard_store.IDENTITY}
    Path(out, SHARDS_FILE).write_text(json.dumps(shard_store.signed({**meta, "format": "openset-shards/2"})))
    index = dict(np.load(Path(out, INDEX_FILE)))
    del index[shard_store.IDENTITY]
    np.savez(Path(out, INDEX_FILE), **index)
    with pytest.raises(ShardError, match=rf"is of format 'openset-shards/2', not '{shard_store.FORMAT}' \(a set whose "
                                         r"shards\.json is not bound to its index\.npz\): rewrite it with"):
        ShardSet.open(out)
    written.clear()
    assert main([*command, "--update"]) == 0
    assert written == [] and verify(ShardSet.open(out), full=True) == []


def test_a_write_again_takes_the_sets_own_part_size(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`write --update` as its refusal prints it (no --part-size) rewrites the part that changed, not the whole set
    in parts of the default size beside the old ones; another part size than the set's is refused."""
    out = tmp_path / "shards"
    assert main(["write", "--folder", str(tree), "--out", str(out), "--workers", "1", "--part-size", "5"]) == 0
    rows = folder_rows(tree)
    write_jpeg(tree / rows[12][0], np.random.default_rng(11), size=16)  # part 00002
    written: list[int] = []
    real = shards_module._write_part
    monkeypatch.setattr(shards_module, "_write_part", lambda *job: written.append(job[2]) or real(*job))
    command = ["write", "--folder", str(tree), "--out", str(out), "--workers", "1"]
    assert main([*command, "--part-size", "7", "--update"]) == 2
    assert f"{out} was written with parts of 5 images, not 7: give --part-size 5 or none" in capsys.readouterr().err
    assert main([*command, "--update"]) == 0
    assert written == [10] and sorted(p.name for p in (out / PARTS_DIR).iterdir()) == [
        "00000", "00001", "00002", "00003"]
    assert verify(ShardSet.open(out), full=True) == []


def test_the_commands_name_a_broken_set_without_a_traceback(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import evaluate
    import train

    out = tmp_path / "shards"
    write(tree, out)
    Path(out, INDEX_FILE).unlink()
    rows = [(path, 0) for path, _ in folder_rows(tree)][::-1]  # not a recorded run: looked up in the index

    def reads(*args, **kwargs):  # what a command's data set does first with the set
        ImageFileDataset(str(out), rows)

    monkeypatch.setattr(evaluate, "parse", reads)
    with pytest.raises(SystemExit, match=rf"evaluate\.py oscr: shard set {out}: cannot read its index"):
        evaluate.main(["oscr"])
    monkeypatch.setattr(train, "main", reads)
    with pytest.raises(SystemExit, match=rf"train\.py fit: shard set {out}: cannot read its index"):
        train.run(["fit"])
    # verify on a folder of images, not a set: says so and how to make one from it
    assert main(["verify", str(tree)]) == 1
    assert f"shard set {tree}: no shards.json there (not a shard set, a folder of files: to make one from a folder " \
           "of images, `python -m datamodules.shards write --folder <the image folder> --out <a new folder>`)" in \
           capsys.readouterr().err
