import numpy as np
import pytest
import torch

from datamodules.imagenet21k import sample_pool, write_pool_file
from datamodules.protocols import imagenet1k_wnids
from datamodules.severity import FashionSeverityData, ImageNetSeverityData, ProtocolSeverityData
from datamodules.sources import load_digits_images
from tests.conftest import make_imagenet_folder, write_jpeg


def test_digits_are_real_and_upsampled():
    images, labels = load_digits_images()
    assert images.shape == (1797, 1, 28, 28) and 0 <= images.min() and images.max() <= 1
    assert np.bincount(labels).min() >= 174


def test_fashion_severity_data():
    data = FashionSeverityData(estimation=100, test=50)
    data.setup()
    assert data.group_size == 4 and len(data.ood_classes) == 16
    assert len(data.ood_classes) - data.group_size + 1 == 13  # distinct severity windows
    assert {s.name: s.role for s in data} == {"id_test": "id_test", "ood_estimation": "estimation", "ood_test": "ood"}
    assert len(data["id_test"]) == 4000 and data.classes == ["T-shirt/top", "Trouser", "Sneaker", "Bag"]
    assert data["id_test"].labels().bincount().tolist() == [1000] * 4
    assert data["ood_estimation"].labels().bincount().tolist() == [100] * 16
    assert data["ood_test"].labels().bincount().tolist() == [50] * 16
    # estimation and test images of a class are disjoint samples
    est = data["ood_estimation"].dataset.images[data["ood_estimation"].labels() == 12]
    test = data["ood_test"].dataset.images[data["ood_test"].labels() == 12]
    assert not any(torch.equal(a, b) for a in est[:20] for b in test)
    assert data["id_test"].fingerprint() != data["ood_test"].fingerprint()
    # the fingerprint is of the images themselves (another sample, another fingerprint), not of a folder name
    assert FashionSeverityData(seed=1)["ood_test"].fingerprint() != data["ood_test"].fingerprint()
    assert FashionSeverityData(estimation=100, test=50)["ood_test"].fingerprint() == data["ood_test"].fingerprint()
    with pytest.raises(ValueError, match="fewer than estimation"):
        FashionSeverityData(estimation=170, test=50).setup()


def test_imagenet_severity_data(tmp_path):
    id_root = make_imagenet_folder(tmp_path / "in1k", imagenet1k_wnids(), train=0, val=1) / "val"
    rng = np.random.default_rng(0)
    pool_root = tmp_path / "in21k"
    for wnid in ("n01792640", "n02277268"):
        for i in range(200):
            write_jpeg(pool_root / wnid / f"{wnid}_{i}.JPEG", rng, size=8)
    pool_file = write_pool_file(sample_pool(pool_root, ["n01792640", "n02277268"]), tmp_path / "pool.csv")
    data = ImageNetSeverityData(str(id_root), str(pool_root), str(pool_file), num_workers=0)
    data.setup()
    assert data.group_size == 1000 and data.classes == imagenet1k_wnids()
    assert len(data["id_test"]) == 1000 and data["id_test"].labels().tolist() == list(range(1000))
    assert data.ood_classes == ["n01792640", "n02277268"]
    assert data.ood_class_name(0).startswith("n01792640 hen")
    assert data["ood_estimation"].labels().bincount().tolist() == [150, 150]
    assert data["ood_test"].dataset[0].image.size == (8, 8)  # raw images: the model's own transform comes later
    missing = ImageNetSeverityData(str(tmp_path / "none"), str(pool_root), str(pool_file))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing.setup()
    (tmp_path / "empty.csv").write_text("path,wnid,split\n")
    with pytest.raises(ValueError, match="empty.csv lists no image"):  # refused before any pass
        ImageNetSeverityData(str(id_root), str(pool_root), str(tmp_path / "empty.csv")).setup()
    for path in (id_root / "n01440764").iterdir():  # an ID class without images: named, not left out
        path.unlink()
    with pytest.raises(ValueError, match=r"1 class folders under .*in1k/val hold no image: n01440764 \(known class\)$"):
        ImageNetSeverityData(str(id_root), str(pool_root), str(pool_file)).setup()


def test_fashion_pool_holds_no_training_image():
    """OOD images must be images the model never saw: the demo trains on training images, negatives included."""
    from datamodules.sources import load_fashion_mnist

    data = FashionSeverityData(estimation=100, test=50)
    data.setup()
    train_images, _ = load_fashion_mnist(data.data_dir, "train")
    test_images, test_classes = load_fashion_mnist(data.data_dir, "test")
    train_keys = {image.tobytes() for image in train_images}
    test_keys = {image.tobytes(): int(c) for image, c in zip(test_images, test_classes, strict=True)}
    for split in ("ood_estimation", "ood_test"):
        dataset, targets = data[split].dataset, data[split].labels()
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
    without = FashionSeverityData(include_negatives=False)
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
    assert severity.group_size == 30 and severity.classes == p2.known
    assert severity.ood_classes == p2.unknown and len(severity.ood_classes) == 55
    # ID: the known classes' val images; pool: unknown train images (estimation) and val images (test)
    assert severity["id_test"].labels().tolist() == [c for c in range(30) for _ in range(2)]
    id_rows = severity["id_test"].dataset.rows
    assert all(path.startswith(f"val/{p2.known[label]}/") for path, label in id_rows)
    est_rows, test_rows = severity["ood_estimation"].dataset.rows, severity["ood_test"].dataset.rows
    assert severity["ood_estimation"].labels().bincount().tolist() == [3] * 55
    assert all(path.startswith(f"train/{p2.unknown[label]}/") for path, label in est_rows)
    assert all(path.startswith(f"val/{p2.unknown[label]}/") for path, label in test_rows)
    assert len(test_rows) == 55 * 2
    assert severity["ood_test"].dataset[0].image.size == (12, 12)  # raw: the model applies the protocol's transform
    # negatives never enter the pool: the model saw their images in training
    negatives = set(p2.negative)
    assert not any(path.split("/")[1] in negatives for path, _ in est_rows + test_rows + id_rows)
    with pytest.raises(ValueError, match="protocol 1 asked of a model trained on P2"):
        data.severity_data(protocol=1)
    with pytest.raises(ValueError, match="fewer than the 9 estimation images"):
        data.severity_data(estimation=9).setup()


