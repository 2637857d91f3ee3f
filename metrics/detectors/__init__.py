"""OOD detectors with fitted state (DESIGN.md §5.2): one interface, :class:`metrics.detectors.base.Detector`."""

from metrics.detectors.base import CHUNK_ROWS, Detector, DetectorNotFitted, Head, row_chunks

__all__ = ["CHUNK_ROWS", "Detector", "DetectorNotFitted", "Head", "row_chunks"]
