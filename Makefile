# LLMs from scratch: two commands matter.
#   make lab   set up .venv (pinned), register the course kernel, start JupyterLab on the course
#              (student tools only; `make lab-instructor` adds nbgrader's instructor tools)
#   make test  the same setup, then the whole test suite (what CI runs)
#   make hub   a local JupyterHub on 127.0.0.1 with test users (a class to try; docs/classroom.md)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
REQ_HASH := $(shell cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(REQ_HASH)
KERNEL := $(VENV)/share/jupyter/kernels/llmcourse/kernel.json

# The offline data mirror: an explicit LLMCOURSE_DATA_MIRROR wins; else ../shared/data when present.
ifeq ($(origin LLMCOURSE_DATA_MIRROR), undefined)
  ifneq ($(wildcard ../shared/data/MANIFEST.md),)
    export LLMCOURSE_DATA_MIRROR := $(abspath ../shared/data)
  endif
endif
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=

.PHONY: lab lab-instructor test setup kernel lint release release-check notebooks test-fast test-notebooks test-browser browser-deps hub hub-deps doctor clean bench mutation

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) requirements.txt requirements-dev.txt pyproject.toml
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name llmcourse --display-name "Python 3 (LLM course)" >/dev/null

setup: $(STAMP) $(KERNEL)

kernel: $(KERNEL)

# lab-config/jupyter_server_config.py: JupyterLab's terminal gets .venv/bin first on its PATH (`course` works there)
LAB_ARGS = $(ROOT_FLAG) --config="$(CURDIR)/lab-config/jupyter_server_config.py" --ServerApp.root_dir="$(CURDIR)" \
	--LabApp.default_url=/lab/tree/course_home.ipynb
# lab-config/student/page_config.json disables nbgrader's instructor plugins (Create Assignment, Formgrader,
# Course List); the Validate button and the Assignment List stay. tests/browser/test_browser_check.py checks both.
STUDENT_LAB = --LabApp.app_settings_dir="$(CURDIR)/lab-config/student"

lab: setup
	$(VENV)/bin/jupyter-lab $(LAB_ARGS) $(STUDENT_LAB)

lab-instructor: setup
	$(VENV)/bin/jupyter-lab $(LAB_ARGS)

# Debian's Chromium for the browser tests (apt-get as root; Playwright itself is pinned in
# requirements-dev.txt and never downloads a browser). Without it the browser tests skip, saying why.
browser-deps:
	@bash .ci/install-browser.sh

# JupyterHub's proxy (configurable-http-proxy, from npm, the version hub/package-lock.json pins) into
# hub/node_modules, never globally. JupyterHub itself is pinned in requirements.txt. Without Node.js >= 20 and
# npm (Debian: apt-get install nodejs npm) or without the registry it says so and goes on: the hub's browser
# test then skips, saying why.
HUB_PROXY := hub/node_modules/.bin/configurable-http-proxy
HUB_STAMP := hub/node_modules/.installed-$(shell cat hub/package-lock.json | sha256sum | cut -c1-16)
hub-deps:
	@if [ -x $(HUB_PROXY) ] && [ -f $(HUB_STAMP) ]; then :; \
	elif ! command -v npm >/dev/null 2>&1; then \
		echo "hub-deps: npm not found; \`make hub\` and its browser test need Node.js >= 20 and npm" >&2; \
	else npm ci --prefix hub --no-audit --no-fund --loglevel=error && touch $(HUB_STAMP) \
		|| echo "hub-deps: npm ci failed; \`make hub\` and its browser test need hub/node_modules" >&2; fi

# A JupyterHub on 127.0.0.1:$(HUB_PORT) for a person to try the course as a class (coursetools/hub.py): students
# alice and bob, the instructor `instructor` (passwords printed); unit 03 released into its exchange; state in
# .hub/ (delete it to start afresh). Ctrl-C stops it and every user's server.
HUB_PORT ?= 8000
hub: setup hub-deps
	$(VENV)/bin/course hub --port $(HUB_PORT)

