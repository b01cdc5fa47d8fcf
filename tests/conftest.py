"""The suite's pytest hooks: `make check`'s tier (CHECK), the tests that run alone (ALONE), and the
longest tests first.

CHECK is the fast tier a researcher runs after an edit (`make check`, docs/testing.md): each kind of
claim once, at the smallest size that still makes it. Each entry names the claim its test makes;
`make test` runs these and every other test. bench/check_mutations.py breaks each claim once in a
copy of the repository and checks that its test fails.

ALONE: the tests whose claim is a speed measured on this machine, each against a prediction: `make
test` runs them after the others, on one worker, so that no test of the suite shares the cores with
them (the rest of the suite on 2 workers would: a lone CPU process's threads then ran 4× slower,
bench/RESULTS.md "plan.py --measured")."""
import pytest

CHECK = {
    'test_model.py::test_chunked_loss_and_gradients_equal_full_logits[64-1024]':
        "the model's forward and backward: the chunked loss and its gradients against the "
        "textbook loss on the whole logits",
    'test_model.py::test_kv_cache_logits_match_full_forward':
        'generation: the KV cache against the full forward',
    'test_plan_measured.py::test_activation_bytes_follow_an_edit_to_the_model[policy0-swiglu]':
        "the planner reads an edited model: a variant's saved bytes against a real block's",
    'test_plan_measured.py::test_flops_and_parameters_follow_an_edit_to_the_model[wide_mlp]':
        "the planner reads an edited model: a variant's FLOPs and parameters (a 6× MLP: "
        "SwiGLU's equal GPT-2's, so it would not tell a planner that ignores the edit)",
    'test_strategies.py::test_strategy_on_two_ranks_matches_one_process[ddp]':
        'DDP on 2 ranks computes one process\'s weights and losses',
    'test_strategies.py::test_strategy_on_two_ranks_matches_one_process[fsdp]':
        'FSDP on 2 ranks computes one process\'s weights and losses',
    'test_strategies.py::test_uneven_split_on_three_ranks_matches_one_process[5,2,1-fsdp]':
        'an uneven split (5, 2, 1 sequences on 3 ranks) computes one process\'s weights',
    'test_train.py::test_resume_continues_exactly':
        'a resume round trip: the same weights and losses as the straight run',
    'test_sample.py::test_sample_streams_the_models_text':
        "sample.py's text is generate()'s from the latest checkpoint",
    'test_sample.py::test_export_hf[False]':
        "--export_hf gives transformers' GPT2LMHeadModel our logits",
    'test_modern_block.py::test_the_copy_is_the_modern_model':
        'a modern block (RMSNorm, rotary, SwiGLU, GQA) edited into model.py alone trains',
    'test_modern_block.py::test_kv_cache_generation_equals_full_recomputation[20]':
        "the modern block's KV cache (grouped-query keys) against full recomputation",
    'test_optimizer_edit.py::test_every_strategy_and_split_follows_the_edit[fsdp-2-even]':
        "an optimizer edited into model.py alone (SGD with momentum) steps FSDP's shards as one "
        "process steps the whole",
    'test_layout.py::test_the_planner_imports_nothing_of_the_run_or_the_data':
        "the house by role: the dry run reaches nothing of the run or the data",
}

ALONE = ('test_measured_run.py::test_a_run_predicts_itself_within_10_percent',
         'test_measured_run.py::test_one_rank_predicts_two_within_25_percent',
         'test_measured_run.py::test_kinds_the_run_had_are_measured_and_the_others_priors')

LONGEST = ('test_readme.py::test_make_demo_learns',
           'test_gpu_check.py::test_gpu_check_dry_run',
           'test_two_nodes.py::test_two_machines_over_a_slow_link',
           'test_membership.py::test_a_machine_leaves_then_another_joins')


def pytest_configure(config):
    config.addinivalue_line('markers', 'check: the fast tier (make check): CHECK in conftest.py')
    config.addinivalue_line('markers', 'alone: run with no other test (make test): ALONE')


def pytest_collection_modifyitems(config, items):
    # The longest tests (a minute or more each, none with a module-wide fixture) start first: on
    # two workers (make test) a long test that starts last runs alone at the end while the other
    # worker sits idle.
    found = set()
    for item in items:
        name = item.nodeid.split('tests/')[-1]
        if name in CHECK:
            item.add_marker(pytest.mark.check)
            found.add(name)
        if name in ALONE:
            item.add_marker(pytest.mark.alone)
            found.add(name)
    known = {'check': set(CHECK), 'alone': set(ALONE)}.get(config.getoption('markexpr'))
    if known and not known <= found:  # (a test renamed)
        raise pytest.UsageError(f"conftest.py names tests that do not exist: "
                                f"{sorted(known - found)}")
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONGEST))  # (stable)
