import numpy as np
import pytest
import torch

from datamodules.imagenet21k import sample_pool, write_pool_file
from datamodules.protocols import imagenet1k_wnids
from datamodules.severity import FashionSeverityDataModule, ImageNetSeverityDataModule, load_digits_images
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
