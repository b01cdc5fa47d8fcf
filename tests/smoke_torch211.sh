#!/usr/bin/env bash
# The GPU host has torch 2.11 (nothing can be installed there), the bottom of requirements.txt's range. This
# smoke runs the whole path once on torch 2.11, on CPU and offline: prepare a corpus (.txt, .jsonl,
# .parquet; and the openwebtext path, on a local copy of the hub's files), train 3 steps on 2
# gloo ranks under fsdp+offload with a checkpoint, resume it under ddp on 1 rank to step 5, sample,
# export to transformers and load the export back, a wandb run offline, tests/test_plot.py; then
# torchrun's elastic agents, one leaving and one joining. Any step that fails exits non-zero.
# Every other package is at the LOWEST version requirements*.txt allow (each ">=" bound), so the
# bottom of the ranges is tested here and the top (constraints.txt) by `make test`.
#   bash tests/smoke_torch211.sh        (SMOKE_KEEP=1 keeps its temporary directory)
#   bash tests/smoke_torch211.sh --venv-only   builds the venv and stops (.ci/run: during the tests)
# The index has no CPU build of 2.11: pip takes the CUDA one (~4.7 GB with nvidia-*, triton), which
# runs on CPU. The venv .venv-torch211 is kept and reused while its marker matches SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=.venv-torch211
PY=$ROOT/$VENV/bin/python

now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.1f\", $(now) - $1 }"; }
fail() { echo "smoke_torch211: FAIL: $*" >&2; exit 1; }
T_START=$(now)

# torch 2.11 and the lower bound of every other range: "numpy>=1.26.4,<3" installs numpy==1.26.4
REQS=(requirements.txt requirements-dev.txt)
unbounded=$(grep -hvE '^[[:space:]]*(#|-r[[:space:]]|$)|>=' "${REQS[@]}" || true)
[[ -z $unbounded ]] || fail "no lower bound (>=) to test in ${REQS[*]}: $unbounded"
SPEC="$(sed -nE 's/^([A-Za-z0-9_.-]+)>=([^, #]+).*/\1==\2/p' "${REQS[@]}" | sed 's/^torch==.*/torch==2.11.0/' | xargs)"

# -- the venv -----------------------------------------------------------------------------------
t0=$(now)
if [[ -f $VENV/installed && $(cat $VENV/installed) == "$SPEC" ]] && [[ -x $PY ]]; then
    echo "reusing $VENV"
else
    echo "building $VENV: pip install $SPEC"
    [[ -x $PY ]] || python3 -m venv $VENV
    # the log only on failure: pip's warnings about this host's index would drown the smoke's lines
    $VENV/bin/pip install -q --disable-pip-version-check $SPEC >$VENV/pip.log 2>&1 ||
        { tail -n 30 $VENV/pip.log >&2; fail "pip install into $VENV (log: $VENV/pip.log)"; }
    echo "$SPEC" >$VENV/installed
fi
T_INSTALL=$(since "$t0")
version=$("$PY" -c 'import torch; print(torch.__version__)') ||
    fail "torch does not import in $VENV"
[[ $version == 2.11.* ]] || { rm -f $VENV/installed; fail "$VENV has torch $version, not 2.11"; }
echo "torch $version ($PY), venv ready in ${T_INSTALL}s"
echo "installed: $SPEC"
[[ ${1:-} == --venv-only ]] && exit 0

# -- the run, in a temporary directory ------------------------------------------------------------
T_RUN=$(now)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/smoke_torch211.XXXXXX")
[[ ${SMOKE_KEEP:-0} == 1 ]] && echo "keeping $TMP" || trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
OUT=$TMP/out
# offline: the tokenizer from the repository's BPE files, no hub, no wandb, an empty HF cache of its own
export TIKTOKEN_CACHE_DIR='' HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export HF_HOME=$TMP/hf_home
export PYTHONPATH=$ROOT  # the checks import model.py and tests/trainer.py

