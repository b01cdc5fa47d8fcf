"""
The planner's GPU clock (hetgpt/planner/timing.py), kind of work by kind of work: each expected value is
computed here from the figure the clock cites (a table entry, a micro-benchmark, a datasheet),
and the work it times (hetgpt/planner/costs.work) against the model's own arithmetic.
"""
import pytest

from hetgpt.planner import costs, timing
from hetgpt.planner.costs import counts
from model import GPTConfig

# OpenXLA's sm_90 GEMM table (xla/service/gpu/model/matmul_interpolator_data.h), BF16 TFLOP/s,
# m×k @ k×n: its best entry, 4096³, and 4096 rows by 4096 columns over an inner 512
BEST, CUBE, INNER_512 = 808.7, 783.3, 543.1
# Stas Bekman's MAMF table (ml-engineering compute/accelerator/README.md), BF16 TFLOP/s
MAMF_H100, MAMF_A100 = 794.5, 271.2
# Datasheets: dense tensor-core TFLOP/s and HBM GB/s
A100_PEAK, V100_FP16_PEAK, H100_HBM = 312, 125, 3350


def test_a_matmul_at_a_table_shape_runs_at_its_share_of_the_parts_best():
    for gpu, best in (('H100-SXM', MAMF_H100), ('A100-80GB', MAMF_A100)):
        for k, rate in ((4096, CUBE), (512, INNER_512)):
            flops = 2 * 4096 * 4096 * k
            expected = flops / (best * 1e12 * rate / BEST)
            assert timing.matmul_seconds(gpu, 'bfloat16', 1, 4096, 4096, k) == \
                pytest.approx(expected, rel=1e-9), (gpu, k)


def test_a_small_inner_dimension_is_slower_per_flop():
    # the table's 4096×512×512 (238.8 TFLOP/s) against 4096³: 3.3x the seconds per FLOP
    per_flop = lambda k, n: timing.matmul_seconds('H100-SXM', 'bfloat16', 1, 4096, n, k) / (
        2 * 4096 * n * k)
    assert per_flop(512, 512) / per_flop(4096, 4096) == pytest.approx(CUBE / 238.8, rel=1e-9)


def test_a_part_without_a_mamf_row_runs_at_the_stated_fraction_of_its_datasheet():
    # V100: fp16 tensor cores, 125 TFLOP/s dense; the fallback is 80% of it at the best shape
    s = timing.matmul_seconds('V100-32GB', 'float16', 1, 4096, 4096, 4096)
    expected = 2 * 4096**3 / (0.8 * V100_FP16_PEAK * 1e12 * CUBE / BEST)
    assert s == pytest.approx(expected, rel=1e-9)
    assert 'no MAMF row' in timing.said([dict(device='cuda', gpu='V100-32GB')])


def test_attention_at_flashattentions_measured_fraction_causal_halved():
    # FlashAttention-2 on A100 (arXiv 2307.08691): 73% of peak forward, 63% backward; its FLOPs:
    # 4·seq²·head_dim per head, half under a causal mask, the backward 2.5 times the forward
    b, heads, seq, d = 2, 16, 2048, 128
    forward = 4 * b * heads * seq * seq * d / 2
    assert timing.attention_seconds('A100-80GB', 'bfloat16', b, heads, seq, seq, d, True, False) == \
        pytest.approx(forward / (0.73 * A100_PEAK * 1e12), rel=1e-9)
    assert timing.attention_seconds('A100-80GB', 'bfloat16', b, heads, seq, seq, d, True, True) == \
        pytest.approx(2.5 * forward / (0.63 * A100_PEAK * 1e12), rel=1e-9)
    full = timing.attention_seconds('A100-80GB', 'bfloat16', b, heads, seq, seq, d, False, False)
    assert full == pytest.approx(2 * forward / (0.73 * A100_PEAK * 1e12), rel=1e-9)


def test_other_kernels_move_bytes_at_babelstreams_fraction_of_hbm():
    # cub's BabelStream triad: 87% of DRAM peak (NVIDIA/cccl#9881); H100-SXM's HBM3 3,350 GB/s
    assert timing.memory_seconds('H100-SXM', 1e9) == pytest.approx(1e9 / (0.87 * H100_HBM * 1e9))


CFG = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=256, vocab_size=512, bias=True)


@pytest.mark.parametrize('ac', [False, True], ids=['plain', 'ac'])
def test_the_clocks_matmuls_are_the_models_linear_layers(ac):
    # A micro-batch's matmul FLOPs (costs.work, recorded from model.py's network) against the
    # layers' arithmetic: each Linear's 2·tokens·in·out forward and twice that backward (the
    # input's gradient and the weight's): 12·h² per block (q, k, v, the projection, the MLP's
    # 4h and back), and the tied head h·V; activation checkpointing runs the block's forward
    # again up to the last tensor the backward needs (torch's non-reentrant checkpoint stops
    # there): all but the MLP's projection back, 8·h². Attention is not a matmul here: one
    # kernel forward (again under checkpointing), one backward per block.
    micro, h, L, V = 3, CFG.n_embd, CFG.n_layer, CFG.vocab_size
    tokens = micro * CFG.block_size
    w = costs.work(CFG, micro, 'fsdp', 'bfloat16', ac)
    flops = sum(2 * b * m * n * k * c for (b, m, n, k, _), c in w['matmuls'].items())
    block = 6 * tokens * 12 * h * h + (2 * tokens * 8 * h * h if ac else 0)
    assert flops == block * L + 6 * tokens * h * V
    assert counts(CFG)['total'] > 12 * h * h * L  # (the count above is the matmuls only)
    kernels = {(key[6], key[5]): c for key, c in w['attention'].items()}
    assert kernels == {(False, True): L * (2 if ac else 1), (True, True): L}


def test_the_loss_moves_at_least_its_logits():
    # The loss's softmax reads the float32 logits and writes their log-probabilities, forward,
    # and its backward reads and writes them again: at least 4 · tokens · V · 4 bytes per
    # sequence beyond what a second sequence adds to the weights' casts
    one, two = (costs.work(CFG, m, 'fsdp', 'bfloat16')['bytes'] for m in (1, 2))
    assert two - one >= 4 * CFG.block_size * CFG.vocab_size * 4


# the MLP's width 4·4096 is the tokens of 4 sequences of 4096: the clock's 16,384-token run
WIDE = GPTConfig(n_layer=1, n_head=32, n_embd=4096, block_size=4096, vocab_size=512, bias=False)


@pytest.mark.parametrize('cfg', [CFG, WIDE], ids=['small', 'mlp-width-is-tokens'])
def test_a_large_micro_batch_is_timed_as_if_it_ran(cfg):
    # The clock records at most about timing.ROWS tokens and grows the shapes: a micro-batch
    # beyond them times as the same micro-batch recorded whole
    micro = 2 * timing.ROWS // cfg.block_size
    scaled = timing._kernels(cfg, 'H100-SXM', 'bfloat16', True, False, micro)
    w = costs.work(cfg, micro, 'fsdp', 'bfloat16')
    whole = sum(c * timing.matmul_seconds('H100-SXM', 'bfloat16', *key[:4])
                for key, c in w['matmuls'].items())
    assert scaled['matmuls'] == pytest.approx(whole, rel=1e-9)
    assert scaled['memory'] == pytest.approx(timing.memory_seconds('H100-SXM', w['bytes']), rel=1e-6)
