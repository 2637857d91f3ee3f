import gzip

import numpy as np
import pytest
import torch

from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule, open_set_labels
from datamodules.sources import DEMO_KNOWN, load_fashion_mnist, read_idx


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trip(tmp_path):
    images = np.arange(2 * 3 * 4).reshape(2, 3, 4).astype(np.uint8)
    write_idx(tmp_path / "x.gz", images)
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), images)
    with gzip.open(tmp_path / "bad.gz", "wb") as handle:
        handle.write(b"\x00\x00\x0d\x01\x00\x00\x00\x02xx")
    with pytest.raises(ValueError, match=r"bad\.gz is not an IDX file"):
        read_idx(tmp_path / "bad.gz")
    with gzip.open(tmp_path / "short.gz", "wb") as handle:
        handle.write(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"abc")
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short.gz")


def test_label_mapping():
    classes = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(open_set_labels(classes, (0, 1, 7, 8), (2, 3, 5), (4, 6, 9)), [0, 1, -1, -1, -2, -1, -2, 2, 3, -2])


def test_real_fashion_mnist_protocol():
    images, classes = load_fashion_mnist("/usr/share/datasets/fashion-mnist", "train")
    assert images.shape == (60000, 28, 28) and np.bincount(classes).tolist() == [6000] * 10
    dm = FashionMNISTOpenSetDataModule()
    dm.setup("fit")
    dm.setup("test")
    # 7 known+negative classes x 6000 images, 80/20 stratified
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (33600, 8400, 10000)
    assert dm.train_class_counts().tolist() == [4800] * 4
    test_labels = dm.test_set.labels
    assert [(test_labels == k).sum().item() for k in (0, 1, 2, 3, -1, -2)] == [1000] * 4 + [3000, 3000]
    sample = dm.train_set[0]
    assert sample.image.shape == (1, 28, 28) and 0 <= sample.image.min() and sample.image.max() <= 1
    assert dm.class_names == ["T-shirt/top", "Trouser", "Sneaker", "Bag"]
    assert tuple(dm.known) == DEMO_KNOWN
    excluded = FashionMNISTOpenSetDataModule(train_negatives="exclude", max_train_per_class=100)
    excluded.setup("fit")
    assert len(excluded.train_set) == 4 * 80 and bool((excluded.train_set.labels >= 0).all())
    background = FashionMNISTOpenSetDataModule(train_negatives="background", max_train_per_class=100)
    background.setup("fit")
    targets = torch.tensor([background.train_set[i].target for i in range(len(background.train_set))])
    assert int((targets == 4).sum()) == 3 * 80 and background.train_class_counts().tolist() == [80] * 4 + [240]


def test_bad_roles_rejected():
    with pytest.raises(ValueError, match="disjoint"):
        FashionMNISTOpenSetDataModule(known=(0, 1), negative=(1, 2))
    with pytest.raises(ValueError, match="train_negatives"):
        FashionMNISTOpenSetDataModule(train_negatives="drop")


def test_a_wrong_folder_says_where_the_files_must_be_and_downloads_nothing(tmp_path):
    from datamodules.sources import FashionMNISTMissing

    folder = tmp_path / "nowhere"
    data = FashionMNISTOpenSetDataModule(data_dir=str(folder), download_dir=str(tmp_path / "download"))
    with pytest.raises(FashionMNISTMissing, match=r"not found in .*nowhere.*train-images-idx3-ubyte.gz.*"
                                                  r"dataset-fashion-mnist.*download=True"):
        data.prepare_data()
    with pytest.raises(FashionMNISTMissing, match="nowhere"):
        data.setup("fit")
    assert not folder.exists() and not (tmp_path / "download").exists()  # nothing made behind the user's back


def test_decoded_files_are_read_once_per_process_and_cannot_be_changed():
    first, _ = load_fashion_mnist("/usr/share/datasets/fashion-mnist", "test")
    again, _ = load_fashion_mnist("/usr/share/datasets/fashion-mnist", "test")
    assert again is first  # the same decoded array: the file was not read again
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0, 0] = 1
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_fashion_mnist("/usr/share/datasets/fashion-mnist", "validation")