run() {  # run NAME LOG CMD...: CMD's output goes to LOG, shown (its end) when CMD fails
    local name=$1 log=$2 t=$(now)
    shift 2
    "$@" >"$log" 2>&1 || { local rc=$?; tail -n 40 "$log" >&2; fail "$name: exit $rc from: $*"; }
    echo "ok: $name ($(since "$t")s)"
}
check() {  # check NAME PYTHON: an inline check under the smoke's torch; asserts say what's wrong
    local name=$1
    "$PY" -c "$2" 2>check.err || { tail -n 5 check.err >&2; fail "$name"; }
}

# A corpus of this repository's own sources, one .txt document each: offline and a few seconds.
mkdir corpus
for f in "$ROOT"/*.py "$ROOT"/data/prepare.py "$ROOT"/tests/*.py "$ROOT"/README.md; do
    cp "$f" "corpus/$(basename "$(dirname "$f")")_$(basename "$f").txt"
done
n_docs=$(ls corpus | wc -l)  # one a file; as many after the .jsonl and .parquet take some
# the tests' sources as one .jsonl, README.md and prepare.py as a .parquet (written by pyarrow)
check "making the .jsonl and .parquet inputs" "
import glob, json, os, pyarrow as pa, pyarrow.parquet as pq
tests = sorted(glob.glob('corpus/tests_*.txt'))
with open('corpus/tests.jsonl', 'w') as f:
    for p in tests:
        f.write(json.dumps({'text': open(p).read(), 'path': p}) + '\n')
more = glob.glob('corpus/*_README.md.txt') + ['corpus/data_prepare.py.txt']
assert len(tests) > 1 and len(more) == 2, (tests, more)
pq.write_table(pa.table({'text': [open(p).read() for p in more]}), 'corpus/more.parquet')
for p in tests + more:
    os.remove(p)
"
run prepare prepare.log "$PY" "$ROOT/data/prepare.py" --input corpus --name smoke --out_dir data \
    --val_fraction 0.2 --num_proc 1
[[ -s data/smoke/train.bin && -s data/smoke/val.bin ]] ||
    fail "prepare: no data/smoke/{train,val}.bin"
check "prepare: every .txt, .jsonl and .parquet document, its tokens as tiktoken's" "
import glob, json, numpy as np, pyarrow.parquet as pq
from hetgpt.data.tokenizer import gpt2_encoding
texts = [open(p).read() for p in glob.glob('corpus/*.txt')]
texts += [json.loads(l)['text'] for l in open('corpus/tests.jsonl')]
texts += pq.read_table('corpus/more.parquet').column('text').to_pylist()
meta = json.load(open('data/smoke/meta.json'))
assert len(texts) == $n_docs, f'{len(texts)} documents made, want $n_docs'
assert meta['train_docs'] + meta['val_docs'] == len(texts), f'{meta} for {len(texts)} documents'
n = sum(len(gpt2_encoding().encode_ordinary(t)) + 1 for t in texts)  # + <|endoftext|> each
got = sum(np.fromfile(f'data/smoke/{s}.bin', dtype=np.uint16).size for s in ('train', 'val'))
assert got == n == meta['train_tokens'] + meta['val_tokens'], f'{got} tokens written, want {n}'
"
# --dataset openwebtext on a local copy laid out as the hub's repository (its script beside)
mkdir -p owt/plain_text
echo "raise SystemExit('the loading script ran')" >owt/openwebtext.py
check "making the openwebtext stand-in" "
import pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({'text': [f'document {i}: ' + 'words ' * i for i in range(1, 41)]}),
               'owt/plain_text/train-00000-of-00001.parquet')
"
run "prepare --dataset openwebtext (a local copy of the hub's files)" owt.log "$PY" \
    "$ROOT/data/prepare.py" --dataset openwebtext --input owt --out_dir data --val_fraction 0.25 \
    --num_proc 1
check "openwebtext: the stand-in's 40 documents in train and val, their tokens as tiktoken's" "
import json, numpy as np
from hetgpt.data.tokenizer import gpt2_encoding
meta = json.load(open('data/openwebtext/meta.json'))
assert meta['train_docs'] + meta['val_docs'] == 40 and 0 < meta['val_docs'] < 40, meta
enc = gpt2_encoding()
n = sum(len(enc.encode_ordinary(f'document {i}: ' + 'words ' * i)) + 1 for i in range(1, 41))
got = sum(np.fromfile(f'data/openwebtext/{s}.bin', dtype=np.uint16).size for s in ('train', 'val'))
assert got == n, f'{got} tokens written, want {n}'
"

TRAIN=("$ROOT/train.py" "$ROOT/configs/gpt_tiny.py" --device=cpu --dtype=float32 --compile=False
       --dataset=smoke "--out_dir=$OUT" --batch_size=4 --eval_interval=3 --eval_iters=1
       --log_interval=1 --checkpoint_interval=3)
# (a) 2 gloo ranks, fsdp+offload, each rank making its own shard (meta: the 70B path), 3 steps,
# a checkpoint at 3
OMP_NUM_THREADS=1 run "train fsdp+offload on 2 ranks" train_a.log "$PY" -m torch.distributed.run \
    --standalone --nproc_per_node=2 "${TRAIN[@]}" --plan=fsdp+offload --init_device=meta \
    --max_iters=3
check "train (a): checkpoint and metrics of 3 steps under fsdp+offload" "
import json, math
rows = [json.loads(l) for l in open('$OUT/metrics.jsonl')]
plans = [(r['iter'], r['plan']) for r in rows if 'plan' in r]
assert plans == [(0, 'fsdp+offload')], f'plan rows {plans}, want [(0, fsdp+offload)]'
losses = {r['iter']: r['loss'] for r in rows if 'loss' in r}
assert sorted(losses) == [1, 2, 3], f'loss rows at {sorted(losses)}, want 1, 2, 3'
assert all(math.isfinite(v) for v in losses.values()), f'non-finite loss {losses}'
meta = json.load(open('$OUT/ckpt_00000003/hetgpt.json'))
assert meta['iter'] == 3 and meta['config']['plan'] == 'fsdp+offload', meta['iter']
"
# (b) resume under ddp on 1 rank, to step 5
run "resume under ddp on 1 rank" train_b.log "$PY" "${TRAIN[@]}" --plan=ddp --init_from=resume \
    --max_iters=5
grep -Eq "resumed from $OUT/ckpt_00000003 \([0-9.]+ MB in [0-9.]+ s\) at iter 3" train_b.log ||
    fail "resume: no 'resumed from $OUT/ckpt_00000003 at iter 3' in train.py's output"
check "resume (b): metrics continue from 3 to 5 under ddp" "
import json, math
rows = [json.loads(l) for l in open('$OUT/metrics.jsonl')]
plans = [(r['iter'], r['plan']) for r in rows if 'plan' in r]
assert plans == [(0, 'fsdp+offload'), (3, 'ddp')], f'plan rows {plans}'
losses = {r['iter']: r['loss'] for r in rows if 'loss' in r}
assert sorted(losses) == [1, 2, 3, 4, 5], f'loss rows at {sorted(losses)}, want 1 to 5'
assert all(math.isfinite(v) for v in losses.values()), f'non-finite loss {losses}'
assert losses[4] < losses[1], f'loss at 4 not below loss at 1 (weights not resumed?): {losses}'
assert max(r['iter'] for r in rows if 'val_loss' in r) == 5, 'no val loss at iter 5'
assert json.load(open('$OUT/ckpt_00000005/hetgpt.json'))['iter'] == 5
"
# (c) sample a few tokens from the latest checkpoint
run sample sample.log "$PY" "$ROOT/sample.py" "--out_dir=$OUT" --device=cpu --start="def main(" \
    --num_samples=1 --max_new_tokens=8
grep -q "loaded $OUT/ckpt_00000005" sample.log || fail "sample: did not load $OUT/ckpt_00000005"
grep -q '^def main(' sample.log && grep -q '^---------------$' sample.log ||
    fail "sample: no 'def main(...' sample followed by its separator in the output"
# (d) export to transformers, and read the export back: same logits as the checkpoint
run "export_hf" export.log "$PY" "$ROOT/sample.py" "--out_dir=$OUT" --device=cpu \
    "--export_hf=$TMP/hf"
check "export (d): the HF export loads and computes the checkpoint's logits" "
import json, torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
from model import GPT, config_from
from tests.trainer import load_params
sd = load_file('$TMP/hf/model.safetensors')
assert sd['transformer.wte.weight'].shape[0] == 50257, 'export vocab is not GPT-2 50257'
hf = GPT2LMHeadModel.from_pretrained('$TMP/hf').eval()
params = load_params('$OUT/ckpt_00000005')
model = GPT(config_from(json.load(open('$OUT/ckpt_00000005/hetgpt.json'))['model_args']))
model.load_state_dict(params)
idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    theirs, ours = hf(idx).logits, model.eval()(idx)[0][:, :, :50257]
torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
"
echo "ok: export read back by safetensors and transformers, logits match"
if [[ -f $TMP/hf/tokenizer.json ]]; then  # the export has GPT-2's tokenizer (a 50257 vocab)
    check "export (d): transformers' tokenizer of the export gives tiktoken's ids" "
from transformers import AutoTokenizer
from hetgpt.data.tokenizer import gpt2_encoding
text = 'def main(argv):\\n    return {\\'caf\\u00e9\\': 1} <|endoftext|>'
ids = AutoTokenizer.from_pretrained('$TMP/hf').encode(text)
assert ids == gpt2_encoding().encode(text, allowed_special='all'), ids
"
    echo "ok: the export's tokenizer gives tiktoken's ids"
else
    echo "note: the export has no tokenizer.json: its tokenizer not checked"
fi
# (e) init_from=gpt2 offline, with no HF cache: one line (hf.py against huggingface_hub's errors)
rc=0
"$PY" "$ROOT/sample.py" --init_from=gpt2 --device=cpu --max_new_tokens=1 >gpt2.log 2>&1 || rc=$?
[[ $rc == 2 && $(wc -l <gpt2.log) == 1 ]] &&
    grep -q '^error: cannot load gpt2 from the Hugging Face hub (offline' gpt2.log ||
    { tail -n 5 gpt2.log >&2; fail "init_from=gpt2 offline: exit $rc, not one 'error: ...' line"; }
echo "ok: init_from=gpt2 offline is one line"
# (f) wandb: an offline run through train.py's metrics (hetgpt.run.metrics.Metrics), one row logged
WANDB_MODE=offline run "wandb offline run" wandb.log "$PY" -c "
import os
from hetgpt.run.metrics import Metrics
os.makedirs('wb')
m = Metrics('wb', 0, {'iter': 0, 'plan': 'ddp'}, dict(project='smoke', name='smoke', config={}))
assert m.wandb is not None, 'wandb.init failed (its reason is the line above)'
m({'iter': 1, 'loss': 2.71828})
m.finish()
"
check "wandb: the row in the run's offline log" "
import glob  # read after the run's process ended: its wandb-core writes the log on teardown
logs = glob.glob('wb/wandb/offline-run-*/run-*.wandb')
assert len(logs) == 1 and b'2.71828' in open(logs[0], 'rb').read(), f'no logged row in {logs}'
"
# (g) plot.py under its tests (the lowest pytest and matplotlib)
run "pytest tests/test_plot.py" pytest.log "$PY" -m pytest -q -p no:cacheprovider \
    "$ROOT/tests/test_plot.py"
# (h) elastic agents: one machine leaves, another joins (the rendezvous of torch 2.11 itself)
run "elastic: a machine leaves, another joins" elastic.log "$PY" "$ROOT/bench/elastic.py" \
    --rdzv_conf=last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3 --max_iters=120
grep -q '^leave: ' elastic.log && grep -q '^join: ' elastic.log ||
    fail "elastic: no leave and join timings in its output"

echo "smoke_torch211: passed on torch $version in $(since "$T_START")s" \
     "(venv ${T_INSTALL}s, run $(since "$T_RUN")s)"
