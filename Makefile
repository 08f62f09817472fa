# The two commands of the README:  `make` (set up, then the main job)  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: all setup demo test test-slow test-avx2 test-fast lint typecheck bench saelens-venv cross llama-cpp

all: demo

# a virtual environment with the pinned CPU build of torch and lumen installed in editable mode
$(BIN)/lumen: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(BIN)/lumen

setup: $(BIN)/lumen
	@# headless Chromium renders the lens HTML page in tests/test_report.py (Debian's package; skipped without it)
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium not installed: the HTML page test will be skipped (apt-get install -y chromium)"
	@# chromium-driver lets Selenium drive it: the explorer page and lumen serve are tested in the browser
	@command -v chromedriver >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq chromium-driver >/dev/null; } \
	  || echo "chromium-driver not installed: the explorer's browser tests will be skipped (apt-get install -y chromium-driver)"
	@# torch.compile's CPU backend writes C++ (the default training run is compiled; so are decoding tests)
	@command -v g++ >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq g++ >/dev/null; } \
	  || echo "g++ not installed: compiled runs fail, their tests are skipped (apt-get install -y g++, or --set compile=false)"
	@# ninja: torch.utils.cpp_extension builds lumen's block kernels (lumen/quant.cpp) with it
	@command -v ninja >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq ninja-build >/dev/null; } \
	  || echo "ninja not installed: decoding from GGUF blocks uses torch's slower formula (apt-get install -y ninja-build)"

# the main job on its built-in default
# (--resume: a second `make` continues or re-reports the run in runs/shakespeare instead of refusing it)
demo: setup
	$(BIN)/lumen train --preset shakespeare --resume

# the linter, the type checker, then the unit tests and one real-model smoke test per feature (CI runs this,
# via .ci/run: under 10 minutes on a busy 2-core machine), in one process per core (tests/conftest.py)
test: lint typecheck
	$(BIN)/python -m pytest -q -m "not slow" -n auto

# the slow tier: every real-model comparison, compiled paths, subprocesses and training runs, a fresh install,
# and every command of the README and docs as a newcomer types them (about half an hour on 2 cores); then, on x86-64,
# the default tier again as a CPU without AVX-512 runs it (test-avx2, below)
test-slow: setup saelens-venv cross llama-cpp
	$(BIN)/python -m pytest -q -m slow -n auto
	@if [ "$$(uname -m)" = x86_64 ]; then $(MAKE) --no-print-directory test-avx2; fi

# The default tier as an AVX2-only x86-64 CPU (an AMD Zen 1's flags) runs it, on any x86-64 machine: lumen deciding
# by those flags and building its kernels for them (lumen/runtime/cpu.py), torch's own kernels held to AVX2 (ATen's
# and torch.compile's code, oneDNN's, MKL's). The memory and clock stay this machine's. torch.compile's cache gets a
# folder of its own: its keys do not hold the instruction set, and code it wrote for AVX-512, built again for AVX2,
# computes half of each vector (wrong tokens).
AVX2_ONLY := LUMEN_CPU_FLAGS="avx avx2 fma f16c" ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  MKL_ENABLE_INSTRUCTIONS=AVX2 TORCHINDUCTOR_CACHE_DIR=$${TMPDIR:-/tmp}/lumen-inductor-avx2
test-avx2: setup
	$(AVX2_ONLY) $(BIN)/python -m pytest -q -m "not slow" -n auto

# ARM64's kernels are tested under emulation: Debian's cross compiler and qemu-user (skipped, named, without them)
cross:
	@command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || { command -v apt-get \
	  >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq g++-aarch64-linux-gnu \
	  qemu-user >/dev/null; } || echo "no cross compiler: the ARM64 kernel tests will be skipped \
	(apt-get install -y g++-aarch64-linux-gnu qemu-user)"

# sae-lens (with TransformerLens) in an environment of its own beside the same torch, outside the repo: the slow
# tier checks that dictionaries written by either library read in the other (tests/test_saelens_interop.py)
SAELENS := $(HOME)/.cache/lumen-tools/saelens
saelens-venv:
	test -x $(SAELENS)/bin/python || $(PY) -m venv $(SAELENS)
	$(SAELENS)/bin/python -c "import sae_lens" 2>/dev/null || { $(SAELENS)/bin/python -m pip install -q torch==2.13.0 \
	  && $(SAELENS)/bin/python -m pip install -q sae-lens==6.54.12 torch==2.13.0; }

# llama-cpp-python (llama.cpp compiled for this CPU) in the project's environment: `lumen verify` on a GGUF file
# compares lumen's logits with llama.cpp's through it (the slow tier: tests/test_gguf_llama_cpp.py). Its wheel is
# compiled once from the PyPI sdist into the user cache (~35 min on 2 busy cores: the library alone, no tools, no
# multimodal part) and installed from there. Built for x86-64's AVX2 (and AVX-512 where the CPU has it) but not
# AMX: GGML_NATIVE=ON crashed in AMX kernels on a VM that reports AMX without running it. Skipped, with a line
# saying so, where it cannot be built
LLAMA_CPP := $(HOME)/.cache/lumen-tools/wheels
LLAMA_CPP_VERSION := 0.3.36
AVX512 := $(if $(shell grep -ow avx512f /proc/cpuinfo 2>/dev/null | head -1),ON,OFF)
LLAMA_CPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=$(AVX512) -DGGML_AVX512_VBMI=$(AVX512) -DGGML_AVX512_VNNI=$(AVX512) -DGGML_AVX512_BF16=$(AVX512) \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
llama-cpp: setup
	@$(BIN)/python -c "import llama_cpp" 2>/dev/null || { ls $(LLAMA_CPP)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl \
	  >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(BIN)/python -m pip wheel -q --no-deps \
	  --no-binary llama-cpp-python -w $(LLAMA_CPP) llama-cpp-python==$(LLAMA_CPP_VERSION); $(BIN)/python -m pip install -q \
	  $(LLAMA_CPP)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl; } || echo "llama-cpp-python not built: the llama.cpp \
	comparisons of lumen verify are skipped (needs cmake and a C++ compiler)"

# the inner loop: the unit tests alone (no real model, no compiling)
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not smoke" -n auto

lint: setup
	$(BIN)/ruff check code tests bench

typecheck: setup
	$(BIN)/mypy

# speed against the anchors, measured in one run each; the last line renders docs/speed.md from docs/speed/*.json
bench: setup
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_smollm2.py
	$(BIN)/python bench/bench_lens.py
	$(BIN)/python bench/bench_contention.py
	$(BIN)/python bench/bench_llamacpp.py  # builds llama.cpp for this CPU once (cached outside the repo)
	$(BIN)/python bench/profile_decode.py
	$(BIN)/python bench/bench_fsdp_memory.py  # writes docs/scale-out.md
	$(BIN)/python bench/speed_doc.py  # renders docs/speed.md's measured sections from docs/speed/*.json
