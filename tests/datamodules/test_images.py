"""datamodules.images: the one rule for what an image file is, and the warning that counts what it leaves out."""

from __future__ import annotations

import warnings

import pytest

from datamodules.images import IMAGE_EXTENSIONS, NonImageFilesWarning, image_files, is_image_file


def test_the_extensions_pil_and_torchvision_read():
    assert set(IMAGE_EXTENSIONS) == {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
    assert is_image_file("n01440764_1.JPEG") and is_image_file("scan.Tiff") and is_image_file("a.b.png")
    assert not is_image_file("notes.txt") and not is_image_file("README") and not is_image_file(".hidden.jpg")
    assert not is_image_file("jpg") and not is_image_file("archive.jpg.zip")


def test_image_files_keep_images_and_count_the_rest(tmp_path):
    for name in ("b.png", "a.JPEG", "c.txt", ".DS_Store", ".x.jpg", "d.PPM", "e.pgm", "Thumbs.db", "f.webp"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.jpg").mkdir()  # a folder, not a file
    with pytest.warns(NonImageFilesWarning, match=r"ignored 2 files in .* that are not images .*: Thumbs\.db, c\.txt$"):
        assert image_files(tmp_path) == ["a.JPEG", "b.png", "d.PPM", "e.pgm", "f.webp"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert image_files(tmp_path, warn=False) == ["a.JPEG", "b.png", "d.PPM", "e.pgm", "f.webp"]
        (tmp_path / "c.txt").unlink()
        (tmp_path / "Thumbs.db").unlink()
        assert image_files(tmp_path) == ["a.JPEG", "b.png", "d.PPM", "e.pgm", "f.webp"]  # hidden files: no warning
