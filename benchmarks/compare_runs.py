"""Compare two output folders table by table (e.g. ``make demo`` before and after a change).

    python -m benchmarks.compare_runs runs-before/demo runs/demo [--ignore 'wandb/*'] [--ignore-key generator_sha256]

Every CSV, Markdown and JSON file, and every ``.pt`` file of tensors, that either folder holds is compared
with its namesake: CSV tables row by row and cell by cell (numbers as written, so "bit for bit" means the
same text), JSON value by value, Markdown line by line, tensors exactly (dtype, shape and every element; NaN
in both places, a number not measured, counts as the same).
Prints one line per file (``same``, ``DIFFERS`` with the first differences, ``only in A``/``only in B``) and
exits with 1 when anything differs. ``--ignore`` leaves out files matching a glob (relative paths);
``--ignore-key`` a CSV column or JSON key everywhere (a checkpoint's sha256, which changes with any byte of
its metadata).
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

SUFFIXES = (".csv", ".md", ".json", ".pt")
DEFAULT_IGNORE = ("wandb/*", "*/wandb/*", "cache/*", "*/cache/*", "chains/*", "*/chains/*", "images/*", "*/images/*")


def files(root: Path, ignore: list[str]) -> set[str]:
    files = set()
    for path in root.rglob("*"):
        relative = str(path.relative_to(root))
        if path.is_file() and path.suffix in SUFFIXES and not any(fnmatch.fnmatch(relative, g) for g in ignore):
            files.add(relative)
    return files


def _csv(path: Path, ignore_keys: set[str]) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        text = handle.read()
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return []
    header = rows[0]
    return [{k: v for k, v in zip(header, row, strict=False) if k not in ignore_keys} for row in rows[1:]] + [
        {"<header>": ",".join(h for h in header if h not in ignore_keys)}]


def _strip(value: Any, ignore_keys: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, ignore_keys) for k, v in value.items() if k not in ignore_keys}
    if isinstance(value, list):
        return [_strip(v, ignore_keys) for v in value]
    return value


def _json_differences(a: Any, b: Any, where: str, out: list[str]) -> None:
    if len(out) >= 5:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'B' if key not in a else 'A'}")
            else:
                _json_differences(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _json_differences(x, y, f"{where}[{i}]", out)
    elif a != b and not (_is_nan(a) and _is_nan(b)):  # NaN ("not measured") in both is the same
        out.append(f"{where}: {a!r} vs {b!r}")


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _tensors(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=False)


def _tensor_differences(a: Any, b: Any, where: str, out: list[str]) -> None:
    if len(out) >= 5:
        return
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{where}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
        elif not torch.equal(a, b):
            unequal = (a != b) if a.dtype != torch.bool else a ^ b
            if a.is_floating_point():  # NaN in both places is the same number (an empty resample)
                unequal &= ~(a.isnan() & b.isnan())
            if not bool(unequal.any()):
                return
            out.append(f"{where}: {int(unequal.sum())} of {a.numel()} elements differ")
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{where}[{key!r}]: only in {'B' if key not in a else 'A'}")
            else:
                _tensor_differences(a[key], b[key], f"{where}[{key!r}]", out)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _tensor_differences(x, y, f"{where}[{i}]", out)
    elif a != b and not (_is_nan(a) and _is_nan(b)):
        out.append(f"{where}: {a!r} vs {b!r}")


def differences(a: Path, b: Path, ignore_keys: set[str]) -> list[str]:
    """The first differences between two files of one kind (empty: the same)."""
    out: list[str] = []
    if a.suffix == ".csv":
        rows_a, rows_b = _csv(a, ignore_keys), _csv(b, ignore_keys)
        if len(rows_a) != len(rows_b):
            out.append(f"{len(rows_a) - 1} rows vs {len(rows_b) - 1}")
        for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=False)):
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key) and len(out) < 5:
                    out.append(f"row {i + 1}, {key}: {x.get(key)!r} vs {y.get(key)!r}")
    elif a.suffix == ".json":
        _json_differences(_strip(json.loads(a.read_text()), ignore_keys), _strip(json.loads(b.read_text()), ignore_keys),
                          "", out)
    elif a.suffix == ".pt":
        _tensor_differences(_tensors(a), _tensors(b), "", out)
    else:
        lines_a, lines_b = a.read_text().splitlines(), b.read_text().splitlines()
        if len(lines_a) != len(lines_b):
            out.append(f"{len(lines_a)} lines vs {len(lines_b)}")
        for i, (x, y) in enumerate(zip(lines_a, lines_b, strict=False)):
            if x != y and len(out) < 5:
                out.append(f"line {i + 1}: {x!r} vs {y!r}")
    return out


def compare(first: Path, second: Path, *, ignore: list[str], ignore_keys: set[str]) -> dict[str, list[str]]:
    """Relative path -> differences (``["only in A"]`` / ``["only in B"]`` for a missing namesake)."""
    in_a, in_b = files(first, ignore), files(second, ignore)
    result: dict[str, list[str]] = {}
    for relative in sorted(in_a | in_b):
        if relative not in in_b:
            result[relative] = ["only in A"]
        elif relative not in in_a:
            result[relative] = ["only in B"]
        else:
            result[relative] = differences(first / relative, second / relative, ignore_keys)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="folder A")
    parser.add_argument("second", type=Path, help="folder B")
    parser.add_argument("--ignore", action="append", default=list(DEFAULT_IGNORE), metavar="GLOB",
                        help=f"leave out files matching this glob (default: {', '.join(DEFAULT_IGNORE)})")
    parser.add_argument("--ignore-key", action="append", default=[], metavar="NAME",
                        help="leave out this CSV column or JSON key in every file")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not folder.is_dir():
            raise SystemExit(f"{folder} is not a folder")
    result = compare(args.first, args.second, ignore=args.ignore, ignore_keys=set(args.ignore_key))
    changed = 0
    for relative, differences in result.items():
        if differences:
            changed += 1
            print(f"DIFFERS  {relative}: " + "; ".join(differences))
        else:
            print(f"same     {relative}")
    print(f"\n{len(result) - changed} of {len(result)} files the same, {changed} differ")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
