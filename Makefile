# make demo: a virtual environment, the offline pydocs corpus, a few minutes of gpt_tiny on CPU, a sample.
# make test: the test suite (CPU, gloo, offline).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 2

.venv/installed: requirements.txt
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
	touch .venv/installed

data/pydocs/train.bin: .venv/installed data/prepare.py
	$(PY) data/prepare.py --dataset pydocs

demo: .venv/installed data/pydocs/train.bin
	$(PY) train.py configs/gpt_tiny.py --device=cpu --init_from=auto
	$(PY) sample.py --out_dir=out/tiny --start="The dictionary" --num_samples=1 --max_new_tokens=120

test: .venv/installed
	$(PY) -m pytest -q --durations=8 tests

.PHONY: demo test
