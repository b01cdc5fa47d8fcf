"""
The planner's ladder: the strategies, cheapest first (each saves memory the one before it holds,
at a cost in time), what each turns on, and the compute dtypes. No torch: train.py and plan.py
check their knobs against these before they import it.
"""
STRATEGIES = ('ddp', 'ddp+ac', 'fsdp-noreshard', 'fsdp', 'fsdp+ac', 'fsdp+offload',
              'fsdp+ac+offload')
DTYPES = ('bfloat16', 'float16', 'float32')  # (dtype=auto under FSDP: tried in this order)


def flags(strategy):  # what a strategy's name turns on
    shard = strategy.startswith('fsdp')
    return dict(ac='+ac' in strategy, shard=shard, offload='offload' in strategy,
                reshard_after_forward=shard and strategy != 'fsdp-noreshard')
