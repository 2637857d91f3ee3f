import numpy as np
import pytest
import torch

from datamodules.imagenet21k import sample_pool, write_pool_file
from datamodules.protocols import imagenet1k_wnids
from datamodules.severity import FashionSeverityDataModule, ImageNetSeverityDataModule
from datamodules.sources import load_digits_images
from datamodules.transforms import eval_transform
from tests.conftest import make_imagenet_folder, write_jpeg


def test_digits_are_real_and_upsampled():
    images, labels = load_digits_images()
    assert images.shape == (1797, 1, 28, 28) and 0 <= images.min() and images.max() <= 1
    assert np.bincount(labels).min() >= 174


def test_fashion_severity_data():
    data = FashionSeverityDataModule(estimation=100, test=50)
    data.setup()
    assert data.group_size == 4 and len(data.ood_classes) == 16
    assert len(data.ood_classes) - data.group_size + 1 == 13  # distinct severity windows
    assert len(data.dataset("id")) == 4000
    assert data.targets("id").bincount().tolist() == [1000] * 4
    assert data.targets("ood_estimation").bincount().tolist() == [100] * 16
    assert data.targets("ood_test").bincount().tolist() == [50] * 16
    # estimation and test images of a class are disjoint samples
    est = data.dataset("ood_estimation").images[data.targets("ood_estimation") == 12]
    test = data.dataset("ood_test").images[data.targets("ood_test") == 12]
    assert not any(torch.equal(a, b) for a in est[:20] for b in test)
    assert data.fingerprint("id") != data.fingerprint("ood_test")
    assert FashionSeverityDataModule(seed=1).fingerprint("ood_test") != data.fingerprint("ood_test")
    with pytest.raises(ValueError, match="fewer than estimation"):
        FashionSeverityDataModule(estimation=170, test=50).setup()


def test_imagenet_severity_data(tmp_path):
    id_root = make_imagenet_folder(tmp_path / "in1k", imagenet1k_wnids(), train=0, val=1) / "val"
    rng = np.random.default_rng(0)
    pool_root = tmp_path / "in21k"
    for wnid in ("n01792640", "n02277268"):
        for i in range(200):
            write_jpeg(pool_root / wnid / f"{wnid}_{i}.JPEG", rng, size=8)
    pool_file = write_pool_file(sample_pool(pool_root, ["n01792640", "n02277268"]), tmp_path / "pool.csv")
    transform = eval_transform(resize=36, crop=32)
    data = ImageNetSeverityDataModule(str(id_root), str(pool_root), str(pool_file), transform=transform, num_workers=0)
    data.setup()
    assert data.group_size == 1000
    assert len(data.dataset("id")) == 1000 and data.targets("id").tolist() == list(range(1000))
    assert data.ood_classes == ["n01792640", "n02277268"]
    assert data.ood_class_name(0).startswith("n01792640 hen")
    assert data.targets("ood_estimation").bincount().tolist() == [150, 150]
    assert data.dataset("ood_test")[0].image.shape == (3, 32, 32)
    other = ImageNetSeverityDataModule(str(id_root), str(pool_root), str(pool_file), transform=eval_transform())
    assert other.fingerprint("id") != data.fingerprint("id")  # the transform is part of the cache key
    missing = ImageNetSeverityDataModule(str(tmp_path / "none"), str(pool_root), str(pool_file))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing.setup()


def test_fashion_pool_holds_no_training_image():
    """OOD images must be images the model never saw: the demo trains on training images, negatives included."""
    from datamodules.sources import load_fashion_mnist

    data = FashionSeverityDataModule(estimation=100, test=50)
    data.setup()
    train_images, _ = load_fashion_mnist(data.data_dir, "train")
    test_images, test_classes = load_fashion_mnist(data.data_dir, "test")
    train_keys = {image.tobytes() for image in train_images}
    test_keys = {image.tobytes(): int(c) for image, c in zip(test_images, test_classes, strict=True)}
    for split in ("ood_estimation", "ood_test"):
        dataset, targets = data.dataset(split), data.targets(split)
        fashion = targets < 6  # the first 6 pool classes are Fashion-MNIST classes, then the digits
        pool = (dataset.images[fashion] * 255).round().to(torch.uint8).squeeze(1).numpy()
        keys = [image.tobytes() for image in pool]
        assert all(key in test_keys for key in keys)
        assert not any(key in train_keys for key in keys)
        pool_classes = [data.fashion_pool[int(t)] for t in targets[fashion]]
        assert [test_keys[key] for key in keys] == pool_classes
    # the negatives (Pullover, Dress, Sandal) are in the pool, marked as seen in training
    assert [data.ood_class_role(i) for i in range(6)] == ["as a negative", "as a negative", "no", "as a negative",
                                                          "no", "no"]
    assert data.ood_classes[:6] == ["fashion: Pullover", "fashion: Dress", "fashion: Coat", "fashion: Sandal",
                                    "fashion: Shirt", "fashion: Ankle boot"]
    without = FashionSeverityDataModule(include_negatives=False)
    assert without.ood_classes[:3] == ["fashion: Coat", "fashion: Shirt", "fashion: Ankle boot"]
    assert len(without.ood_classes) == 13 and not without.ood_roles


