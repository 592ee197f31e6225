# Both targets set themselves up: a virtual environment in .venv with gpuq and its test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench lint clean

$(BIN)/gpuq: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench,rq]'
	touch $(BIN)/gpuq

# about 30 s: an embedded Valkey server, five simulated workers (one a two-GPU group) as real processes
demo: $(BIN)/gpuq
	$(BIN)/gpuq demo

# promtool checks deploy/prometheus/ (tests/integration/test_deploy.py) and a real Prometheus
# scrapes a worker and the exporter (tests/integration/test_prometheus.py): the ones on PATH,
# else Debian's, extracted once into .cache/promtool/ by scripts/promtool.sh, which stops
# `make test` with one line if it can get neither
WITH_PROMTOOL = GPUQ_PROMTOOL="$$(scripts/promtool.sh)" GPUQ_PROMETHEUS="$$(scripts/promtool.sh prometheus)"

# the whole suite on a real server the fixtures start, then the integration contract suite
# again on a one-node Redis Cluster (any key outside the pool's hash slot fails there), then
# the contract files on a three-master Cluster (pools spread over the masters)
CONTRACT = tests/integration/test_contract.py tests/integration/test_contract_handover.py \
	tests/integration/test_contract_leases.py
test: $(BIN)/gpuq
	scripts/promtool.sh >/dev/null
	scripts/promtool.sh prometheus >/dev/null
	$(WITH_PROMTOOL) $(BIN)/pytest
	$(WITH_PROMTOOL) GPUQ_TEST_CLUSTER=1 GPUQ_TEST_PREFIX=ci $(BIN)/pytest -m "not slow" tests/integration
	GPUQ_TEST_CLUSTER3=1 GPUQ_TEST_PREFIX=ci $(BIN)/pytest -m "not slow" $(CONTRACT)

bench: $(BIN)/gpuq
	$(BIN)/python scripts/bench_throughput.py

lint: $(BIN)/gpuq
	$(BIN)/pip install -q mypy ruff
	$(BIN)/ruff check gpuq workers
	$(BIN)/mypy gpuq

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis
