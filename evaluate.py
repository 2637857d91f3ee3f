"""Evaluation entry point: one typed evaluation per command, parsed by jsonargparse (DESIGN.md §2).

    python evaluate.py oscr --model runs/p1-eos/checkpoints/best.ckpt [--devices 8 --strategy ddp]
    python evaluate.py severity --model timm:resnet50 --kappa softmax entropy odin --data imagenet \\
        --data-arg id_root=/data/ILSVRC2012/val --data-arg pool_root=/data/imagenet21k --data-arg pool_file=pool.csv
    python evaluate.py severity-plot runs/severity/*/severity.csv --output all.png
    python evaluate.py generate --model runs/p1-generators/near_ood/last.ckpt --num 10000 --output-dir data/p1-near-ood
    python evaluate.py generated --config configs/evaluate/fashion_generated.yaml
    python evaluate.py evg --config configs/evaluate/fashion_evg.yaml          # `adversarial` is an alias
    python evaluate.py report --config configs/evaluate/fashion_report.yaml    # all four, with intervals

Each command is the typed class of its method (:mod:`evaluation_methods`), a keyword-only dataclass: its options
are its fields, those of the option groups it inherits among them (:mod:`evaluation_engine.options`: model, data,
detectors, output, intervals, trainer), each checked by its type; ``--config`` takes a YAML file of the same keys (``class_path`` where a component is
configured), ``--print_config`` prints the whole configuration. Every command speaks one vocabulary:
``--model`` (a checkpoint, ``timm:NAME``, ``torchvision:NAME``, ``ensemble:FILE``), ``--data`` and
``--data-arg KEY=VALUE``, ``--kappa`` and ``--kappa-arg KAPPA.NAME=VALUE`` (``pood:KNN.k=50`` for a pytorch-ood
detector by name), ``--fit-data`` and ``--fit-arg KAPPA.NAME=VALUE`` (the fit set of fitted detectors and its
cap, ``knn.fraction=0.01``), ``--output-dir``,
``--cache-dir``, and the trainer's ``--accelerator``, ``--devices``, ``--strategy``, ``--precision``.
This file only translates that vocabulary for jsonargparse, parses, builds and runs.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import re
import sys
import typing
import warnings
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from datamodules.images import UnreadableImageError
from datamodules.shard_store import ShardError
from evaluation_engine import TrainerOptions
from evaluation_engine.options import add_command_arguments, command_options, section_type
from evaluation_engine.runner import release_peers
from evaluation_methods.registry import COMMAND_ALIASES, commands, methods
from report_card.card import RENAMED_SECTIONS, ReportCard, report


class Commands(collections.abc.Mapping):
    """The commands by name: every registered evaluation method's (:func:`evaluation_methods.registry.commands`,
    read when asked, so a method registered after this import is a command too) and ``report``."""

    def _all(self) -> dict[str, type]:
        return {**commands(), ReportCard.command: ReportCard}

    def __getitem__(self, name: str) -> type:
        return self._all()[name]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


COMMANDS = Commands()
ALIASES = COMMAND_ALIASES
# options given as repeated KEY=VALUE (or KIND.KEY=VALUE), collected into one typed dictionary
KEY_VALUE = {"data_arg": "data_args", "model_arg": "model_args", "kappa_arg": "kappa_args",
             "variation_arg": "variation_args", "sampler_arg": "sampler_args", "fit_arg": "fit",
             "set_root": "set_roots", "list": "lists"}
NESTED = {"kappa_args", "variation_args", "sampler_args", "fit"}
FLAGS = {"no_progress_bar": ("progress_bar", "false"), "no_plots": ("plots", "false")}
# the spellings of before one vocabulary, kept for one release
RENAMED = {"ckpt": "model", "id": "data", "id_arg": "data_arg"}
DROPPED = {"channels": "each model takes the images through its own input transform (channels, size)"}


class DeprecatedOption(FutureWarning):
    """An option of the old spelling; it still works for one release."""


def option_kinds(cls: type) -> tuple[set[str], set[str]]:
    """The list-valued and the boolean option names of a command (its own, its option groups' and the trainer's)."""
    hints = {**command_options(cls), **typing.get_type_hints(TrainerOptions)}
    lists = {name for name, hint in hints.items()
             if any(typing.get_origin(member) in (list, collections.abc.Sequence) for member in (hint, *typing.get_args(hint)))}
    return lists, {name for name, hint in hints.items() if hint is bool}


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"--{old.replace('_', '-')} is deprecated (kept for one release): use --{new.replace('_', '-')}",
                  DeprecatedOption, stacklevel=3)


def normalise(command: str, argv: list[str]) -> list[str]:
    """The command line in jsonargparse's terms: ``--foo-bar`` -> ``--foo_bar``; ``--data-arg K=V`` collected
    into ``--data_args {...}`` (values as YAML); several values of a list option into one list; the old
    spellings mapped, with a deprecation warning."""
    cls = COMMANDS[command]
    lists, flags = option_kinds(cls)
    out: list[str] = []
    collected: dict[str, dict[str, Any]] = {}
    tokens = list(argv)
    if cls.positional:  # the leading values are that option's (severity-plot's tables)
        positional = []
        while tokens and not tokens[0].startswith("--"):
            positional.append(tokens.pop(0))
        if positional:
            tokens = [f"--{cls.positional}", *positional, *tokens]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token in ("--help", "--print_config") or token.startswith("--print_config="):
            out.append(token)
            continue
        name, equals, inline = token[2:].partition("=")
        name = name.replace("-", "_")
        values = [inline] if equals else []
        while i < len(tokens) and not tokens[i].startswith("--") and (not equals):
            values.append(tokens[i])
            i += 1
        if name in RENAMED:
            _deprecated(name, RENAMED[name])
            name = RENAMED[name]
        if name in cls.renamed_options:  # the command's own old spellings
            name, message = cls.renamed_options[name]
            warnings.warn(message, DeprecatedOption, stacklevel=2)
        if name in FLAGS:
            name, value = FLAGS[name]
            out += [f"--{name}", value]
            continue
        if name in DROPPED:
            warnings.warn(f"--{name} is no longer needed and is ignored: {DROPPED[name]}", DeprecatedOption,
                          stacklevel=2)
            continue
        if name in cls.dropped_options:
            warnings.warn(f"--{name.replace('_', '-')} is no longer needed by {command} and is ignored: "
                          f"{cls.dropped_options[name]}", DeprecatedOption, stacklevel=2)
            continue
        if name in KEY_VALUE:
            target = KEY_VALUE[name]
            for value in values:
                key, sep, raw = value.partition("=")
                if not sep or not key:
                    raise SystemExit(f"--{name.replace('_', '-')} expects KEY=VALUE, got {value!r}")
                if target in NESTED:
                    kind, dot, field = key.rpartition(".")  # a κ may be a class path: NAME has no dot
                    if not dot or not field:
                        raise SystemExit(f"--{name.replace('_', '-')} expects KIND.NAME=VALUE (e.g. odin.temperature=1000), "
                                         f"got {value!r}")
                    collected.setdefault(target, {}).setdefault(kind, {})[field] = yaml.safe_load(raw)
                else:
                    collected.setdefault(target, {})[key] = raw  # parsed by jsonargparse (YAML)
            continue
        if name in flags and not values:  # a bare flag: --overwrite, --random-weights
            values = ["true"]
        if name in lists and not equals and (len(values) != 1 or not values[0].lstrip().startswith("[")):
            out += [f"--{name}", json.dumps([yaml.safe_load(v) if v else v for v in values])]
            continue
        out += [f"--{name}", *values]  # an unknown option is named by jsonargparse
    for target, entries in collected.items():
        if target in NESTED and any(not re.fullmatch(r"\w+", kind) for kind in entries):
            out += [f"--{target}", json.dumps(entries)]  # e.g. pood:KNN.k=50: a key no dotted path can name
        elif target in NESTED:
            out += [item for kind, fields in entries.items() for item in (f"--{target}.{kind}", json.dumps(fields))]
        else:
            out += [item for key, value in entries.items() for item in (f"--{target}.{key}", value)]
    return out


def summary(cls: type) -> str:
    """The one-line help of a command: its docstring's first paragraph without the ``evaluate.py x``: prefix,
    up to the first clause (never cut mid-sentence at a line break)."""
    text = " ".join((cls.__doc__ or "").split("\n\n")[0].split()).split(": ", 1)[-1]
    text = re.split(r" -- |; |, found by", text)[0].replace("``", "").replace(":mod:`", "").replace("`", "")
    return text.rstrip(".")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="evaluate.py", description=__doc__.split("\n\n")[0], env_prefix="EVALUATE",
                            default_env=False)
    subcommands = parser.add_subcommands(required=True, dest="command")
    for name, cls in COMMANDS.items():
        command = ArgumentParser(description=(cls.__doc__ or "").split("\n\n")[0])
        command.add_argument("--config", action=ActionConfigFile, help="a YAML file of these options")
        add_command_arguments(command, cls)
        if cls is ReportCard:  # a section per registered method: the options of its command, without the models
            foreign = ["model", *TrainerOptions.__dataclass_fields__]  # refused by the card, naming the section
            for key, method in methods().items():
                command.add_argument(f"--{key}", type=section_type(method.evaluation, foreign=foreign) | None,
                                     default=None,
                                     help=f"the {method.name} section: options of evaluate.py "
                                          f"{method.evaluation.command} (config: FILE takes them from that command's "
                                          "YAML, relative to the file that names it); left out: not run")
            for old, new in RENAMED_SECTIONS.items():
                command.add_argument(f"--{old}", type=section_type(methods()[new].evaluation, foreign=foreign) | None,
                                     default=None, help=f"the old name of --{new} (kept for one release)")
        if name != "severity-plot":
            command.add_class_arguments(TrainerOptions, None)
        subcommands.add_subcommand(name, command, help=summary(cls))
    return parser


def dataclass_options(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Options typed as a dataclass (``intervals``), which the parser gives as dotted keys
    (``intervals.level``), built into that dataclass (``None`` stays ``None``)."""
    for name, hint in command_options(cls).items():
        kinds = [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t)]
        prefix = f"{name}."
        fields = {k[len(prefix):]: values.pop(k) for k in list(values) if k.startswith(prefix)}
        if kinds and fields:
            values[name] = kinds[0](**fields)
    return values


