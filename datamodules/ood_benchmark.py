"""The data of the OOD detection benchmark (``evaluate.py ood``; OpenOOD v1.5's shape): one in-distribution test
set, the OOD sets of each group, the validation sets parameters may be tuned on, and the covariate-shifted ID sets of
the full-spectrum setting, each with where it came from.

Groups (OpenOOD v1.5, Zhang et al. 2023, ``openood/evaluation_api/datasets.py``):

    id_test   the in-distribution test images (the positives of every metric); labels = the classes' index
    id_val    in-distribution validation images (tuning, ReAct's percentile); never a test set
    ood_val   OOD validation images (tuning only); never a test set
    near      near-OOD test sets (semantic shift only: ImageNet-1K's SSB-hard and NINCO)
    far       far-OOD test sets (iNaturalist, Textures, OpenImage-O)
    in21k     semantic-shift sets drawn from the user's ImageNet-21k (ImageNet-OOD, Yang et al., ICLR 2024; SSB easy
              and hard, Vaze et al., ICLR 2022: :mod:`datamodules.imagenet21k_sets`), their own mean, so that
              ``near`` stays OpenOOD's
    unit      the OOD unit tests (Bitterwolf et al., ICML 2023): generated noise and patterns, a far-OOD family
              reported as its own mean so that ``far`` stays OpenOOD's
    csid      covariate-shifted ID sets (ImageNet-V2, -C, -R): the full-spectrum setting (FSOOD) counts them as
              in-distribution, with their class labels

The benchmarks by name are the catalog's (:data:`datamodules.catalog.OOD_BENCHMARKS`): ``openood:imagenet1k``,
``openood:imagenet200``, ``openood:cifar10``, ``openood:cifar100`` (OpenOOD v1.5's image lists,
:mod:`datamodules.openood`) and ``fashion``, the demo's benchmark of the same shape (:func:`datamodules.catalog.fashion_benchmark`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from datamodules.evaluation import EvaluationData, EvaluationSet
from datamodules.images import BadImagePolicy
from datamodules.protocols import imagenet1k_wnids
from openset_common.artefacts import digest
from openset_common.labels import UNKNOWN_LABEL

GROUPS = ("id_test", "id_val", "ood_val", "near", "far", "in21k", "unit", "csid")
# the evaluation role of each group's sets (datamodules.evaluation.ROLES)
ROLE_OF_GROUP = {"id_test": "id_test", "id_val": "id_val", "ood_val": "ood_val", "near": "ood", "far": "ood",
                 "in21k": "ood", "unit": "ood", "csid": "real_shift"}
TEST_GROUPS = ("near", "far", "in21k", "unit")  # the OOD test sets, each a row of the tables
VALIDATION_GROUPS = ("id_val", "ood_val")


class OODBenchmarkData(EvaluationData):
    """The sets of one OOD benchmark, each in a group (module docstring), with its provenance.

    Args:
        name: the benchmark's name (``openood:imagenet1k``, ``fashion``).
        sets: ``(group, evaluation set, provenance)`` in table order; provenance is what the card states about the
            set (``source``, and for a list ``lines`` and ``sha256``).
        classes: the ID classes in label order (wnids, names), ``None`` where the benchmark does not name them.
        num_classes: the number of ID classes (a model's logits must have that many known columns).
        description: one line about the benchmark.
        fit: builds the benchmark's own fit set of fitted detectors (OpenOOD's ID training list; the demo's training
            split), read only when a detector fits; ``None``: it has none.
        notes: what the card says about the benchmark's sets (a set left out, and why).

    Raises:
        ValueError: a group not among :data:`GROUPS`; a benchmark without exactly one ``id_test`` set or without an
            OOD test set; an ID set (``id_test``, ``id_val``, ``csid``) with labels outside ``0..num_classes-1``.
    """

    def __init__(self, name: str, sets: Sequence[tuple[str, EvaluationSet, dict[str, Any]]], *,
                 classes: Sequence[str] | None, num_classes: int, description: str = "", batch_size: int = 256,
                 num_workers: int = 0, fit: Callable[[], EvaluationSet | None] | None = None,
                 notes: Sequence[str] = ()) -> None:
        wrong = sorted({group for group, _, _ in sets if group not in GROUPS})
        if wrong:
            raise ValueError(f"benchmark {name}: groups {wrong} are not among {list(GROUPS)}")
        self.name, self.num_classes, self.description = name, int(num_classes), description
        self._fit, self.notes = fit, list(notes)
        self.groups = {s.name: group for group, s, _ in sets}
        self.provenance = {s.name: {"set": s.name, "group": group, "images": len(s), **provenance}
                           for group, s, provenance in sets}
        super().__init__([s for _, s, _ in sets], batch_size=batch_size, num_workers=num_workers, classes=classes)
        if list(self.groups.values()).count("id_test") != 1:
            raise ValueError(f"benchmark {name} needs exactly one id_test set, got {self.of('id_test')}")
        if not self.of(*TEST_GROUPS):
            raise ValueError(f"benchmark {name} has no OOD test set (groups {list(TEST_GROUPS)})")
        for set_name in self.of("id_test", "id_val", "csid"):
            labels = self.sets[set_name].labels()
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
                raise ValueError(f"benchmark {name}: the ID set {set_name} has labels outside 0..{self.num_classes - 1} "
                                 f"(from {int(labels.min())} to {int(labels.max())})")

    def of(self, *groups: str) -> list[str]:
        """The names of the sets of these groups, in table order."""
        return [name for name, group in self.groups.items() if group in groups]

    @property
    def id_test(self) -> EvaluationSet:
        return self.sets[self.of("id_test")[0]]

    def fit_set(self) -> EvaluationSet | None:
        """The benchmark's own fit set (its ID training images), built when first asked; ``None``: it has none."""
        if self._fit is not None and not hasattr(self, "_fit_set"):
            self._fit_set = self._fit()
        return getattr(self, "_fit_set", None)


