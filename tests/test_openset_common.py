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