def test_protocol_severity_data(tiny_p2):
    from datamodules import ImageNetProtocolDataModule
    from datamodules.protocols import imagenet_protocol

    p2 = imagenet_protocol(2)
    data = ImageNetProtocolDataModule(root=str(tiny_p2), protocol=2, protocol_dir=str(tiny_p2 / "csv"),
                                      num_workers=0, resize_size=36, crop_size=32)
    severity = data.severity_data(estimation=3)
    severity.setup()
    assert severity.group_size == 30 and severity.id_classes == p2.known
    assert severity.ood_classes == p2.unknown and len(severity.ood_classes) == 55
    # ID: the known classes' val images; pool: unknown train images (estimation) and val images (test)
    assert severity.targets("id").tolist() == [c for c in range(30) for _ in range(2)]
    id_rows = severity.rows("id")
    assert all(path.startswith(f"val/{p2.known[label]}/") for path, label in id_rows)
    est_rows, test_rows = severity.rows("ood_estimation"), severity.rows("ood_test")
    assert severity.targets("ood_estimation").bincount().tolist() == [3] * 55
    assert all(path.startswith(f"train/{p2.unknown[label]}/") for path, label in est_rows)
    assert all(path.startswith(f"val/{p2.unknown[label]}/") for path, label in test_rows)
    assert len(test_rows) == 55 * 2
    assert severity.dataset("ood_test")[0].image.shape == (3, 32, 32)  # the protocol's eval transform
    # negatives never enter the pool: the model saw their images in training
    negatives = set(p2.negative)
    assert not any(path.split("/")[1] in negatives for path, _ in est_rows + test_rows + id_rows)
    with pytest.raises(ValueError, match="protocol 1 asked of a model trained on P2"):
        data.severity_data(protocol=1)
    with pytest.raises(ValueError, match="fewer than the 9 estimation images"):
        data.severity_data(estimation=9).setup()


def test_protocol_severity_data_with_an_imagenet21k_pool(tiny_p2, tmp_path):
    from datamodules.protocols import imagenet_protocol
    from datamodules.severity import ProtocolSeverityDataModule

    rng = np.random.default_rng(1)
    extra, inside = "n01792640", imagenet_protocol(2).unknown[0]
    rows = []
    for wnid in (extra, inside):
        for i, split in enumerate(("estimation", "estimation", "test")):
            write_jpeg(tmp_path / "in21k" / wnid / f"{i}.JPEG", rng, size=8)
            rows.append(f"{wnid}/{i}.JPEG,{wnid},{split}")
    (tmp_path / "pool.csv").write_text("path,wnid,split\n" + "\n".join(rows) + "\n")
    data = ProtocolSeverityDataModule(str(tiny_p2), protocol=2, estimation=2, pool_root=str(tmp_path / "in21k"),
                                      pool_file=str(tmp_path / "pool.csv"), num_workers=0)
    data.setup()
    assert data.ood_classes[-1] == extra and len(data.ood_classes) == 56  # the protocol class is not added twice
    assert data.targets("ood_estimation").bincount().tolist() == [2] * 56
    assert data.rows("ood_test")[-1] == (str((tmp_path / "in21k" / extra / "2.JPEG").resolve()), 55)
    assert data.dataset("ood_test")[len(data.rows("ood_test")) - 1].image.size == (8, 8)


def test_fingerprint_follows_the_image_files(tiny_p2):
    import os

    from datamodules.severity import ProtocolSeverityDataModule

    def fingerprints():
        data = ProtocolSeverityDataModule(str(tiny_p2), protocol=2, estimation=2, num_workers=0)
        return {split: data.fingerprint(split) for split in ("id", "ood_estimation", "ood_test")}

    before = fingerprints()
    assert fingerprints() == before  # deterministic
    data = ProtocolSeverityDataModule(str(tiny_p2), protocol=2, estimation=2, num_workers=0)
    path, _ = data.rows("ood_test")[0]
    write_jpeg(tiny_p2 / path, np.random.default_rng(99), size=16)  # re-encoded under the same name
    after = fingerprints()
    assert after["ood_test"] != before["ood_test"]
    assert after["id"] == before["id"] and after["ood_estimation"] == before["ood_estimation"]
    stat = os.stat(tiny_p2 / path)
    os.utime(tiny_p2 / path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    assert fingerprints()["ood_test"] != after["ood_test"]
