"""
Whether each test of `make check` (tests/conftest.py's CHECK) fails when the property it claims
breaks: for each, one edit of the product (a mutation) in a copy of the repository, and that test
alone run there. A mutation that its test does not catch is a test that cannot fail. Prints one
line per mutation and exits 1 if any was missed (or the unmutated test fails).

  python bench/check_mutations.py            # every mutation
  python bench/check_mutations.py resume     # those whose name contains 'resume'
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
from conftest import CHECK  # noqa: E402

# name -> (the test, edits: (file, old, new) each, what breaks)
FROZEN_MLP = ('hetgpt/planner/costs.py', 'from hetgpt.errors import die, oneline\n',
              'from hetgpt.errors import die, oneline\n_MLP = network.MLP  # (frozen at import)\n')
GPT2_FIELDS = "('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'bias', 'init_std')"
MUTATIONS = {
    'chunked loss': ('test_model.py::test_chunked_loss_and_gradients_equal_full_logits[64-1024]',
                     [('model.py', 'grad_x[g:g + group] = lg @ weight', 'grad_x[g:g + group] = lg @ weight * 0.99')],
                     "the loss's input gradient 1% off"),
    'kv cache': ('test_model.py::test_kv_cache_logits_match_full_forward',
                 [('model.py', 'mask = mask.tril(diagonal=pos)', 'mask = mask.tril(diagonal=pos - 1)')],
                 'a new query does not see its own key'),
    'saved bytes': ('test_plan_measured.py::test_activation_bytes_follow_an_edit_to_the_model[policy0-swiglu]',
                    [FROZEN_MLP, ('hetgpt/planner/costs.py', '        block = network.Block(cfg)\n        if not rest:',
                                  '        block = network.Block(cfg)\n        block.mlp = _MLP(cfg)\n        if not rest:')],
                    "the planner measures model.py's MLP as it was at import, not the edit"),
    'flops': ('test_plan_measured.py::test_flops_and_parameters_follow_an_edit_to_the_model[wide_mlp]',
              [FROZEN_MLP, ('hetgpt/planner/costs.py', 'block, rest = network.Block(cfg), network.GPT(replace(cfg, n_layer=0))\n',
                            'block, rest = network.Block(cfg), network.GPT(replace(cfg, n_layer=0))\n'
                            '        block.mlp = _MLP(cfg)\n')],
              "the FLOP count uses model.py's MLP as it was at import"),
    'ddp': ('test_strategies.py::test_strategy_on_two_ranks_matches_one_process[ddp]',
            [('hetgpt/run/parallel.py', 'model = DDP(raw_model, gradient_as_bucket_view=True,\n'
                                        '                        process_group=group)', 'model = raw_model')],
            'DDP left out: no gradient is reduced over ranks'),
    'fsdp': ('test_strategies.py::test_strategy_on_two_ranks_matches_one_process[fsdp]',
             [('hetgpt/run/parallel.py', 'model.set_requires_gradient_sync(reduce)',
               'model.set_requires_gradient_sync(False)')],
             "FSDP never reduce-scatters the gradients"),
    'uneven split': ('test_strategies.py::test_uneven_split_on_three_ranks_matches_one_process[5,2,1-fsdp]',
                     [('train.py', 'start = sum(map(sum, sizes[:rank]))', 'start = rank * sum(ran)')],
                     "a rank's sequences start where an even split would put them"),
    'resume': ('test_train.py::test_resume_continues_exactly',
               [('hetgpt/run/checkpoint.py', "state, stored = {'model': model_sd, 'optim': optim_sd}, None",
                 "state, stored = {'model': model_sd}, None")],
               "a resume does not read the optimizer's state"),
    'sample': ('test_sample.py::test_sample_streams_the_models_text',
               [('hetgpt/run/checkpoint.py', "return (checkpoints(path) or [None])[-1]", "return (checkpoints(path) or [None])[0]")],
               'the oldest checkpoint is taken for the latest'),
    'export': ('test_sample.py::test_export_hf[False]',
               [('hetgpt/run/hf.py', '            if k.endswith(CONV1D):\n                sd[k] = ours[k].t()',
                 '            if False:\n                sd[k] = ours[k].t()')],
               "the export does not transpose GPT-2's Conv1D weights"),
    'modern block': ('test_modern_block.py::test_the_copy_is_the_modern_model',
                     [('model.py', '                        if f.name in d})',
                       f'                        if f.name in d and f.name in {GPT2_FIELDS}}})')],
                     "a GPTConfig field not GPT-2's is dropped from the config (a list of knobs of its own)"),
    'layout': ('test_layout.py::test_the_planner_imports_nothing_of_the_run_or_the_data',
               [('hetgpt/planner/search.py', 'from hetgpt.errors import die\n',
                 'from hetgpt.errors import die\nfrom hetgpt.run.metrics import read_rows  # noqa: F401\n')],
               'the planner imports a module of the run'),
    'optimizer edit': ('test_optimizer_edit.py::test_every_strategy_and_split_follows_the_edit[fsdp-2-even]',
                       [('hetgpt/run/optim.py', '    norm = torch.nn.utils.clip_grad_norm_(model.parameters(),\n',
                         "    norm = torch.nn.utils.clip_grad_norm_([getattr(p, '_local_tensor', p)\n"
                         "                                           for p in model.parameters()],\n")],
                       "under FSDP no rank clips the whole gradient (each clips its shards' local tensors, "
                       "which hold none)"),
    'modern kv cache': ('test_modern_block.py::test_kv_cache_generation_equals_full_recomputation[20]',
                        [('model.py', "cache['pos'] += T", "cache['pos'] += min(T, 2)")],
                        'the cache counts a prompt of T tokens as 2'),
}


def copy_repo(dest):
    files = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))


def run_test(where, test):
    t = time.perf_counter()
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider',
                        f'tests/{test}'], cwd=where, capture_output=True, text=True, timeout=900)
    return p, time.perf_counter() - t


def main():
    assert {test for test, _, _ in MUTATIONS.values()} == set(CHECK), \
        "a CHECK test without a mutation, or a mutation of no CHECK test"
    wanted = [n for n in MUTATIONS if len(sys.argv) < 2 or sys.argv[1] in n]
    missed = 0
    with tempfile.TemporaryDirectory() as work:
        for name in wanted:
            test, edits, what = MUTATIONS[name]
            where = os.path.join(work, name.replace(' ', '_'))
            copy_repo(where)
            p, _ = run_test(where, test)
            if p.returncode != 0:
                print(f"{name}: the unmutated test fails: {p.stdout[-1500:]}")
                missed += 1
                continue
            for path, old, new in edits:
                text = open(os.path.join(where, path)).read()
                assert text.count(old) == 1, (name, path, old)
                open(os.path.join(where, path), 'w').write(text.replace(old, new))
            p, seconds = run_test(where, test)
            caught = p.returncode == 1 and ' failed' in p.stdout.splitlines()[-1]
            missed += not caught
            print(f"{name}: {'caught' if caught else 'MISSED'} ({seconds:.0f} s): {what}; "
                  f"{test}: {p.stdout.strip().splitlines()[-1]}", flush=True)
            shutil.rmtree(where)
    sys.exit(1 if missed else 0)


if __name__ == '__main__':
    main()
