# The two commands a new user needs: `make demo` and `make test`.
# Both set up what they need first (scripts/bootstrap.sh, idempotent).
.PHONY: demo test test-engines test-engines-only test-fast test-pythons lint bootstrap bench bench-check clean protos install uninstall faults fleet

PYTEST_ARGS ?=
# builtin: the seed-shaped scenario engine; transformers: HF transformers'
# continuous batching on torch CPU (the bootstrap then installs the engines
# extra, ~1 min the first time); vllm: vLLM's CPU build, engine core and
# worker processes (the bootstrap installs the vllm extra, ~2-4 min).
DEMO_ENGINE ?= builtin
# DEMO_AB=1: the builtin engine twice, as is and with gc.freeze() after
# warm-up, then `stallscope compare --arm` of the two.
DEMO_AB ?=

bootstrap:
	@scripts/bootstrap.sh

demo:
	@STALLSCOPE_ENGINES=$(if $(filter transformers,$(DEMO_ENGINE)),1,$(STALLSCOPE_ENGINES)) \
		STALLSCOPE_VLLM=$(if $(filter vllm,$(DEMO_ENGINE)),1,$(STALLSCOPE_VLLM)) scripts/bootstrap.sh
	.venv/bin/stallscope demo --engine $(DEMO_ENGINE) $(if $(filter 1,$(DEMO_AB)),--ab) $(DEMO_ARGS)

# Lint and format check first (ruff, pinned in the test extra; config in
# pyproject.toml), then the suite.
LINT_PATHS = daemon probe_client tests bench scripts

# The suite without the real-engine tests, then those (make test-engines).
test: bootstrap lint
	.venv/bin/python -m pytest --ignore=tests/engines $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-engines-only

# The real-engine tests alone (tests/engines: HF transformers, vLLM's CPU
# build; ~2 min here, most of it vLLM's start-up): the engines and vllm
# extras are installed first. A missing extra is a skip, a failure with
# STALLSCOPE_REQUIRE_ENGINES=1 / STALLSCOPE_REQUIRE_VLLM=1 (as in CI).
test-engines:
	@STALLSCOPE_ENGINES=1 STALLSCOPE_VLLM=1 scripts/bootstrap.sh
	@$(MAKE) --no-print-directory test-engines-only

# (pytest's closing line is their time, apart from the rest's)
test-engines-only:
	.venv/bin/python -m pytest tests/engines $(PYTEST_ARGS)

# What needs no daemon process and no root (tests/helpers/markers.py enforces
# the markers), on both cores (nothing timing-sensitive is in it): about two
# minutes here, for the edit-test loop.
test-fast: bootstrap lint
	.venv/bin/python -m pytest -m "not daemon and not privileged" -n 2 $(PYTEST_ARGS)

# The probe client's tests on every supported interpreter found (pyenv's
# 3.10-3.13, Debian's /usr/bin/python3; venvs made by the bootstrap under
# .venv-pythons/), and `stallscope run` on a 3.9 that it must leave alone.
# Part of `make test` (tests/pythons/ is in the suite); this runs only it.
# STALLSCOPE_REQUIRE_PYTHONS=1 (CI) turns a missing interpreter into a failure.
test-pythons: bootstrap
	.venv/bin/python -m pytest tests/pythons tests/run/test_old_pythons.py $(PYTEST_ARGS)

lint: bootstrap
	.venv/bin/ruff check $(LINT_PATHS)
	.venv/bin/ruff format --check $(LINT_PATHS)

# The fault, load and security suite at full size (~13 min; RELIABILITY.md).
# A CI-sized subset runs inside `make test`.
faults: bootstrap
	.venv/bin/python -m pytest tests/faults --full $(PYTEST_ARGS)

# The fleet export read by a real Apache Spark (pyspark in local mode, Java
# 17): two traced hosts exported to Parquet, the same answer from Spark and
# DuckDB (docs/export.md; ~2-3 min). Installs the `fleet` extra first; a
# missing Spark is a failure here, not a skip.
fleet:
	@STALLSCOPE_FLEET=1 scripts/bootstrap.sh
	STALLSCOPE_REQUIRE_FLEET=1 .venv/bin/python -m pytest tests/export $(PYTEST_ARGS)

bench: bootstrap
	.venv/bin/python bench/run_all.py

# The BENCHMARKS.md rows whose covered paths changed since the commit they
# were measured at (bench/check.py); prints none when every row is current.
bench-check:
	python3 bench/check.py

protos: bootstrap
	scripts/gen_protos.sh

clean:
	rm -rf .venv .venv-pythons build *.egg-info

# Install as a systemd service on this host (units, config, sysusers/tmpfiles,
# a venv under /opt/stallscope); see docs/systemd.md. Not via bootstrap: the
# script builds its own venv from the system Python.
install:
	scripts/install.sh $(if $(DESTDIR),--root $(DESTDIR)) $(INSTALL_ARGS)

uninstall:
	scripts/install.sh --uninstall $(if $(DESTDIR),--root $(DESTDIR)) $(INSTALL_ARGS)
