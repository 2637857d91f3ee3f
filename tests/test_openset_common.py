"""openset_common: atomic writes and staging folders get the permissions of any new file; staging folders of
a run that was killed are told apart from those of a run still writing; a user's own generic modules beside a
notebook shadow none of the project's."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from openset_common.artefacts import (
    atomic_write_text,
    staging_folder,
    stale_staging_folders,
    terminate_as_exit,
)
from tests.conftest import ROOT, child_env


@pytest.fixture()
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_atomic_writes_and_staging_folders_respect_the_umask(tmp_path, umask_027):
    path = atomic_write_text(tmp_path / "report" / "metrics.json", "{}\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0666 less the umask, not mkstemp's 0600
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]  # no temporary file left
    staging = staging_folder(tmp_path, ".set.staging-")
    assert stat.S_IMODE(staging.stat().st_mode) == 0o750  # 0777 less the umask, not mkdtemp's 0700
    assert staging.name.startswith(f".set.staging-{socket.gethostname()}.{os.getpid()}.")


def test_only_the_staging_folders_of_a_process_that_ended_on_this_machine_are_stale(tmp_path):
    child = os.fork()
    if child == 0:  # a run that ends without removing its staging folder
        staging_folder(tmp_path, ".set.staging-")
        os._exit(0)
    os.waitpid(child, 0)
    (killed,) = list(tmp_path.iterdir())
    running = staging_folder(tmp_path, ".set.staging-")
    elsewhere = tmp_path / f".set.staging-another-host.{killed.name.split('.')[-2]}.0123abcd"
    elsewhere.mkdir()  # a shared disk: another machine's process of the same id may still be writing
    (tmp_path / ".other.staging-x").mkdir()  # another set's
    assert stale_staging_folders(tmp_path, ".set.staging-") == [killed]
    assert running.exists() and stale_staging_folders(tmp_path / "absent", ".set.staging-") == []


def test_sigterm_within_the_block_is_an_exit_that_runs_finally():
    cleaned = []
    with pytest.raises(SystemExit) as raised:
        with terminate_as_exit():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler raises before the next statement
                cleaned.append(False)
            finally:
                cleaned.append(True)
    assert raised.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


GENERIC_NAMES = ("common", "utils", "data", "models", "plots", "config", "metrics_utils", "report", "scoring",
                 "checkpoint", "transforms", "losses", "registry", "evaluation", "images", "wordnet", "protocols",
                 "engine", "methods", "card", "page", "outputs", "intervals")


@pytest.mark.slow  # a fresh Python importing every entry point: about 10-25 s on 2 cores
def test_a_users_generic_modules_beside_a_notebook_shadow_nothing(tmp_path):
    """A fresh Python with a folder of the user's own modules first on sys.path (as a notebook's folder is):
    the project's entry points and packages still import, and none of the user's modules is imported by them."""
    for name in GENERIC_NAMES:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import evaluate, train, metrics.auroc, callbacks, datamodules, lightning_modules, evaluation_engine\n"
        "import evaluation_methods, report_card\n"
        "from evaluate import report\n"
        "from openset_common.artefacts import atomic_write_text\n"
        f"print(sorted(n for n in sys.modules if n in {GENERIC_NAMES!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=child_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_no_top_level_module_of_the_project_has_a_generic_name():
    """The top-level names a user's own file could shadow: the packages of the layout (DESIGN.md §2) and names
    a user would not give a file of their own. A new top-level module must be named so (this list is the
    review of that)."""
    top = sorted(p.stem for p in ROOT.glob("*.py")) + sorted(p.name for p in ROOT.iterdir()
                                                           if (p / "__init__.py").is_file() and p.name != "tests")
    assert top == ["evaluate", "train", "benchmarks", "callbacks", "datamodules", "evaluation_engine",
                   "evaluation_methods", "lightning_modules", "metrics", "openset_common", "report_card"]
    assert not set(top) & set(GENERIC_NAMES)


def test_the_options_a_module_passes_on_are_typed_recorded_whole_and_rebuilt(tmp_path):
    """openset_common.typed: a datamodule and a generator that take their shared options as ``**options`` (an
    options dataclass, declared once) have them checked by name and type as jsonargparse reads the signature
    (``--data-arg``), record every one of them (a default too) as hyper-parameters, and are rebuilt from those."""
    import dataclasses
    import warnings

    from datamodules.imagenet import ClassFolderDataModule, FolderOptions
    from lightning_modules.checkpoint import datamodule_from_checkpoint
    from lightning_modules.generated import NearOODGenerator
    from lightning_modules.generated.generators import GeneratorOptions
    from openset_common.typed import parameter_names, typed_arguments

    for name in ("cat", "dog", "owl"):
        (tmp_path / "train" / name).mkdir(parents=True)
    names, more = parameter_names(ClassFolderDataModule)
    assert names == ["root", "known", "negative", "unknown", "name",
                     *[f.name for f in dataclasses.fields(FolderOptions)]] and not more
    assert typed_arguments(ClassFolderDataModule, {"crop_size": "32"}, what="--data-arg") == {"crop_size": 32}
    with pytest.raises(ValueError, match=r"--data-arg \(ClassFolderDataModule\) has no arguments \['crop_sise'\]"):
        typed_arguments(ClassFolderDataModule, {"crop_sise": 32}, what="--data-arg")
    with pytest.raises(ValueError, match=r"--data-arg: .*crop_size.*abc"):
        typed_arguments(ClassFolderDataModule, {"crop_size": "abc"}, what="--data-arg")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        datamodule = ClassFolderDataModule(str(tmp_path), unknown=["owl"], crop_size=32, num_workers=0)
    expected = {"root": str(tmp_path), "known": ["cat", "dog"], "negative": [], "unknown": ["owl"], "name": "folders",
                **dataclasses.asdict(FolderOptions(crop_size=32, num_workers=0))}
    assert dict(datamodule.hparams) == expected and datamodule.crop_size == 32 and datamodule.num_workers == 0
    checkpoint = {"datamodule_class": "datamodules.ClassFolderDataModule",
                  "datamodule_hyper_parameters": dict(datamodule.hparams)}
    rebuilt = datamodule_from_checkpoint(checkpoint, "x.ckpt", {"resize_size": 40})
    assert dict(rebuilt.hparams) == {**expected, "resize_size": 40}
    with pytest.raises(ValueError, match=r"has no arguments \['resize_sise'\]"):
        datamodule_from_checkpoint(checkpoint, "x.ckpt", {"resize_sise": 40})

    generator = NearOODGenerator(lambda_perceptual=0, lambda_semantic=0, base_width=8, latent_dim=16, lr=1e-3)
    recorded = dict(generator.hparams)
    assert {k: recorded[k] for k in (f.name for f in dataclasses.fields(GeneratorOptions))} == dataclasses.asdict(
        GeneratorOptions(lambda_perceptual=0, lambda_semantic=0, lr=1e-3))
    assert (recorded["latent_dim"], recorded["channels"], generator.lr) == (16, 1, 1e-3)
    assert dict(NearOODGenerator(**recorded).hparams) == recorded
    with pytest.raises(TypeError, match="unexpected keyword argument 'lr_'"):
        NearOODGenerator(lr_=1e-3)


def test_a_generator_checkpoint_of_before_with_a_linked_key_it_does_not_take_still_loads(tmp_path):
    """train.py links the data's ``num_classes`` into every model; LightningCLI recorded it for generators of before,
    which never took it. Now that their options come as ``**options``, ``load_module`` leaves such a key out."""
    import warnings

    import torch

    from lightning_modules.checkpoint import load_module
    from lightning_modules.generated import NearOODGenerator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generator = NearOODGenerator(lambda_perceptual=0, lambda_semantic=0, base_width=8, latent_dim=16, lr=1e-3)
    recorded = {"_class_path": "lightning_modules.NearOODGenerator", **generator.hparams, "num_classes": 4,
                "_instantiator": "pytorch_lightning.cli.instantiate_module"}
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": generator.state_dict(), "hyper_parameters": recorded,
                "model_class": "lightning_modules.generated.generators.NearOODGenerator",
                "pytorch-lightning_version": "2.6.0"}, path)
    with pytest.raises(TypeError, match=r"NearOODGenerator: .*unexpected keyword argument 'num_classes' \(its options"):
        NearOODGenerator(**{k: v for k, v in recorded.items() if not k.startswith("_")})
    loaded = load_module(path)
    assert type(loaded) is NearOODGenerator and (loaded.lr, loaded.latent_dim) == (1e-3, 16)
    assert "num_classes" not in loaded.hparams
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), generator.state_dict().values(),
                                                  strict=True))