def openood_benchmark(benchmark: str, *, data_root: str | None = None, set_roots: dict[str, str] | None = None,
                      lists: dict[str, str] | None = None, subset_lists: dict[str, str] | None = None,
                      sets: list[str] | None = None, full_spectrum: bool = False, on_bad_image: BadImagePolicy = "fail",
                      images: bool = True, imagenet21k: list[str] | None = None,
                      imagenet21k_root: str | dict[str, str] | None = None, imagenet21k_per_class: int | None = None,
                      imagenet21k_clashes: Literal["warn", "fail", "exclude"] = "warn",
                      imagenet21k_classes: dict[str, list[str]] | None = None, batch_size: int = 256,
                      num_workers: int = 0) -> OODBenchmarkData:
    """An OpenOOD v1.5 benchmark (``imagenet1k``, ``imagenet200``, ``cifar10``, ``cifar100``) from its published lists
    (:mod:`datamodules.openood`): the images where the user has them, every one checked present before any pass.

    Args:
        data_root: OpenOOD's data folder (``images_largescale/``, ``images_classic/``) or a shard set of it.
        set_roots: a root per set (``{"ninco": "/data/NINCO"}``: the list's first folder replaced by it).
        lists: the user's copy of a list the package does not ship (ImageNet-ES), checked to be the published one.
        subset_lists: a part of a set's published list (tests, a quick look): only those images, marked a subset.
        sets: set names or OpenOOD roles to read (default: ID val and test, OOD val, near and far; with
            ``full_spectrum`` the covariate-shifted sets too).
        full_spectrum: read the covariate-shifted ID sets (``csid``) too: ImageNet-V2, -C, -R (-ES where its list is
            given).
        images: ``False``: the lists only (:class:`ListedImages`), for scores made elsewhere (``--scores``): no image
            is looked for, none can be read.
        imagenet21k: ImageNet-21k sets to add to an ImageNet benchmark as the group ``in21k``: ``imagenet_ood``,
            ``ssb_easy_21k``, ``ssb_hard_21k`` (:func:`datamodules.imagenet21k_sets.imagenet21k_ood_sets`), read
            from ``imagenet21k_root`` (the ImageNet-21k folder or shard set, or one per set), ``imagenet21k_per_class``
            images a class (``None``: all; SSB's published size: 50 of ImageNet-21K-P's validation images), classes
            that clash with ImageNet-1k under WordNet ``warn`` (kept, said), ``fail`` or ``exclude``;
            ``imagenet21k_classes``: per set a part of its classes (a quick look; marked a subset).
    """
    from datamodules.openood import BENCHMARKS, benchmark_of, evaluation_sets

    spec = benchmark_of(benchmark)
    sets_given = sets
    if sets is None:
        sets = ["id_val", "id_test", "ood_val", "near", "far"]
        if full_spectrum:  # the csid sets whose list is shipped or given (ImageNet-ES: no public copy)
            sets += [s.name for s in spec.select(["csid"]) if s.shipped or s.name in (lists or {})]
    if images:
        read = evaluation_sets(benchmark, sets, data_root=data_root, set_roots=set_roots, lists=lists,
                               subset_lists=subset_lists, on_bad_image=on_bad_image)
    else:
        read = listed_sets(benchmark, sets, lists=lists, subset_lists=subset_lists)
    group_of = {"id_val": "id_val", "id_test": "id_test", "ood_val": "ood_val", "near": "near", "far": "far",
                "csid": "csid"}
    entries = []
    for name, evaluation_set in read.items():
        role = BENCHMARKS[benchmark].sets[name].role
        if role not in group_of:
            continue  # the training list: fit data, not a set of the benchmark's tables
        info = evaluation_set.info
        folder = BENCHMARKS[benchmark].sets[name].folder
        info["paths"] = [f"{folder}/{path}" if info.get("layout") == "set_root" else path
                         for path, _ in evaluation_set.dataset.rows]  # type: ignore[attr-defined]
        entries.append((group_of[role], evaluation_set, {
            "source": f"OpenOOD v1.5 {info['list']} ({info['list_source']})",
            "lines": info["list_lines"], "sha256": info["list_sha256"],
            **({"subset of it": f"{info['subset_lines']} lines, sha256 {info['subset_sha256']}"}
               if info.get("subset") else {}),
            "root": info.get("root")}))
    if imagenet21k:
        if not benchmark.startswith("imagenet"):
            raise ValueError(f"imagenet21k sets {imagenet21k} are ImageNet's OOD sets, not {benchmark}'s")
        if imagenet21k_root is None:
            raise ValueError(f"imagenet21k sets {imagenet21k} need imagenet21k_root: the ImageNet-21k folder or shard "
                             "set (<root>/<wnid>/*), or one per set")
        if images:
            from datamodules.imagenet21k_sets import imagenet21k_ood_sets

            for extra in imagenet21k_ood_sets(imagenet21k, imagenet21k_root, per_class=imagenet21k_per_class,
                                              clashes=imagenet21k_clashes, classes=imagenet21k_classes,
                                              on_bad_image=on_bad_image).values():
                info = extra.info
                entries.append(("in21k", extra, {
                    "source": f"{info['paper']}: {info['list_source']}; {info['selection']}"
                              + (" (a subset)" if info["subset"] else ""),
                    "lines": info["list_lines"], "sha256": info["list_sha256"], "root": str(info["root"]),
                    **({"WordNet clashes": f"{len(info['wordnet_clashes'])} kept ({info['clash_policy']})"}
                       if info["wordnet_clashes"] else {})}))
    notes = [f"{s.name}: not read, its list has no public copy (give it: --list {s.name}=<OpenOOD's {s.list}>)"
             for s in spec.select(["csid"]) if full_spectrum and sets_given is None and not s.shipped
             and s.name not in (lists or {})]
    train = spec.sets.get("id_train")

    def fit() -> EvaluationSet | None:  # OpenOOD fits on its ID training list (shipped for CIFAR; ImageNet's: --list)
        if train is None or not images or not (train.shipped or "id_train" in (lists or {})):
            return None
        return evaluation_sets(benchmark, ["id_train"], data_root=data_root, set_roots=set_roots, lists=lists,
                               on_bad_image=on_bad_image)["id_train"]

    return OODBenchmarkData(f"openood:{benchmark}", entries, classes=openood_classes(benchmark),
                            num_classes=spec.num_classes, description=f"OpenOOD v1.5's {benchmark} benchmark",
                            batch_size=batch_size, num_workers=num_workers, fit=fit, notes=notes)


