import csv
import io
import os
from importlib import resources

import pytest

from datamodules.imagenet21k import (
    RULES,
    Relation,
    filter_ood_classes,
    imagenet21k_wnids,
    load_curated_relations,
    ood_classes,
    read_pool_file,
    sample_pool,
    write_class_csvs,
    write_pool_file,
)
from datamodules.protocols import imagenet1k_wnids


@pytest.fixture(scope="module")
def default_filter():
    return filter_ood_classes()


def removal(result, wnid):
    return next(((rule, id_wnid) for w, rule, id_wnid in result.removed if w == wnid), None)


def test_hierarchy_rules_leave_18838_classes(default_filter):
    counts = dict(default_filter.remaining_after)
    assert counts["timm ImageNet-21k"] == 21843
    assert counts["id_class"] == 21843 - 999  # one ImageNet-1k class is missing from timm's 21k list
    assert counts["hyponym"] == 18838  # after removing ID classes, their hypernyms and hyponyms
    steps = [left for _, left in default_filter.remaining_after]
    assert steps == sorted(steps, reverse=True)
    assert steps[-1] == len(default_filter.kept)


def test_named_cases(default_filter):
    assert "n02277268" in default_filter.kept  # viceroy: a biologically distinct look-alike of the monarch
    assert removal(default_filter, "n01792640") == ("duplicate", "n01514859")  # hen
    assert removal(default_filter, "n02131653") == ("hypernym", "n02132136")  # bear, above ID brown bear
    assert removal(default_filter, "n03145719") == ("ambiguous_manmade", "n03942813")  # cue ball
    assert removal(default_filter, "n03982232") == ("part_whole", "n03982430")  # pool ball / pool table
    assert removal(default_filter, "n02085620") == ("id_class", "n02085620")  # Chihuahua
    switched = filter_ood_classes(keep_biological_lookalikes=False, exclude_ambiguous_manmade=False)
    assert removal(switched, "n02277268") == ("biological_lookalike", "n02279972")
    assert "n03145719" in switched.kept


def test_wordnet_part_whole_links_are_used(default_filter):
    # WordNet links "keyboard" (piano keys) as a part of the ID class organ/accordion
    rule, id_wnid = removal(default_filter, "n03928814")
    assert rule == "part_whole" and id_wnid in set(imagenet1k_wnids())


def test_audit_trail_is_complete(default_filter):
    kept, removed = set(default_filter.kept), {w for w, _, _ in default_filter.removed}
    assert not kept & removed
    assert kept | removed == set(imagenet21k_wnids())
    ids = set(imagenet1k_wnids())
    assert all(rule in RULES and id_wnid in ids for _, rule, id_wnid in default_filter.removed)


def test_package_csvs_are_current(default_filter, tmp_path):
    kept_path, removed_path = write_class_csvs(default_filter, tmp_path)
    for path in (kept_path, removed_path):
        shipped = resources.files("datamodules").joinpath(f"data/{path.name}").read_text()
        assert shipped == path.read_text(), f"regenerate {path.name}: python -m datamodules.imagenet21k classes"
    assert ood_classes() == default_filter.kept
    rows = list(csv.DictReader(io.StringIO(removed_path.read_text())))
    assert rows[0].keys() == {"wnid", "rule", "id_wnid", "name"}
    hen = next(r for r in rows if r["wnid"] == "n01792640")
    assert hen["rule"] == "duplicate" and hen["name"].startswith("hen")


def test_curated_relations_are_valid():
    relations = load_curated_relations()
    assert all(r.reason.strip() for r in relations)
    assert len({(r.wnid, r.id_wnid) for r in relations}) == len(relations)
    assert {r.relation for r in relations} == {"part_whole", "duplicate", "ambiguous_manmade", "biological_lookalike"}


def test_bad_curated_rows(tmp_path):
    path = tmp_path / "curated.csv"
    path.write_text("wnid,id_wnid,relation,reason\nn1,n2,lookalike,x\n")
    with pytest.raises(ValueError, match=r"curated\.csv:2: relation 'lookalike'"):
        load_curated_relations(path)
    path.write_text("wnid,id_wnid,relation,reason\nn1,n2,duplicate,\n")
    with pytest.raises(ValueError, match="needs a reason"):
        load_curated_relations(path)
    with pytest.raises(ValueError, match="not ID classes"):
        filter_ood_classes(curated=[Relation("n03145719", "n99999999", "duplicate", "x")])


def make_pool_folder(root, counts):
    for wnid, count in counts.items():
        (root / wnid).mkdir(parents=True)
        for i in range(count):
            (root / wnid / f"{wnid}_{i}.JPEG").write_bytes(b"")
    return root


