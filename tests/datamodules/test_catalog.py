"""The benchmark data by name (:mod:`datamodules.catalog`): a new in-distribution data set is its datamodule
and one entry; real OOD sets by ``NAME[:ARGUMENT]`` or a folder; names refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from datamodules import catalog
from datamodules.catalog import (
    InDistribution,
    RealOOD,
    build_datamodule,
    build_severity_data,
    entry_of,
    ood_context,
    real_ood_set,
    register,
    severity_factory,
)
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.images import TensorImageDataset
from datamodules.severity import FashionSeverityData


class Shirts(FashionMNISTOpenSetDataModule):
    """A user's in-distribution data set: Fashion-MNIST with shirts (6) among the known classes."""

    def __init__(self, data_dir: str = catalog.DEBIAN_FASHION_MNIST_DIR, max_train_per_class: int | None = None) -> None:
        super().__init__(data_dir=data_dir, known=[0, 6], negative=[2], unknown=[4, 9],
                         max_train_per_class=max_train_per_class)


def shirts_severity(datamodule: Shirts, **arguments) -> FashionSeverityData:
    return FashionSeverityData(data_dir=datamodule._folder(), known=datamodule.known, negative=[],
                               **{"estimation": 11, **arguments})


@pytest.fixture
def shirts():
    entry = register(InDistribution("shirts", Shirts, "Fashion-MNIST with shirts known", severity=shirts_severity,
                                    ood_context=lambda dm: {"data_dir": "elsewhere", "known": tuple(dm.known)}))
    yield entry
    catalog.IN_DISTRIBUTION.pop("shirts")


def test_a_new_in_distribution_data_set_is_a_datamodule_and_one_entry(shirts) -> None:
    made = build_datamodule("shirts", {"max_train_per_class": 5})
    assert isinstance(made, Shirts) and made.max_train_per_class == 5 and entry_of(made) is shirts
    # its severity data and what its real OOD sets need: the entry's, not the base class's
    severity = build_severity_data(None, {"test": 3}, datamodule=made)
    assert isinstance(severity, FashionSeverityData) and (severity.estimation, severity.test) == (11, 3)
    assert list(severity.known) == [0, 6]
    assert severity_factory(made)(estimation=4).estimation == 4
    assert ood_context(made) == {"data_dir": "elsewhere", "known": (0, 6)}
    # its arguments checked by type, naming the entry
    with pytest.raises(ValueError, match=r"--data shirts --data-arg.*max_train_per_class"):
        build_datamodule("shirts", {"max_train_per_class": "many"})
    with pytest.raises(ValueError, match=r"InDistribution 'shirts' is already registered"):
        register(InDistribution("shirts", FashionMNISTOpenSetDataModule, "another"))


def test_a_datamodule_no_entry_names_takes_its_nearest_base_entry() -> None:
    class Unregistered(FashionMNISTOpenSetDataModule):
        pass

    made = Unregistered(known=[1, 8])
    assert entry_of(made) is catalog.IN_DISTRIBUTION["fashion"]
    assert ood_context(made) == {"data_dir": made._folder(), "known": [1, 8]}
    assert ood_context(object()) == {"data_dir": catalog.DEBIAN_FASHION_MNIST_DIR, "known": ()}
    with pytest.raises(ValueError, match=r"unknown datamodule 'fasion': use one of \['fashion', 'folder', 'protocol'\]"):
        build_datamodule("fasion")


def test_real_ood_sets_by_name_argument_or_folder(tmp_path: Path) -> None:
    ramp = torch.linspace(0, 1, 12).reshape(3, 1, 2, 2)

    def build(argument: str, **_) -> TensorImageDataset:
        count = int(argument or 3)
        return TensorImageDataset(ramp[:count], torch.full((count,), -2))

    register(RealOOD("ramp", build, "a test ramp"))
    try:
        assert len(real_ood_set("ramp:2")) == 2 and len(real_ood_set("ramp")) == 3
        # a registered name wins over a folder of that name in the current folder
        (tmp_path / "ramp").mkdir()
        assert len(real_ood_set("ramp")) == 3
    finally:
        catalog.REAL_OOD.pop("ramp")
    with pytest.raises(ValueError, match="cannot hold ':'"):
        register(RealOOD("a:b", build, ""))
    with pytest.raises(FileNotFoundError, match=r"'nowhere:3': not one of \['digits', 'fashion'\]"):
        real_ood_set("nowhere:3")
    with pytest.raises(ValueError, match=r"fashion:unknown or Fashion-MNIST class ids"):
        real_ood_set("fashion:shirts")
    with pytest.raises(ValueError, match="digits takes no argument"):
        real_ood_set("digits:9")
    digits = real_ood_set("digits")
    assert len(digits) == 1797 and digits.source_classes.bincount().tolist()[:2] == [178, 182]