def openood_classes(benchmark: str) -> list[str]:
    """The ID classes of an OpenOOD benchmark in its label order: ImageNet-1K's wnids (the standard order); ImageNet-200's
    wnids, each label's images found in ImageNet-1K's lists (OpenOOD's ImageNet-200 test images are ImageNet val images);
    CIFAR's class names, the folder of each label's images in the ID test list (``cifar10/test/airplane/...``)."""
    from datamodules.openood import read_list

    wnids = imagenet1k_wnids()
    if benchmark == "imagenet1k":
        return wnids
    if benchmark == "imagenet200":
        full = {path: label for name in ("id_test", "id_val") for path, label in read_list("imagenet1k", name)}
        found: dict[int, str] = {}
        for path, label in read_list("imagenet200", "id_test"):
            found.setdefault(label, wnids[full[path]])
        return [found[label] for label in range(len(found))]
    found = {}
    for path, label in read_list(benchmark, "id_test"):
        found.setdefault(label, path.split("/")[2])
    return [found[label] for label in range(len(found))]


class ListedImages(Dataset):
    """The images of a list without the images: its rows and labels, for scores made elsewhere. Its fingerprint is
    the list's (the published sha256, the rows read); asking for an image is an error."""

    def __init__(self, rows: Sequence[tuple[str, int]], identity: str) -> None:
        self.rows = list(rows)
        self.identity = identity
        self._labels = torch.tensor([label for _, label in self.rows], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        raise RuntimeError(f"{self.rows[index][0]}: the benchmark was read from its lists only (scores given); its images "
                           "are not read")

    def labels(self) -> torch.Tensor:
        return self._labels.clone()

    def fingerprint(self) -> str:
        return digest({"list": self.identity, "rows": self.rows})


def listed_sets(benchmark: str, sets: Sequence[str], *, lists: dict[str, str] | None = None,
                subset_lists: dict[str, str] | None = None) -> dict[str, EvaluationSet]:
    """The sets of an OpenOOD benchmark from their lists alone (:class:`ListedImages`), with the ``info`` of
    :func:`datamodules.openood.evaluation_sets` but no root: what ``--scores`` checks score files against."""
    from datamodules.openood import benchmark_of, listed

    out = {}
    for spec in benchmark_of(benchmark).select(sets):
        read = listed(benchmark, spec.name, (lists or {}).get(spec.name), subset=(subset_lists or {}).get(spec.name))
        rows = [(path, UNKNOWN_LABEL if spec.is_ood else label) for path, label in read.rows]
        info = {**read.info(), "group": spec.role, "root": None, "layout": "list"}
        out[spec.name] = EvaluationSet(spec.name, spec.evaluation_role,  # type: ignore[arg-type]
                                       ListedImages(rows, f"{read.sha256}:{read.subset_sha256}"), info=info)
    return out


__all__ = ["GROUPS", "OODBenchmarkData", "ROLE_OF_GROUP", "TEST_GROUPS", "VALIDATION_GROUPS", "openood_benchmark"]