def test_protocol_severity_data_with_an_imagenet21k_pool(tiny_p2, tmp_path):
    from datamodules.protocols import imagenet_protocol

    rng = np.random.default_rng(1)
    extra, inside = "n01792640", imagenet_protocol(2).unknown[0]
    rows = []
    for wnid in (extra, inside):
        for i, split in enumerate(("estimation", "estimation", "test")):
            write_jpeg(tmp_path / "in21k" / wnid / f"{i}.JPEG", rng, size=8)
            rows.append(f"{wnid}/{i}.JPEG,{wnid},{split}")
    (tmp_path / "pool.csv").write_text("path,wnid,split\n" + "\n".join(rows) + "\n")
    data = ProtocolSeverityData(str(tiny_p2), protocol=2, estimation=2, pool_root=str(tmp_path / "in21k"),
                                pool_file=str(tmp_path / "pool.csv"), num_workers=0)
    data.setup()
    assert data.ood_classes[-1] == extra and len(data.ood_classes) == 56  # the protocol class is not added twice
    assert data["ood_estimation"].labels().bincount().tolist() == [2] * 56
    test_rows = data["ood_test"].dataset.rows
    assert test_rows[-1] == (str((tmp_path / "in21k" / extra / "2.JPEG").resolve()), 55)
    assert data["ood_test"].dataset[len(test_rows) - 1].image.size == (8, 8)


def test_fingerprint_follows_the_image_files(tiny_p2):
    import os

    def fingerprints():
        data = ProtocolSeverityData(str(tiny_p2), protocol=2, estimation=2, num_workers=0)
        return {s.name: s.fingerprint() for s in data}

    before = fingerprints()
    assert fingerprints() == before  # deterministic
    data = ProtocolSeverityData(str(tiny_p2), protocol=2, estimation=2, num_workers=0)
    path, _ = data["ood_test"].dataset.rows[0]
    write_jpeg(tiny_p2 / path, np.random.default_rng(99), size=16)  # re-encoded under the same name
    after = fingerprints()
    assert after["ood_test"] != before["ood_test"]
    assert after["id_test"] == before["id_test"] and after["ood_estimation"] == before["ood_estimation"]
    stat = os.stat(tiny_p2 / path)
    os.utime(tiny_p2 / path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    assert fingerprints()["ood_test"] != after["ood_test"]


def folder_severity(root, **kwargs):
    from datamodules.severity import FolderSeverityData

    data = FolderSeverityData(root=str(root), known=["cat", "dog"], unknown=["owl", "yak"], negative=["fox"],
                              estimation=3, num_workers=0, **kwargs)
    data.setup()
    return data


def test_a_class_without_images_is_refused_not_left_out(tmp_path):
    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox", "owl", "yak"], train=4, val=2)
    assert folder_severity(root)["id_test"].labels().tolist() == [0, 0, 1, 1]
    for path in (root / "val" / "dog").iterdir():
        path.rename(path.with_suffix(".txt"))  # the ID test set would hold no dog: a benchmark of other classes
    with pytest.raises(ValueError, match=r"class folders under .*mine hold no image: val/dog \(known class; 2 other "
                                         r"files ignored: ILSVRC2012_val_00000003\.txt"):
        folder_severity(root)
    for path in (root / "val" / "dog").iterdir():
        path.rename(path.with_suffix(".JPEG"))
    for path in (root / "val" / "yak").iterdir():
        path.unlink()
    with pytest.raises(ValueError, match=r"hold no image: val/yak \(unknown class\)$"):
        folder_severity(root)


def test_skipping_unreadable_images_leaves_them_out_of_every_set(tmp_path):
    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox", "owl", "yak"], train=4, val=2)
    broken = [root / "val" / "owl" / "ILSVRC2012_val_00000007.JPEG", root / "val" / "cat" / "ILSVRC2012_val_00000001.JPEG"]
    for path in broken:
        path.write_bytes(path.read_bytes()[:60])  # truncated JPEGs
    with pytest.warns(RuntimeWarning, match=r"skipping 1 unreadable image\(s\) of 4: .*cat"):
        data = folder_severity(root, on_bad_image="skip")
    assert data["id_test"].labels().tolist() == [0, 1, 1]
    assert data["ood_test"].labels().tolist() == [0, 1, 1]
    assert all(str(b) not in {data["ood_test"].dataset.path(i) for i in range(3)} for b in broken)
    for name in ("id_test", "ood_test", "ood_estimation"):  # every image left is one the scoring pass can read
        dataset = data[name].dataset
        assert all(dataset[i].image is not None for i in range(len(dataset)))
