# acceld: `make run` tries it, `make test` proves it. Both set up what they need.

PYTHON ?= python3
VENV ?= .venv
PORT ?= 6680
STATE_PATH ?= ./.acceld
PYTEST_ARGS ?=
# Test processes (pytest-xdist): most integration tests wait on real processes, so two
# workers finish the suite sooner even on 2 cores. 0 runs it in one process.
PYTEST_WORKERS ?= 2

BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.acceld-installed
STAMP_TEST := $(VENV)/.acceld-test-installed
# A real Keystone for the auth tests, in its own venv, plus its prepared template.
STAMP_KEYSTONE := .keystone/template-30.0.0/template.json
# A real Placement (openstack-placement 16.0.0 + gunicorn) for the integration tests.
PLACEMENT_VENV := .placement/venv
STAMP_PLACEMENT := $(PLACEMENT_VENV)/.installed

.PHONY: run test test-tools upstream nova bench bench-servers bench-scale venv clean gpu-wheelhouse samples

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(STAMP_RUN)

venv: $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/acceld all --port $(PORT) --state-path $(STATE_PATH)

$(STAMP_KEYSTONE): tests/support/keystone.py | $(STAMP_TEST)
	rm -rf .keystone/template-30.0.0
	$(BIN)/python -m tests.support.keystone

$(STAMP_PLACEMENT): tests/support/placement-requirements.txt
	rm -rf $(PLACEMENT_VENV)
	$(PYTHON) -m venv $(PLACEMENT_VENV)
	$(PLACEMENT_VENV)/bin/python -m pip install --quiet -r tests/support/placement-requirements.txt
	touch $@

# Upstream Cyborg 17.0.0 in .upstream/venv (bench/upstream.py), with the MariaDB and
# PostgreSQL drivers: the bench runs it, and the import tests (tests/db/test_cyborg_import.py)
# make and fill upstream's databases with its own code. About 30 s and 220 MB, once.
STAMP_UPSTREAM := .upstream/venv/.drivers-installed
$(STAMP_UPSTREAM): | $(STAMP_TEST)
	$(BIN)/python -c 'from bench import upstream; upstream.ensure_venv()'
	.upstream/venv/bin/python -m pip install --quiet --disable-pip-version-check \
		pymysql 'psycopg[binary]'
	touch $@

upstream: $(STAMP_UPSTREAM)

# Nova 34.0.0 in .nova/venv, for its own Cyborg client module (nova.accelerator.cyborg) in
# tests/integration/test_nova_client.py. About 40 s and 400 MB, once.
STAMP_NOVA := .nova/venv/.installed-34.0.0
$(STAMP_NOVA):
	rm -rf .nova/venv
	$(PYTHON) -m venv .nova/venv
	.nova/venv/bin/python -m pip install --quiet --disable-pip-version-check 'nova==34.0.0'
	touch $@

nova: $(STAMP_NOVA)

# Debian's headless Chromium + chromedriver (the dashboard test), promtool (the alert
# rules' checks) and haproxy (in front of the Galera cluster of tests/support/galera.py,
# with the machine's mariadb-server and galera-4), installed once where this runs as root with apt-get; elsewhere those
# tests skip with the reason. Marked done even when it could not install (no retry each run).
STAMP_TOOLS := $(VENV)/.acceld-test-tools
$(STAMP_TOOLS): | $(BIN)/python
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		pkgs="chromium chromium-driver prometheus haproxy galera-4 rsync"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$pkgs \
			>/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y --no-install-recommends $$pkgs >/dev/null; } \
		|| echo "make: chromium/chromium-driver/prometheus/haproxy/galera-4 not installed; their tests skip"; \
	else echo "make: not root or no apt-get: the browser and promtool tests skip"; fi
	touch $@

# sudo, for the privsep helper's rules through the real sudo (tests/integration/
# test_privsep_sudo.py), installed once where this runs as root with apt-get; elsewhere
# that test skips with the reason.
STAMP_SUDO := $(VENV)/.acceld-test-sudo
$(STAMP_SUDO): | $(BIN)/python
	@if command -v sudo >/dev/null && command -v visudo >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends sudo \
			>/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y --no-install-recommends sudo >/dev/null; } \
		|| echo "make: sudo not installed; the privsep sudo test skips"; \
	else echo "make: not root or no apt-get: the privsep sudo test skips without sudo"; fi
	touch $@

test-tools: $(STAMP_TOOLS) $(STAMP_SUDO)

test: $(STAMP_TEST) $(STAMP_KEYSTONE) $(STAMP_PLACEMENT) $(STAMP_TOOLS) $(STAMP_SUDO) \
		$(STAMP_UPSTREAM) $(STAMP_NOVA)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# wrk, the C load generator the benches drive the APIs with (Debian's package), installed
# once where this runs as root with apt-get; elsewhere bench.run falls back to its Python
# load generator and says so.
STAMP_WRK := $(VENV)/.acceld-bench-wrk
$(STAMP_WRK): | $(BIN)/python
	@if command -v wrk >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk \
			>/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y --no-install-recommends wrk >/dev/null; } \
		|| echo "make: wrk not installed; the benches use their Python load generator"; \
	else echo "make: not root or no apt-get: install wrk for the benches"; fi
	touch $@

# acceld against upstream Cyborg 17.0.0 (installed into .upstream/venv on first use), the bind
# latency, then the scale simulation; prints each goal with its margin and writes the table to
# docs/performance.md. Not part of `make test`.
bench: $(STAMP_TEST) $(STAMP_PLACEMENT) $(STAMP_WRK)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# The serving-layer comparison (issue 26): acceld's loop at several thread counts beside
# gunicorn's sync worker, uwsgi and granian (installed into .bench/granian on first use).
bench-servers: $(STAMP_TEST) $(STAMP_WRK)
	$(BIN)/python -m bench.server_compare $(SERVER_ARGS)

# Issue 15's scale bench: 2 conductors, 2 API processes, PostgreSQL (a database is made
# and dropped on ACCELD_BENCH_POSTGRES_URL's server), simulated nodes, binds throughout,
# kill -9 of one conductor. 10,000 nodes by default (issue 26's goals are stated there;
# about 8 minutes); SCALE_ARGS replaces the arguments, e.g. "--agents 2000" or
# "--agents 10000 --write-doc" to rewrite docs/performance.md's scale table.
SCALE_ARGS ?= --agents 10000
bench-scale: $(STAMP_TEST)
	$(BIN)/python -m bench.scale_ha $(SCALE_ARGS)

# nvidia-ml-py (pynvml) as one pure-Python wheel in bench/wheelhouse, for
# bench/gpu_discovery_check.sh on GPU machines without a package index: the wheel travels
# with the checkout and is imported from the zip as it is, nothing installed.
gpu-wheelhouse:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --dest bench/wheelhouse \
		'nvidia-ml-py>=12'

# etc/acceld/acceld.conf.sample and policy.yaml.sample from the code (the oslo generators);
# tests/unit/test_oslo_tools.py fails until they are regenerated after an option or rule changes.
samples: $(STAMP_RUN)
	$(BIN)/oslo-config-generator --config-file etc/acceld/acceld-config-generator.conf
	$(BIN)/oslopolicy-sample-generator --config-file etc/acceld/acceld-policy-generator.conf

clean:
	rm -rf $(VENV) $(STATE_PATH) .pytest_cache
