"""
sample.py --export_hf writes a complete transformers directory: a checkpoint trained a few steps on
Python documentation (data/prepare.py, train.py), exported, then read offline by AutoTokenizer,
AutoModelForCausalLM and pipeline('text-generation'), whose greedy text is sample.py's greedy text;
AutoTokenizer's ids are tiktoken's. A model of another vocabulary gets weights only, and says so.
"""
import json
import os
import subprocess
import sys

import pytest

from make_ckpt import make_checkpoint
from trainer import run_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFLINE = {'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'TIKTOKEN_CACHE_DIR': '',
           'PYTHONIOENCODING': 'utf-8', 'OMP_NUM_THREADS': '1', 'PYTHONWARNINGS': 'ignore'}
TOKENIZER = ['merges.txt', 'special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json',
             'vocab.json']
WEIGHTS = ['config.json', 'generation_config.json', 'model.safetensors']
PROMPT = 'Return the'  # and new tokens within block_size: HF's GPT-2 has no positions past it
TEXTS = ['Hello world', 'def f(x):\n\treturn x ** 2  # square\n\n\n', "It's 3.14159, isn't it?",
         'naïve café — €3.50, 東京 🐍 \u200b', '   leading and trailing spaces   ',
         'a<|endoftext|>b', '<|endoftext|>', 'x' * 300, '12345678901234567890',
         'Ünïcödé\r\nwith CRLF']


def run(cwd, *cmd):
    r = subprocess.run([sys.executable, *cmd], cwd=cwd, capture_output=True, timeout=300,
                       env={**os.environ, **OFFLINE})
    r.stdout, r.stderr = r.stdout.decode('utf-8'), r.stderr.decode('utf-8')
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    # Python's own documentation (pydoc's topics, as data/prepare.py --dataset pydocs has them,
    # without the slow docstrings half), and 30 steps of a tiny GPT on it, GPT-2's vocabulary
    # padded to 50304 as train.py does by default.
    from pydoc_data.topics import topics
    work = tmp_path_factory.mktemp('hf')
    (work / 'docs').mkdir()
    for name in sorted(topics)[:60]:
        (work / 'docs' / f'{name}.txt').write_text(topics[name], encoding='utf-8')
    run(work, os.path.join(ROOT, 'data', 'prepare.py'), '--input', 'docs', '--out_dir', 'data',
        '--val_fraction', '0.2', '--num_proc', '1')
    run_train(str(work), '--dataset=docs', '--out_dir=out', '--device=cpu', '--dtype=float32',
              '--compile=False', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=64',
              '--bias=True', '--batch_size=8', '--max_iters=30', '--eval_interval=30',
              '--eval_iters=1', '--log_interval=10', '--warmup_iters=5', '--learning_rate=1e-2',
              '--min_lr=1e-3', '--lr_decay_iters=30', env={'TIKTOKEN_CACHE_DIR': ''})
    return work


@pytest.fixture(scope='module')
def untrained(tmp_path_factory):
    # random weights of a large init_std: greedy text of many different tokens, where the trained
    # model's few steps mostly give whitespace
    work = tmp_path_factory.mktemp('hf_random')
    make_checkpoint(str(work / 'out'), iter_num=1, seed=3, block_size=256, vocab_size=50304,
                    n_layer=2, n_head=2, n_embd=32, init_std=0.5)
    return work


def sample(work, *args):
    return run(ROOT, 'sample.py', f'--out_dir={work / "out"}', *args)


# Run in a child: offline from its first import, and transformers as a user runs it.
HF_CHILD = r'''
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
path, prompt, n, texts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
ids = tok(prompt, return_tensors='pt').input_ids
out = model.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=tok.eos_token_id)
pipe = pipeline('text-generation', model=path)
text = pipe(prompt, do_sample=False, max_new_tokens=n)[0]['generated_text']
print(json.dumps({'generate': tok.decode(out[0]), 'pipeline': text, 'vocab': len(tok),
                  'ids': [tok(t).input_ids for t in texts],
                  'decoded': [tok.decode(tok(t).input_ids) for t in texts]}))
'''


@pytest.mark.parametrize('which, n', [('trained', 40), ('untrained', 200)])
def test_export_is_read_by_transformers_as_sample_py_runs_it(which, n, request):
    work = request.getfixturevalue(which)
    hf_dir = work / 'hf'
    r = sample(work, f'--export_hf={hf_dir}')
    assert r.stdout == f"wrote {hf_dir} ({', '.join(sorted(WEIGHTS + TOKENIZER))})\n"
    assert sorted(os.listdir(hf_dir)) == sorted(WEIGHTS + TOKENIZER)

    ours = sample(work, '--temperature=0', f'--max_new_tokens={n}', '--num_samples=1',
                  f'--start={PROMPT}').stdout
    assert ours.endswith('\n---------------\n')
    ours = ours[:-len('\n---------------\n')]
    # HF's generate stops at <|endoftext|> (the config's eos); sample.py writes it and goes on
    if '<|endoftext|>' in ours:
        ours = ours[:ours.index('<|endoftext|>') + len('<|endoftext|>')]
    assert ours.startswith(PROMPT) and len(ours) > len(PROMPT) + 20, ours
    from hetgpt.data.tokenizer import gpt2_encoding
    enc = gpt2_encoding()
    if which == 'untrained':
        assert len(set(enc.encode(ours[len(PROMPT):]))) > 50, ours  # not one token over and over

    child = run(ROOT, '-c', HF_CHILD, str(hf_dir), PROMPT, str(n), json.dumps(TEXTS))
    hf = json.loads(child.stdout)
    assert hf['pipeline'] == ours
    assert hf['generate'] == ours
    assert hf['vocab'] == 50257

    # tiktoken's ids (tokenizer.py builds tiktoken's "gpt2": test_prepare checks its ranks), and
    # <|endoftext|> in a prompt is the special token, in sample.py as in transformers
    assert hf['ids'] == [enc.encode(t, allowed_special={'<|endoftext|>'}) for t in TEXTS]
    assert hf['decoded'] == TEXTS


