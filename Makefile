# One-command set-up, demo and tests. Every target first does whatever set-up is missing:
# a virtual environment in .venv with the pinned Python packages, Debian's WordNet and Fashion-MNIST
# packages, and the offline WordNet corpus for NLTK. Set-up that is already done is skipped.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_STAMP := $(VENV)/.pip-installed
DEBIAN_STAMP := $(VENV)/.debian-packages
WORDNET := $(VENV)/share/nltk_data/corpora/wordnet/lexnames
DEBIAN_PACKAGES := wordnet-base wordnet-sense-index dataset-fashion-mnist
# the browser tier (tests/test_browser.py): Debian's headless Chromium and its matching chromedriver
BROWSER_STAMP := $(VENV)/.browser-packages
BROWSER_PACKAGES := chromium chromium-driver

.PHONY: setup demo demo-generated demo-evg demo-report test test-all lint docs benchmark clean

setup: $(PIP_STAMP) $(WORDNET)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch and torchvision first, pinned, so that no other package pulls a different build.
$(PIP_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# Install the Debian packages $(1) that are missing (apt-get; sudo when not root), then touch the stamp;
# without apt-get, say what to install: $(2).
define debian_packages
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    echo "Installing Debian packages:$$missing"; \
	    $$sudo apt-get update -q && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else \
	    echo "warning: no apt-get; install$$missing yourself ($(2))"; \
	  fi; \
	fi
	touch $@
endef

$(DEBIAN_STAMP): | $(PY)
	$(call debian_packages,$(DEBIAN_PACKAGES),WordNet 3.0 files and Fashion-MNIST IDX files)

$(BROWSER_STAMP): | $(PY)
	$(call debian_packages,$(BROWSER_PACKAGES),Chromium and its chromedriver for the browser tier)

$(WORDNET): $(DEBIAN_STAMP) $(PIP_STAMP)
	$(PY) -m datamodules.wordnet install

demo: setup
	$(PY) train.py fit --config configs/demo/fashion_mnist_eos.yaml
	$(PY) evaluate.py oscr --model runs/demo/checkpoints/best.ckpt --log-dir runs/demo --wandb-project openset-bench-demo
	$(PY) evaluate.py severity --model runs/demo/checkpoints/best.ckpt --data fashion \
		--kappa softmax max_logit entropy energy odin --output-dir runs/demo/severity --cache-dir runs/demo/cache \
		--log-dir runs/demo --wandb-project openset-bench-demo
	$(MAKE) --no-print-directory demo-generated
	$(MAKE) --no-print-directory demo-evg
	$(MAKE) --no-print-directory demo-report
	@echo "Demo done."
	@echo "  open-set report:  runs/demo/checkpoints/best-oscr/ (metrics.json, metrics.csv, oscr_curves.png, score_histograms.png)"
	@echo "  severity report:  runs/demo/severity/ (one table per confidence function, severity_auroc.png)"
	@echo "  OOD benchmark:    runs/demo/report/ood/ (sets.md: near, far, unit tests, full-spectrum; provenance.json; scores/)"
	@echo "  generated sets:   runs/demo/generated/ (report/sets.md: what the sets are; report/detectors.md; grids)"
	@echo "  EvG:              runs/demo/evg/ (results.md: clean vs worst-case AUROC, MinRank; transfer_*.png; grids/)"
	@echo "  report card:      runs/demo/report/index.html (every method, every number with its 95% interval)"
	@echo "  W&B offline runs: runs/demo/wandb/ (upload with: wandb sync runs/demo/wandb/offline-run-*)"

# Generated shifted and near-OOD sets (Mukhoti et al.): a 5-member ensemble (every member at least 0.90 accurate on
# the known classes' test images, checked as it is trained: --min-accuracy; the generators and the sets'
# description refuse an ensemble below its bar), the regularised generators and the plain ones (lambda = 0, the
# same budget), 500 images of each (the regularised ones also in pix2pix mode:
# dropout on, batch statistics), evaluated next to the real unknowns and digits; described and scored with a
# second, independently seeded ensemble, and described once more with the generators' own ensemble.
PLAIN := --model.init_args.lambda_perceptual=0 --model.init_args.lambda_semantic=0
GENERATE := --num 500 --overwrite --accelerator cpu --devices 1 --no-progress-bar
SETS := shift shift_plain near_ood near_ood_plain
demo-generated: setup
	$(PY) train.py ensemble --members 5 --seed 0 --min-accuracy 0.9 --out-dir runs/demo/ensemble \
		--config configs/ensemble/fashion_mnist.yaml
	$(PY) train.py fit --config configs/generators/fashion_shift.yaml --checkpoint_dir runs/demo/generators/shift
	$(PY) train.py fit --config configs/generators/fashion_shift.yaml --checkpoint_dir runs/demo/generators/shift_plain \
		$(PLAIN) --trainer.logger.init_args.name=shift-generator-plain
	$(PY) train.py fit --config configs/generators/fashion_near_ood.yaml --checkpoint_dir runs/demo/generators/near_ood
	$(PY) train.py fit --config configs/generators/fashion_near_ood.yaml --checkpoint_dir runs/demo/generators/near_ood_plain \
		$(PLAIN) --trainer.logger.init_args.name=near-ood-generator-plain
	$(PY) train.py ensemble --members 5 --seed 100 --min-accuracy 0.9 --out-dir runs/demo/ensemble_independent \
		--config configs/ensemble/fashion_mnist.yaml
	$(PY) evaluate.py generate $(GENERATE) --model $(SETS:%=runs/demo/generators/%/last.ckpt) --output-dir $(SETS:%=runs/demo/generated/%)
	$(PY) evaluate.py generate $(GENERATE) --mode pix2pix --model runs/demo/generators/shift/last.ckpt \
		runs/demo/generators/near_ood/last.ckpt --output-dir runs/demo/generated/shift_pix2pix runs/demo/generated/near_ood_pix2pix
	$(PY) evaluate.py generated --config configs/evaluate/fashion_generated.yaml --accelerator cpu --devices 1 --no-progress-bar
	$(PY) evaluate.py generated --config configs/evaluate/fashion_generated.yaml --accelerator cpu --devices 1 --no-progress-bar \
		--model ensemble:runs/demo/ensemble/ensemble.txt --kappa ensemble_mi --ensemble runs/demo/ensemble/ensemble.txt \
		--output-dir runs/demo/generated/report_training_ensemble

# EvG (Yoon et al.), the adversarial generation of outliers: the plain GAN on the digits (the GAN-latent variation model), then
# MH and random search over affine, colour and GAN-latent variations of the digits against the demo's model
# (softmax, max-logit, energy) and the ensemble's MI. Needs the ensemble of demo-generated.
demo-evg: setup
	$(PY) train.py fit --config configs/generators/digits_gan.yaml --checkpoint_dir runs/demo/generators/digits_gan
	$(PY) evaluate.py evg --config configs/evaluate/fashion_evg.yaml --accelerator cpu --devices 1 --no-progress-bar

# The OOD report card of the demo model and the ensemble across the four methods, with confidence intervals; it
# reuses the passes (runs/demo/cache) and the EvG chains (runs/demo/evg) the demo made. Needs demo-evg.
demo-report: setup
	$(PY) evaluate.py report --config configs/evaluate/fashion_report.yaml --accelerator cpu --devices 1 --no-progress-bar

lint: setup
	$(PY) -m ruff check .

# The default tier (what a developer runs after every change): unit tests and one integration test per
# LightningModule and callback, under 5 minutes on 2 cores.
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

# Every tier: the default one plus ddp (2 processes = 1 process), sweep (every config), journey (the ImageNet
# journey of docs/journey.md), benchmark (the benchmarks' tiny modes), docs (the site builds strictly, offline,
# and its links resolve) and browser (the report card in headless Chromium, which REQUIRE_BROWSER=1 turns from a
# skip into a failure when the browser is missing). CI runs this.
test-all: setup $(BROWSER_STAMP)
	$(PY) -m ruff check .
	REQUIRE_BROWSER=1 $(PY) -m pytest -m ""

# The documentation site (mkdocs.yml, docs/) into site/: strict (a broken link or reference fails it), offline,
# with file URLs, so site/index.html opens from the disk.
docs: setup
	$(PY) -m mkdocs build --strict --site-dir site

# Re-measure every CPU benchmark into benchmarks/RESULTS.md (each script also takes --tiny, a toy run that
# writes nothing). The GPU one, on a machine with CUDA: python -m benchmarks.gpu_throughput --write
benchmark: setup
	$(PY) -m benchmarks.oscr_benchmark --write
	$(PY) -m benchmarks.severity_benchmark --write
	$(PY) -m benchmarks.training_overhead --write
	$(PY) -m benchmarks.generators_benchmark --write
	$(PY) -m benchmarks.evg_sampler --write
	$(PY) -m benchmarks.intervals_benchmark --write
	$(PY) -m benchmarks.interval_coverage --write
	$(PY) -m benchmarks.ensemble_training --write
	$(PY) -m benchmarks.detectors_benchmark --write  # over an hour on 2 cores: --only a,b --write runs a part
	@if [ -f runs/demo/checkpoints/best.ckpt ]; then $(PY) -m benchmarks.report_card --write; \
	else echo "benchmarks.report_card needs the demo's runs: make demo first"; fi

clean:
	rm -rf runs site .pytest_cache .ruff_cache