def test_pool_sampling(tmp_path):
    root = make_pool_folder(tmp_path / "in21k", {"n00000001": 250, "n00000002": 199, "n00000003": 200})
    sample = sample_pool(root, ["n00000001", "n00000002", "n00000003", "n00000004"], seed=0)
    assert sample.classes() == ["n00000001", "n00000003"]
    assert sample.dropped == [("n00000002", 199, "fewer than 200 images"), ("n00000004", 0, "no folder")]
    for wnid in sample.classes():
        rows = [r for r in sample.rows if r[1] == wnid]
        assert len(rows) == 200 and len({r[0] for r in rows}) == 200
        assert [r[2] for r in rows].count("estimation") == 150 and [r[2] for r in rows].count("test") == 50
    # seeded and reproducible; another seed gives another sample; a class's sample ignores the others
    assert sample_pool(root, ["n00000001", "n00000003"], seed=0).rows == sample.rows
    other = sample_pool(root, ["n00000001"], seed=1).rows
    assert {r[0] for r in other} != {r[0] for r in sample.rows if r[1] == "n00000001"}
    alone = sample_pool(root, ["n00000001"], seed=0).rows
    assert alone == [r for r in sample.rows if r[1] == "n00000001"]
    path = write_pool_file(sample, tmp_path / "pool.csv")
    assert read_pool_file(path) == sample.rows
    assert (tmp_path / "pool_dropped.csv").read_text().splitlines()[1] == "n00000002,199,fewer than 200 images"


def test_pool_sampling_counts_images_by_extension(tmp_path):
    from datamodules.images import NonImageFilesWarning

    root = make_pool_folder(tmp_path / "in21k", {"n00000001": 199, "n00000003": 200})
    for i in range(3):  # non-images do not make up the 200 a class needs, and are never sampled
        (root / "n00000001" / f"meta_{i}.xml").write_bytes(b"")
        (root / "n00000003" / f"meta_{i}.xml").write_bytes(b"")
    with pytest.warns(NonImageFilesWarning, match=r"ignored 6 files in 2 class folders .* n00000001 \(3\), n00000003 \(3\)"):
        sample = sample_pool(root, ["n00000001", "n00000003"], seed=0)
    assert sample.dropped == [("n00000001", 199, "fewer than 200 images")]
    assert sample.classes() == ["n00000003"] and all(r[0].endswith(".JPEG") for r in sample.rows)
    clean = make_pool_folder(tmp_path / "clean", {"n00000003": 200})
    assert sample.rows == sample_pool(clean, ["n00000003"], seed=0).rows


def test_bad_pool_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="datamodules.imagenet21k sample"):
        read_pool_file(tmp_path / "none.csv")
    (tmp_path / "bad.csv").write_text("path,wnid,split\na.JPEG,n1,train\n")
    with pytest.raises(ValueError, match=r"bad\.csv:2: split 'train'"):
        read_pool_file(tmp_path / "bad.csv")


def test_the_commands_name_bad_input_without_a_traceback(tmp_path, monkeypatch):
    from datamodules import imagenet21k

    def fails(*argv: str) -> str:
        with pytest.raises(SystemExit) as raised:
            imagenet21k.main(list(argv))
        return str(raised.value.code)

    (tmp_path / "file").write_text("in the way")
    assert fails("classes", "--out-dir", str(tmp_path / "file" / "lists")) == (
        f"python -m datamodules.imagenet21k classes: the class-list output goes to {tmp_path / 'file' / 'lists'}, "
        f"but {tmp_path / 'file'} is a file")  # before the WordNet filter runs
    assert fails("sample", "--root", str(tmp_path / "none"), "--out", str(tmp_path / "pool.csv")) == (
        f"python -m datamodules.imagenet21k sample: ImageNet-21k folder {tmp_path / 'none'} does not exist")
    (tmp_path / "in21k").mkdir()
    assert fails("sample", "--root", str(tmp_path / "in21k"), "--out", str(tmp_path / "pool.csv")).endswith(
        f"no pool class has enough images (18252 classes dropped: no folder); {tmp_path / 'pool.csv'} is not written")
    assert "is a folder: give a file name" in fails("sample", "--root", str(tmp_path / "in21k"), "--out", str(tmp_path))
    (tmp_path / "classes.csv").write_text("name\nfoo\n")
    assert fails("sample", "--root", str(tmp_path / "in21k"), "--out", str(tmp_path / "pool.csv"), "--classes",
                 str(tmp_path / "classes.csv")).endswith("expected a CSV with a 'wnid' column (imagenet21k_ood_classes.csv "
                                                         "of `python -m datamodules.imagenet21k classes`), got the header "
                                                         "['name']")
    assert "OOD classes file" in fails("sample", "--root", str(tmp_path / "in21k"), "--out", str(tmp_path / "p.csv"),
                                       "--classes", str(tmp_path / "absent.csv"))
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path / "in21k"))  # a non-root user's
    assert fails("sample", "--root", str(tmp_path / "in21k"), "--out", str(tmp_path / "in21k" / "pool.csv")).endswith(
        f"the pool file pool.csv goes to {tmp_path / 'in21k'}, but {tmp_path / 'in21k'} cannot be written")
    assert not list(tmp_path.rglob("*.csv*")) or sorted(p.name for p in tmp_path.rglob("*.csv*")) == ["classes.csv"]
