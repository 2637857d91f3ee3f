"""WordNet 3.0 access through NLTK, installed offline from Debian's ``wordnet-base`` files.

ImageNet class ids (wnids) are WordNet 3.0 noun offsets: ``n02084071`` is the noun synset at offset
2084071 ("dog"). NLTK reads the WordNet database once its files sit, copied (not linked), in an NLTK data
folder as ``corpora/wordnet/`` together with a ``lexnames`` file, which Debian does not ship.

    python -m datamodules.wordnet install [--target DIR] [--source /usr/share/wordnet]

copies them into ``<venv>/share/nltk_data`` by default, a folder NLTK searches on its own.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from openset_common.artefacts import check_writable_folder, staging_folder, stale_staging_folders

DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")
REQUIRED_FILES = ("data.noun", "index.noun", "data.verb", "index.verb", "data.adj", "index.adj",
                  "data.adv", "index.adv", "noun.exc", "verb.exc", "adj.exc", "adv.exc")
OPTIONAL_FILES = ("index.sense", "cntlist", "cntlist.rev", "frames.vrb", "sentidx.vrb", "sents.vrb")

# The WordNet 3.0 lexicographer files (the standard ``lexnames`` file: number, name, syntactic category).
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant",
    "noun.possession", "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition", "verb.communication",
    "verb.competition", "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
_POS_NUMBER = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}

INSTALL_HINT = (
    "run `make setup` (installs Debian's wordnet-base and wordnet-sense-index and copies them into "
    "the virtual environment's share/nltk_data) or `python -m datamodules.wordnet install`"
)


def default_nltk_data_dir() -> Path:
    """``<sys.prefix>/share/nltk_data``: inside the virtual environment, and on NLTK's search path."""
    return Path(sys.prefix) / "share" / "nltk_data"


def lexnames_text() -> str:
    return "".join(f"{i:02d}\t{name}\t{_POS_NUMBER[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES))


def install_wordnet_corpus(target_dir: Path | None = None, source_dir: Path = DEBIAN_WORDNET_DIR) -> Path:
    """Copy the WordNet database files into ``<target_dir>/corpora/wordnet`` and write ``lexnames``.

    The corpus folder appears atomically (built in a temporary folder, then renamed), so an interrupted
    install never leaves a half-copied corpus that NLTK would try to read.

    Returns:
        The corpus folder.
    """
    target_dir = Path(target_dir) if target_dir is not None else default_nltk_data_dir()
    source_dir = Path(source_dir)
    missing = [name for name in REQUIRED_FILES if not (source_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"WordNet database files {missing} are missing in {source_dir}; install Debian's wordnet-base and "
            f"wordnet-sense-index (apt-get install wordnet-base wordnet-sense-index) or pass --source"
        )
    corpus = target_dir / "corpora" / "wordnet"
    check_writable_folder(corpus, what="the WordNet corpus")
    staging: Path | None = None
    try:
        for stale in stale_staging_folders(corpus.parent, ".wordnet-"):  # of an install that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = staging_folder(corpus.parent, ".wordnet-")  # the permissions of any new folder, not 0700
        for name in REQUIRED_FILES + OPTIONAL_FILES:
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, staging / name)  # a copy: NLTK rejects links here
        (staging / "lexnames").write_text(lexnames_text())
        if corpus.exists():
            shutil.rmtree(corpus)
        staging.rename(corpus)
    except OSError as error:  # a full disk, a folder the checks above could not see was read-only
        raise OSError(f"cannot install the WordNet corpus in {corpus}: {error.strerror or error}") from error
    finally:
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return corpus


def open_corpus(corpus: Path) -> Any:
    """An NLTK WordNet reader of a corpus folder (which must lie under a folder of ``nltk.data.path``)."""
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    with warnings.catch_warnings():  # "multilingual functions are not available": not needed here
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(str(corpus), None)


@lru_cache(maxsize=1)
def load_wordnet() -> Any:
    """The NLTK WordNet 3.0 reader; a clear error says how to install it when it is missing."""
    import nltk

    data_dirs = [default_nltk_data_dir(), *map(Path, nltk.data.path)]
    for data_dir in data_dirs:
        corpus = data_dir / "corpora" / "wordnet"
        if (corpus / "lexnames").is_file() and (corpus / "data.noun").is_file():
            reader = open_corpus(corpus)
            if reader.get_version() != "3.0":
                raise RuntimeError(f"{corpus} holds WordNet {reader.get_version()}; ImageNet wnids need WordNet 3.0")
            return reader
    raise FileNotFoundError(f"the WordNet 3.0 corpus for NLTK was not found in {[str(d) for d in data_dirs]}; {INSTALL_HINT}")


def synset(wnid: str, wordnet: Any = None) -> Any:
    """The noun synset of an ImageNet wnid such as ``n02084071``."""
    wordnet = wordnet or load_wordnet()
    if len(wnid) != 9 or wnid[0] != "n" or not wnid[1:].isdigit():
        raise ValueError(f"{wnid!r} is not an ImageNet wnid (n followed by 8 digits)")
    try:
        return wordnet.synset_from_pos_and_offset("n", int(wnid[1:]))
    except Exception as error:
        raise ValueError(f"wnid {wnid} is not a WordNet 3.0 noun synset") from error


def wnid(synset_: Any) -> str:
    """The wnid of a noun synset."""
    return f"{synset_.pos()}{synset_.offset():08d}"


def hyponym_closure(root: str, wordnet: Any = None) -> set[str]:
    """wnids of ``root`` and every synset below it (hyponyms and instance hyponyms, transitively)."""
    wordnet = wordnet or load_wordnet()
    start = synset(root, wordnet)
    below = start.closure(lambda s: s.hyponyms() + s.instance_hyponyms())
    return {root, *(wnid(s) for s in below)}


def descendants_in(roots: Iterable[str], candidates: Iterable[str], wordnet: Any = None) -> list[str]:
    """Sorted candidate wnids that lie in the hyponym closure of any of ``roots``."""
    candidates = set(candidates)
    hyponyms: set[str] = set()
    for root in roots:
        hyponyms |= hyponym_closure(root, wordnet) & candidates
    return sorted(hyponyms)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m datamodules.wordnet", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="copy the Debian WordNet files into an NLTK data folder")
    install.add_argument("--target", type=Path, default=None, help="NLTK data folder (default: <venv>/share/nltk_data)")
    install.add_argument("--source", type=Path, default=DEBIAN_WORDNET_DIR, help="folder with data.noun etc.")
    args = parser.parse_args(argv)
    import nltk

    try:
        corpus = install_wordnet_corpus(args.target, args.source)
    except OSError as error:
        raise SystemExit(f"{parser.prog} install: {error}") from None
    if str(corpus.parent.parent) not in nltk.data.path:  # NLTK reads only from its data path
        nltk.data.path.append(str(corpus.parent.parent))
    load_wordnet.cache_clear()
    print(f"WordNet {open_corpus(corpus).get_version()} for NLTK installed in {corpus}")


if __name__ == "__main__":  # ``python -m datamodules.wordnet``: the package has imported this module already;
    from datamodules import wordnet  # run that copy, whose classes are the ones every other module sees

    wordnet.main()
