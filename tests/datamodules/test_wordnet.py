import os

import pytest

from datamodules import wordnet


def test_install_from_debian_files(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    corpus = wordnet.install_wordnet_corpus(tmp_path)
    assert corpus == tmp_path / "corpora" / "wordnet"
    assert not (corpus / "data.noun").is_symlink()
    lexnames = (corpus / "lexnames").read_text().splitlines()
    assert lexnames[0] == "00\tadj.all\t3" and lexnames[5] == "05\tnoun.animal\t1" and len(lexnames) == 45
    reader = wordnet.open_corpus(corpus)
    assert reader.get_version() == "3.0"
    assert not list(tmp_path.glob("corpora/.wordnet-*"))  # no staging folder left behind
    umask = os.umask(0o022)
    os.umask(umask)
    assert corpus.stat().st_mode & 0o777 == 0o777 & ~umask  # readable by others as any new folder, not 0700


def test_missing_source_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        wordnet.install_wordnet_corpus(tmp_path / "target", source_dir=tmp_path)


def test_wnid_lookup_and_closure():
    dog = wordnet.synset("n02084071")
    assert dog.name() == "dog.n.01"
    assert wordnet.wnid(dog) == "n02084071"
    below_dog = wordnet.hyponym_closure("n02084071")
    assert "n02085620" in below_dog  # Chihuahua
    assert "n02120079" not in below_dog  # Arctic fox
    assert wordnet.descendants_in(["n02118333"], ["n02119022", "n02120079", "n02085620"]) == ["n02119022", "n02120079"]
    with pytest.raises(ValueError, match="not an ImageNet wnid"):
        wordnet.synset("dog")


def test_a_target_that_cannot_be_written_is_named(tmp_path, monkeypatch, capsys):
    import os

    (tmp_path / "file").write_text("in the way")
    with pytest.raises(NotADirectoryError, match=r"the WordNet corpus goes to .*file/nltk/corpora/wordnet, but .*file is "
                                                 r"a file"):
        wordnet.install_wordnet_corpus(tmp_path / "file" / "nltk")
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(locked))  # read-only, as for a non-root user
    with pytest.raises(SystemExit, match=r"^python -m datamodules.wordnet install: the WordNet corpus goes to "
                                         r".*locked/corpora/wordnet, but .*locked cannot be written"):
        wordnet.main(["install", "--target", str(locked)])
    assert list(locked.iterdir()) == []


def test_a_failing_copy_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    import shutil

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    with pytest.raises(OSError, match=r"cannot install the WordNet corpus in .*target/corpora/wordnet: .*No space left"):
        wordnet.install_wordnet_corpus(tmp_path / "target")
    assert list((tmp_path / "target" / "corpora").iterdir()) == []  # no staging folder left behind
