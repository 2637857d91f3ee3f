"""How a generator runs when it writes a set: the generation mode (DESIGN.md §5.3).

The paper does not say; Pix2Pix (Isola et al., *Image-to-Image Translation with Conditional Adversarial
Networks*, CVPR 2017, §2.2 and §3) runs its generator at test time exactly as in training: dropout on (the
only noise of the U-Net) and batch normalisation with the statistics of the test batch. Two modes:

- ``"eval"``: ``module.eval()``: dropout off, batch normalisation with the running statistics; each image is
  a function of its input alone (batch size and process count do not matter).
- ``"pix2pix"``: dropout layers sample masks and batch normalisation uses the batch's own statistics, as a
  training-mode forward computes them, without updating the running statistics (nor
  ``num_batches_tracked``); an image then depends on the random numbers and on the other images of its batch.

:func:`generation_mode` sets a mode for a ``with`` block and restores every layer's state afterwards. The
``pix2pix`` layers are switched by forward hooks at the moment each layer runs, so a module whose own code
calls ``.eval()`` inside the block (a ``predict_step``) still runs them as in training.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

GenerationMode = Literal["eval", "pix2pix"]
GENERATION_MODES: tuple[str, ...] = ("eval", "pix2pix")


def check_generation_mode(mode: str) -> str:
    if mode not in GENERATION_MODES:
        raise ValueError(f"the generation mode must be one of {list(GENERATION_MODES)}, got {mode!r}")
    return mode


def _training_forward(layer: nn.Module, inputs: Any) -> None:
    """Before the layer runs: training behaviour; batch norm without running statistics (batch statistics,
    nothing updated)."""
    layer._generation_state = (layer.training, getattr(layer, "track_running_stats", None))  # type: ignore[assignment]
    layer.training = True
    if isinstance(layer, _BatchNorm):
        layer.track_running_stats = False


def _restore_layer(layer: nn.Module, inputs: Any, output: Any) -> None:
    training, track = layer._generation_state  # type: ignore[misc]
    layer.training = training
    if isinstance(layer, _BatchNorm):
        layer.track_running_stats = track
    del layer._generation_state


@contextmanager
def generation_mode(module: nn.Module, mode: str) -> Iterator[nn.Module]:
    """Run ``module`` in a generation mode (see the module docstring) inside the block.

    Args:
        module: the generator network (or a module holding it).
        mode: ``"eval"`` or ``"pix2pix"``.

    Yields:
        The module, in eval mode; with ``"pix2pix"`` its dropout and batch-norm layers run as in training,
        batch norm with batch statistics and untouched running statistics.

    On leaving the block every sub-module's ``training`` flag (and batch norm's ``track_running_stats``) is as
    it was, and no hook is left behind.
    """
    check_generation_mode(mode)
    flags = {sub: sub.training for sub in module.modules()}
    handles = []
    try:
        module.eval()
        if mode == "pix2pix":
            for layer in module.modules():
                if isinstance(layer, (_DropoutNd, _BatchNorm)):
                    handles.append(layer.register_forward_pre_hook(_training_forward))
                    handles.append(layer.register_forward_hook(_restore_layer, always_call=True))
        yield module
    finally:
        for handle in handles:
            handle.remove()
        for sub, training in flags.items():
            sub.training = training
