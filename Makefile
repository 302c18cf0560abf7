# The two commands of the README:
#   make serve   set everything up (idempotent) and start the dev server on http://127.0.0.1:8000/
#   make test    set everything up, browser and test models included, and run every test (`full` ones skipped),
#                in PYTEST_WORKERS xdist workers (default 2; 0: one process), a test module to a worker
#   make test-full  the same with the `full` tests too (longer siblings of default cases; over an hour here)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2

.PHONY: serve test test-full venv system-deps setup-test clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	$(PY) -m pip install --disable-pip-version-check -q -e '.[$*]'
	touch $@

serve: $(VENV)/.installed-dev
	$(VENV)/bin/pyshim serve --setup --port $(PORT)

# Debian's Chromium (WebGPU through SwiftShader) and Mesa's Vulkan drivers (lavapipe, for wgpu).
system-deps:
	@if [ -x /usr/bin/chromium ] && ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then \
	  echo "[deps] chromium and mesa-vulkan-drivers present"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "[deps] installing chromium and mesa-vulkan-drivers with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium mesa-vulkan-drivers >/dev/null; \
	else \
	  echo "[deps] missing: run 'sudo apt-get install -y chromium mesa-vulkan-drivers'" >&2; exit 1; \
	fi

setup-test: system-deps $(VENV)/.installed-test
	$(VENV)/bin/pyshim setup --test-models

test: setup-test
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

test-full: setup-test
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25 --full $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) web/vendor