# The whole suite under the `ci` profile (what .ci/run calls): lint, tests/ (library, grader self-tests,
# release consistency, CLI, nbgrader round trip, browser, and a class on a local JupyterHub:
# tests/browser/test_browser_hub.py, whose proxy hub-deps installs), then the notebooks (nbval). One execution per
# lesson: the browser suite runs every lesson in JupyterLab and lists those that ran clean in
# $(BROWSER_LESSONS); the nbval step leaves exactly those out (root conftest.py, which prints what it did) and
# executes the solutions, the labs, and every lesson when the browser tests were skipped (no Chromium).
# The nbgrader round trip (tests/test_grading_attacks.py, marker `roundtrip`: `course grade` of the hostile corpus,
# about 5 minutes, mostly one core starting nbgrader and kernels) runs beside the nbval step, which has the other
# core; its log is printed when both are done, and either failing fails the target.
BROWSER_LESSONS := test-artifacts/browser-lessons.json
ROUNDTRIP_LOG := test-artifacts/roundtrip.log
test: setup browser-deps hub-deps
	$(VENV)/bin/ruff check llmcourse grader coursetools tests
	rm -f $(BROWSER_LESSONS) $(ROUNDTRIP_LOG)
	LLMCOURSE_PROFILE=ci $(PY) -m pytest --durations=15 -m "not roundtrip" $(PYTEST_ARGS)
	mkdir -p test-artifacts; \
	LLMCOURSE_PROFILE=ci $(PY) -m pytest --durations=5 -m roundtrip -p no:cacheprovider $(PYTEST_ARGS) \
		>$(ROUNDTRIP_LOG) 2>&1 & roundtrip=$$!; \
	LLMCOURSE_PROFILE=ci LLMCOURSE_BROWSER_LESSONS=$(BROWSER_LESSONS) $(PY) -m pytest --nbval-lax --nbval-current-env \
		-p no:cacheprovider -q lessons solutions; notebooks=$$?; \
	wait $$roundtrip; rt=$$?; \
	echo "---- nbgrader round trip (ran beside the notebooks; exit $$rt) ----"; cat $(ROUNDTRIP_LOG); \
	echo "notebooks (nbval) exit $$notebooks, round trip exit $$rt"; \
	test $$notebooks -eq 0 && test $$rt -eq 0

# Quick loop while developing: no notebooks, no nbgrader round trip, no browser.
test-fast: setup
	LLMCOURSE_PROFILE=ci $(PY) -m pytest -m "not notebooks and not roundtrip and not browser" $(PYTEST_ARGS)

# Every lesson, lab and solution by nbval, one after the other (the per-unit budget measurement; never skips lessons).
test-notebooks: setup
	LLMCOURSE_PROFILE=ci LLMCOURSE_BROWSER_LESSONS= $(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -q lessons solutions

test-browser: setup browser-deps hub-deps
	LLMCOURSE_PROFILE=ci $(PY) -m pytest -m browser $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check llmcourse grader coursetools tests

# Rebuild lessons/ and solutions/ notebooks from their sources in notebooks/.
notebooks: setup
	$(PY) -m coursetools.dev.nbbuild

# Regenerate exercises/ from solutions/ through nbgrader (refuses to overwrite edited copies).
release: setup
	$(VENV)/bin/course release

release-check: setup
	$(VENV)/bin/course release --check

# Speed benchmarks (not tests; run them on an idle machine): installs the peer implementations with --no-deps
# (requirements-bench.txt says why), then `course bench all` (train, decode with one uncached run, capstone: about
# 12 min on an idle 2-core machine); results and one report in test-artifacts/bench/ (report.md).
bench: setup
	$(PY) -m pip install --quiet --no-deps -r requirements-bench.txt
	$(VENV)/bin/course bench all

# Mutation testing of every graded exercise's check (not a test; an idle machine): each unit's full run stored in
# docs/grading-strength/uNN.json, then docs/grading-strength.md regenerated (coursetools/dev/mutation.py says how).
# UNITS="05 18" runs some units only; `make test` runs a seeded sample of two units (tests/test_mutation.py).
UNITS ?= $(shell seq -w 0 19)
mutation: setup
	for u in $(UNITS); do LLMCOURSE_PROFILE=ci $(PY) -m coursetools.dev.mutation $$u --store --jobs 2; done; \
	$(PY) -m coursetools.dev.mutation --report

doctor: setup
	$(VENV)/bin/course doctor

clean:
	rm -rf .grading test-artifacts .pytest_cache
