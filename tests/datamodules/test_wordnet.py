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