def parse(argv: list[str]) -> tuple[str, Any]:
    """``(command, its typed evaluation)`` of a command line."""
    command = ALIASES.get(argv[0], argv[0]) if argv else ""
    if command not in COMMANDS:
        build_parser().parse_args(argv)  # the usage and the list of commands
        raise SystemExit(2)
    config = build_parser().parse_args([command, *normalise(command, argv[1:])])[command]
    values = dataclass_options(COMMANDS[command], {k: v for k, v in dict(config).items()
                                                   if k != "config" and not k.startswith("__")})
    fields = set(TrainerOptions.__dataclass_fields__)
    options = TrainerOptions(**{k: v for k, v in values.items() if k in fields}) if command != "severity-plot" else None
    cls = COMMANDS[command]
    if cls is ReportCard:  # each section is an option of its own on the line and in YAML
        values["sections"] = {key: values.pop(key) for key in [*methods(), *RENAMED_SECTIONS] if key in values}
    return command, cls(**{k: v for k, v in values.items() if k not in fields}, trainer=options)


def main(argv: list[str] | None = None) -> Any:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        methods()  # the installed plug-ins: one that does not load is named (its entry point and package), once
    except (ImportError, TypeError, ValueError) as error:
        raise SystemExit(f"evaluate.py: {error}") from None
    evaluation = None
    try:
        command, evaluation = parse(argv)
        return evaluation.run()
    except (ValueError, OSError, UnreadableImageError, ShardError) as error:
        # a torchrun node whose input failed at set-up first releases the nodes waiting for it
        release_peers(getattr(getattr(evaluation, "options", None), "accelerator", "auto"))
        raise SystemExit(f"evaluate.py {argv[0] if argv else ''}: {error}") from None


__all__ = ["COMMANDS", "main", "parse", "report"]


def close_process_group() -> None:
    """Destroy the run's process group (DDP's, gloo or NCCL) before the interpreter exits, as PyTorch asks of a
    program that made one: left to the interpreter's shutdown, its communication threads are torn down in no set
    order, which now and then aborted a finished two-process run ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    finally:
        close_process_group()
