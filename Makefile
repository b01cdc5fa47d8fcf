# make demo: a venv with the runtime set (requirements.txt), the offline pydocs corpus, a few
#   minutes of gpt_tiny on CPU (its val loss before and after), ten short samples.
# make check: the fast tier of make test (minutes), after an edit.
# make test: adds the test set (requirements-dev.txt) to that venv; the test suite (CPU, gloo,
#   offline). Both install the versions the tests passed with (constraints.txt);
#   tests/smoke_torch211.sh runs the lowest versions requirements*.txt allow.
PY := .venv/bin/python
PIP_INSTALL := .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt
export OMP_NUM_THREADS ?= 2

# A marker per set: `make demo` then `make test` installs only what the test set adds; a changed
# requirements file or constraints.txt installs into the venv that is there (no rebuild).
.venv/runtime: requirements.txt constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP_INSTALL) -r requirements.txt
	touch $@

.venv/dev: .venv/runtime requirements-dev.txt
	$(PIP_INSTALL) -r requirements-dev.txt
	touch $@

# order-only: new package versions do not make a new corpus. make runs it when train.bin is
# missing or older than prepare.py: then a new set replaces it (--overwrite)
data/pydocs/train.bin: data/prepare.py | .venv/runtime
	$(PY) data/prepare.py --dataset pydocs --overwrite

demo: .venv/runtime data/pydocs/train.bin
	$(PY) train.py configs/gpt_tiny.py --device=cpu --init_from=auto \
	    --optimizer=muon --muon_weight_decay=0.1
	$(PY) sample.py --out_dir=out/tiny --start="The dictionary" --num_samples=10 \
	    --max_new_tokens=100 --top_k=40

# Two workers (pytest-xdist): most tests wait on the processes they start, so two keep both cores
# busy (26 min on one, 17 on two, 25 on three, on a 2-core machine: bench/RESULTS.md).
# TEST_WORKERS=0 runs them in this process. Then the tests that time this machine's speed, on one
# worker with nothing else of the suite (ALONE in tests/conftest.py).
TEST_WORKERS ?= 2
test: .venv/dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=8 -m 'not alone' tests
	$(PY) -m pytest -q -n 0 -m alone tests

# The fast tier a researcher runs after an edit: each kind of claim once, at its smallest size
# (CHECK in tests/conftest.py; docs/testing.md has its time).
check: .venv/dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m check tests

.PHONY: demo test check
