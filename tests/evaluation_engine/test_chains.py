"""EvG's chain results on disk (:class:`evaluation_engine.chains.ChainStore`): batches written in any order are
assembled in chain order, and a store that does not hold every chain once, or holds another split, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluation_engine.chains import ChainStore


def batch(first: int, stop: int) -> dict:
    chains = torch.arange(first, stop)
    return {"chains": chains, "results": {("d", "affine", "mh"): {
        "energy": chains.double() * 10, "points": torch.stack([chains, -chains], dim=1).double(),
        "trace_steps": torch.tensor([0, 5]), "trace_energy": torch.stack([chains.double(), chains.double() + 1]),
        "calls": torch.tensor(7)}}}


def test_batches_in_any_order_are_assembled_in_chain_order(tmp_path: Path) -> None:
    store = ChainStore(tmp_path / "run", chains=5)
    store.directory.mkdir()
    assert store.write(batch(3, 5)) == (3, 5) and store.write(batch(0, 3)) == (0, 3)
    assert store.file(0, 3).name == "chains-0000000-0000002.pt"
    assert store.done(0, 3) and store.done(3, 5) and not store.done(5, 7)
    result = store.assemble()[("d", "affine", "mh")]
    assert result["energy"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert result["points"][:, 1].tolist() == [0.0, -1.0, -2.0, -3.0, -4.0]
    assert result["trace_energy"].tolist() == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]
    assert result["trace_steps"].tolist() == [0, 5] and int(result["calls"]) == 7
    store.check_batches([(0, 3), (3, 5)])  # the split of the interrupted run: fine
    with pytest.raises(ValueError, match=r"chains-0000000-0000002.pt: 3 chains per batch"):
        store.check_batches([(0, 2), (2, 4), (4, 5)])


def test_missing_duplicated_and_unreadable_chains_are_refused(tmp_path: Path) -> None:
    store = ChainStore(tmp_path / "run", chains=4)
    store.directory.mkdir()
    with pytest.raises(RuntimeError, match="no chain results"):
        store.assemble()
    store.write(batch(0, 3))
    with pytest.raises(RuntimeError, match=r"cover 3 chains, expected 0..3 once each \(missing e.g. \[3\]\)"):
        store.assemble()
    store.write(batch(2, 4))  # chain 2 twice
    with pytest.raises(RuntimeError, match="cover 5 chains"):
        store.assemble()
    store.file(2, 4).write_bytes(b"not a chain file")
    assert not store.done(2, 4)
    with pytest.raises(RuntimeError, match=r"chains-0000002-0000003.pt is unreadable; delete it"):
        store.assemble()
