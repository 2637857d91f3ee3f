"""The report card of the demo against the same four methods run one by one without pass sharing, one run.

(a) ``evaluate.py report --config configs/evaluate/fashion_report.yaml`` with a fresh, empty cache: every
    method shares the run's scoring passes (each (model, data set) pass once);
(b) the sum of the four commands it stands for (``oscr``, ``severity`` per model, ``generated``, ``evg``),
    each with its own passes and no cache, the same options.

Both start from the EvG chain results of ``make demo`` (copied into their own folders), so neither runs a
chain: the comparison is the passes, the metrics with their intervals and the writing. Needs ``make demo``
first; ``--tiny`` runs the OSCR and severity sections of a 5-step checkpoint on small data instead (seconds).

    python -m benchmarks.report_card [--tiny] [--write]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, finish, machine, parse, table

SECTION = "Report card"
CONFIG = Path("configs/evaluate/fashion_report.yaml")
CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]


def tiny_config(folder: Path) -> Path:
    """A report config of a 5-step demo checkpoint: OSCR and a small severity benchmark."""
    from tests.conftest import train_demo_checkpoint

    checkpoint = train_demo_checkpoint(folder / "demo", "eos")
    config = {"model": [str(checkpoint)], "kappa": ["softmax", "max_logit"], "open_set": {},
              "severity": {"data": "fashion", "data_args": {"estimation": 20, "test": 10}},
              "intervals": {"resamples": 100}}
    path = folder / "report.yaml"
    path.write_text(json.dumps(config))
    return path


def card_for(config: Path, folder: Path, *, cache: bool) -> Any:
    """The report card of ``config`` writing into ``folder`` (EvG chains copied there from the demo's)."""
    import evaluate

    _, card = evaluate.parse(["report", "--config", str(config), *CLI])
    card.output_dir = folder / "card"
    card.cache_dir = str(folder / "cache") if cache else None
    for name, options in card.section_options.items():
        if name == "evg":  # the demo's chains, so that no chain runs again
            source = Path(options.get("output_dir", "runs/evg"))
            target = folder / "evg"
            if (source / "chains").is_dir():
                shutil.copytree(source / "chains", target / "chains")
            options["output_dir"] = str(target)
        elif "output_dir" in options:
            options["output_dir"] = str(folder / name)
        options.pop("cache_dir", None)
    return card


def separately(card: Any) -> float:
    """The four commands one by one, each with its own passes and no cache; seconds."""
    from evaluation_engine.outputs import slug
    from evaluation_methods.registry import methods
    from lightning_modules.scoring import ScoringModel

    card.passes = None
    card.cache_dir = None
    start = time.perf_counter()
    models = {spec: ScoringModel(spec, pretrained=not card.random_weights) for spec in card.model}
    for name in card.section_options:  # each method's evaluations as the card plans them (the registry's runs)
        method = methods()[name]
        for planned in method.runs(models, card.section_detectors[name]):
            folder = card._folder(name) / slug(planned.name) if method.per_model else card._folder(name)
            card._evaluation(name, planned.model, planned.kappa, folder).run()
    return time.perf_counter() - start


def run(config: Path, work: Path) -> dict[str, Any]:
    card = card_for(config, work / "shared", cache=True)
    start = time.perf_counter()
    card.run()
    t_card = time.perf_counter() - start
    log = card.passes.log
    ran = sum(entry["source"] == "run" for entry in log)
    alone = card_for(config, work / "alone", cache=False)
    t_alone = separately(alone)
    row = {"card_s": t_card, "separately_s": t_alone, "requests": len(log), "run": ran,
           "sections": ", ".join(card.section_options), "models": len(card.model)}
    print(f"report card {t_card:.1f} s ({ran} passes run of {len(log)} asked); the commands one by one "
          f"{t_alone:.1f} s ({t_alone / t_card:.2f}x)", flush=True)
    return row


def markdown(row: dict[str, Any], config: str) -> str:
    return "\n".join([
        f"`evaluate.py report --config {config}` ({row['models']} models; sections {row['sections']}) with a fresh "
        "cache, against the same methods run as their own commands one by one (`oscr`, `severity` per model, "
        "`generated`, `evg`), each with its own passes and no cache, the same options; both start from the demo's "
        "EvG chain results (no chain runs), so the difference is the scoring passes. One run each, the same "
        f"process. Machine: {machine()}.",
        "",
        table(["report card (s)", "passes asked", "passes run", "four commands one by one (s)", "ratio"],
              [(f"{row['card_s']:.1f}", row["requests"], row["run"], f"{row['separately_s']:.1f}",
                f"{row['separately_s'] / row['card_s']:.2f}x")]),
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--config", default=str(CONFIG))
    args = parse(parser, argv)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        config = tiny_config(work) if args.tiny else Path(args.config)
        if not args.tiny and not Path("runs/demo/checkpoints/best.ckpt").is_file():
            raise SystemExit("the report card benchmark needs the demo's runs: run `make demo` first (or --tiny)")
        row = run(config, work)
    finish(args, SECTION, markdown(row, args.config if not args.tiny else "<tiny>"), script="benchmarks.report_card")
    return row


if __name__ == "__main__":
    main()