LOGLIKELIHOOD_CHILD = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
# what lm-evaluation-harness's `--model hf` computes for a (context, continuation) request: the
# continuation's summed log-probabilities, and whether greedy decoding would produce it
path, pairs = sys.argv[1], json.loads(sys.argv[2])
tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
out = []
for context, continuation in pairs:
    ctx, cont = tok(context).input_ids, tok(continuation).input_ids
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)[0, len(ctx) - 1:-1]
    picked = logp.gather(1, torch.tensor(cont)[:, None])[:, 0]
    out.append([picked.sum().item(), bool((logp.argmax(-1) == torch.tensor(cont)).all())])
print(json.dumps(out))
"""


def test_lm_eval_s_loglikelihood_of_the_export_is_our_model_s(trained):
    # lm_eval --model hf --model_args pretrained=DIR (docs/sampling.md) scores a task by each
    # continuation's log-likelihood under AutoModelForCausalLM and AutoTokenizer: on the export,
    # the same numbers as our model's own forward (lm_eval itself and its tasks' data need
    # network; this is the part that runs offline)
    import torch
    from hetgpt.run import checkpoint
    from hetgpt.data.tokenizer import gpt2_encoding
    hf_dir = trained / 'hf_eval'
    sample(trained, f'--export_hf={hf_dir}')
    pairs = [('The return statement', ' leaves the function'), ('for x in', ' range(10):'),
             ('Python', ' is a programming language.')]
    child = run(ROOT, '-c', LOGLIKELIHOOD_CHILD, str(hf_dir), json.dumps(pairs))
    theirs = json.loads(child.stdout)
    model = checkpoint.load_model(checkpoint.latest(str(trained / 'out'))).eval()
    enc = gpt2_encoding()
    for (context, continuation), (hf_sum, hf_greedy) in zip(pairs, theirs):
        ctx, cont = enc.encode(context), enc.encode(continuation)
        with torch.no_grad():
            logits = model(torch.tensor([ctx + cont]))[0]
        logp = logits.float().log_softmax(-1)[0, len(ctx) - 1:-1]
        ours = logp.gather(1, torch.tensor(cont)[:, None]).sum().item()
        assert abs(ours - hf_sum) < 1e-3 * max(1.0, abs(ours)), (context, ours, hf_sum)
        assert hf_greedy == bool((logp.argmax(-1) == torch.tensor(cont)).all())


def test_other_vocabulary_gets_weights_only(trained, tmp_path):
    # a char-level model (vocab 65, as nanoGPT's shakespeare_char), exported over an export that
    # had GPT-2's tokenizer: that tokenizer is not this model's, and goes
    hf_dir = tmp_path / 'hf'
    sample(trained, f'--export_hf={hf_dir}')
    assert set(TOKENIZER) <= set(os.listdir(hf_dir))
    _, ckpt = make_checkpoint(str(tmp_path / 'char'), iter_num=1, block_size=32, vocab_size=65,
                              n_layer=1, n_head=2, n_embd=16)
    r = run(ROOT, 'sample.py', f'--init_from={ckpt}', f'--export_hf={hf_dir}')
    assert r.stdout == (f"wrote {hf_dir} ({', '.join(WEIGHTS)}; weights only, no tokenizer: "
                        f"vocab_size 65 is not GPT-2's 50257)\n")
    assert sorted(os.listdir(hf_dir)) == WEIGHTS
    assert json.load(open(hf_dir / 'config.json'))['vocab_size'] == 65


@pytest.mark.parametrize('old, new, says', [
    ('4 * C', '3 * C', 'mlp.c_fc.weight 32×96 here, 32×128 in GPT-2'),  # other weights
    ('self.gelu(self.c_fc(x))', 'torch.relu(self.c_fc(x))', 'logits differ'),  # the same ones
])
def test_an_edited_model_py_is_not_exported_as_gpt2(tmp_path, old, new, says):
    # A researcher's model.py (a narrower MLP; ReLU for GELU) trained and exported: GPT-2's
    # config with its weights would be another network. One line, nothing written.
    from trainer import TINY, edited_copy, make_dataset
    code = edited_copy(tmp_path / 'code', 'model.py', old, new)
    make_dataset(tmp_path)
    env = {**os.environ, **OFFLINE}
    subprocess.run([sys.executable, str(code / 'train.py'), *TINY, '--bias=True',
                    '--batch_size=2', '--max_iters=1', '--out_dir=out'], cwd=tmp_path,
                   check=True, capture_output=True, timeout=300, env=env)
    p = subprocess.run([sys.executable, str(code / 'sample.py'), '--out_dir=out', '--device=cpu',
                        f'--export_hf={tmp_path / "hf"}'], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    # (sample.py says which checkpoint it loaded first)
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 2 and lines[0].startswith('loaded '), p.stderr
    assert lines[1].startswith('error: ') and 'another network' in lines[1] and says in lines[1]
    assert not (tmp_path / 'hf').exists()
