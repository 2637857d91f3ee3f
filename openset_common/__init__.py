"""Project-wide conventions and small helpers that every package may import (DESIGN.md §2–§3), one module per
concern:

- :mod:`openset_common.labels`: the label convention (known ``0..K-1``, negatives ``-1``, unknowns ``-2``) and the
  background-class column;
- :mod:`openset_common.artefacts`: digests and fingerprints for cache keys, atomic writes, staging folders, the
  writable-folder check, SIGTERM as an exit;
- :mod:`openset_common.typed`: importing an object by its path, entry-point plug-ins, typed arguments.

This package imports nothing from the rest of the project.
"""
