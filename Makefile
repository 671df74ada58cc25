# Two commands a user needs: `make demo` and `make test`. Both build .venv first.
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint clean-runs prometheus

venv: $(STAMP)

# DeepSpeed ships only as an sdist whose setup imports torch: install torch
# (the CPU wheel on disk) first, then build DeepSpeed without isolation so pip
# does not fetch a multi-GB CUDA torch just to build it. --no-compile, then
# compileall on every core: pip byte-compiles module by module on one core
# (~64 s here), compileall -j 0 takes ~36 s. The .pyc files are needed: CI sets
# PYTHONDONTWRITEBYTECODE=1, and without them every Ray worker compiles torch,
# ray and transformers from source at start-up (the Ray tests ran 2-2.5x longer).
# compileall exits 1 for the few files in the packages that are not Python 3
# source (test data, templates); those are never imported.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-compile --upgrade pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(VPY) -m pip install -q --no-compile torch==2.13.0
	DS_BUILD_OPS=0 $(VPY) -m pip install -q --no-compile --no-build-isolation deepspeed==0.19.8
	$(VPY) -m pip install -q --no-compile -e '.[dev]'
	$(VPY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	# DeepSpeed builds its CPU shared-memory comm op on first use in a stage worker (~30-45 s on 2 cores, again for
	# every new venv): build it here, into the directory the workers use (stages' start_worker). Without a compiler
	# the workers build nothing and DeepSpeed falls back to plain torch.distributed.
	TORCH_EXTENSIONS_DIR="$$($(VPY) -c 'from medgpt_ray.tiny import cache_root; print(cache_root() / "torch_extensions")')" \
	  $(VPY) -c 'from deepspeed.accelerator import get_accelerator; b = get_accelerator().create_op_builder("ShareMemCommBuilder"); b is None or b.load(verbose=False)' >/dev/null 2>&1 \
	  || echo "note: DeepSpeed's CPU comm op was not built now (no compiler?); a CPU stage with DeepSpeed builds or skips it"
	touch $(STAMP)

demo: venv
	RAY_TRAIN_ENABLE_PRINT_PATCH=0 $(VPY) jobs/pipeline.py --config configs/tiny-cpu.yaml

# The observability tests run a real Prometheus (Debian's package; promtool comes with it).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus)) >/dev/null; \
	  else echo "make test needs Prometheus: sudo apt-get install prometheus" >&2; exit 1; fi; }

# Our own modules byte-compiled too (PYTHONDONTWRITEBYTECODE=1 in CI: otherwise every Ray worker and pipeline
# driver the tests start compiles them from source, ~0.3 s a process).
test: venv prometheus
	$(VENV)/bin/ruff check medgpt_ray jobs tests data/sample bench
	$(VPY) -m compileall -q medgpt_ray jobs tests >/dev/null
	RAY_TRAIN_ENABLE_PRINT_PATCH=0 $(VENV)/bin/pytest -q tests/unit tests/stages tests/ray tests/e2e --durations=15

lint: venv
	$(VENV)/bin/ruff check medgpt_ray jobs tests data/sample bench
