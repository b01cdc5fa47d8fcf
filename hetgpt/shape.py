"""
The model's shape (model.GPTConfig's fields): what each may be, and the one check of a shape,
whether a config's knobs (train.py, plan.py) or a checkpoint's model_args (untrusted input); and
the batch knobs' meaning and bound.
GPTConfig's fields are read from model.py's source (configurator): no torch, so that train.py and
plan.py answer a mistake before they import it.
"""
import re

from configurator import model_defaults, model_types, rule_fault
from hetgpt.errors import die

# What each field may be (configurator's rules; train.py's RULES takes them as they are). The upper
# bounds are far beyond any real run, so that only a slip (an extra zero, 10**9 for 10**3) meets
# them: 175B models are 96 × 12288, the largest trained widths about 25,000; contexts reach 1-10M
# tokens, vocabularies 1M. A field with no rule here (one a researcher added) is checked against
# its type only.
RULES = {
    'n_layer': '[1, 100000]', 'n_head': '[1, 1048576]', 'n_embd': '[1, 1048576]',
    'block_size': '[1, 16777216]', 'vocab_size': '[1, 16777216]', 'dropout': '[0, 1)',
    'bias': '', 'init_std': '> 0'}


def fault(args):
    # What is wrong with the shape in args (a config, or model_args), in one line; None if nothing.
    # Each field against its type (as annotated) and its rule. A checkpoint may lack a float
    # (dropout, init_std: no part of the weights' shapes), and a field whose default is None.
    defaults = model_defaults()
    for name, want in model_types().items():
        value = args.get(name)
        if value is None:
            if want is float or defaults[name] is None:
                continue
            return f"{name} is missing"
        if type(value) not in ((int, float) if want is float else (want,)):  # (a bool is no int)
            return f"{name}={value!r} is not {want.__name__}"
        bad = rule_fault(name, value, RULES.get(name, ''))
        if bad:
            return bad
    n_embd, n_head = args['n_embd'], args['n_head']
    if n_embd % n_head:
        return (f"n_embd={n_embd} is not divisible by n_head={n_head}; pick n_head among "
                f"{[h for h in range(1, 129) if n_embd % h == 0][-6:]}")
    return None


def check(config):
    # train.py's and plan.py's: a bad shape is one line, exit 2
    bad = fault(config)
    if bad:
        die(bad)


# The largest global batch, MAX_BATCH = 2**24 = 16.8M sequences (train.py's RULES bound the batch
# knobs by it): 16 times a 1M-token batch at one token per sequence (GPT-3 175B: 1,536 × 2,048
# tokens; Llama 3 405B: 16M tokens in 2,048 sequences), and the bound of the planner's work: its
# splits of a batch above balance.EXACT take time that does not grow with the batch, but train.py
# iterates over the micro-batches of each step, and the plan lists them (one int each, per rank;
# at most MAX_BATCH in all).
MAX_BATCH = 2**24


def batch_of(batch_size, gradient_accumulation_steps=0, micro_batch_size=0):
    # (global batch, micro-batch) of a config. hetgpt's batch_size is the global batch. A config
    # that sets gradient_accumulation_steps > 0 speaks nanoGPT: batch_size is then the micro-batch
    # and the global batch batch_size × gradient_accumulation_steps, whatever the world size.
    # A global batch above MAX_BATCH is a mistake: one line (train.py and plan.py call this right
    # after reading the knobs, before any work).
    if gradient_accumulation_steps > 0:
        batch, micro = batch_size * gradient_accumulation_steps, micro_batch_size or batch_size
        if batch > MAX_BATCH:
            die(f"gradient_accumulation_steps={gradient_accumulation_steps}: the global batch "
                f"batch_size × gradient_accumulation_steps = {batch_size} × "
                f"{gradient_accumulation_steps} = {batch:,} sequences is above {MAX_BATCH:,} "
                f"(2**24); nanoGPT's meaning: batch_size is the micro-batch")
        return batch, micro
    return batch_size, micro_batch_size


def feeds(batch_size, world_size):
    # A batch of fewer sequences than ranks is a mistake (train.py's and plan.py's one line); so
    # is more ranks than the largest batch
    if batch_size < world_size:
        die(f"batch_size={batch_size} cannot feed {world_size} ranks: " + (
            "raise it or use fewer ranks" if world_size <= MAX_BATCH else
            f"at most {MAX_BATCH:,} ranks (2**24, the largest batch_size); use fewer ranks"))


def split_weights(balance, batch_size, world_size):
    # train.py's batch over its ranks: the balance knob's weights, 'auto' (None: by measured
    # speed), 'even', or one per rank; a batch of fewer sequences than ranks is a mistake
    feeds(batch_size, world_size)
    if balance in ('auto', 'even'):
        return None if balance == 'auto' else [1.0] * world_size
    weights = [float(w) for w in balance.split(',') if re.fullmatch(r'\d+(\.\d*)?', w)]
    if not len(weights) == len(balance.split(',')) == world_size or min(weights) <= 0:
        die(f"balance={balance!r}: give auto, even, or {world_size} positive weights like "
            + ','.join(['1'] * world_size))
    return weights


def notes(config, batch_size, end_lr):
    # train.py's notes on its knobs, once the run is set up: a schedule that max_iters cuts short
    # (end_lr: the learning rate at max_iters), and nanoGPT's meaning of batch_size
    c = config
    if c['decay_lr'] and c['max_iters'] < c['lr_decay_iters'] and not c['eval_only']:
        yield (f"warning: max_iters={c['max_iters']} < lr_decay_iters={c['lr_decay_iters']}: "
               f"the learning rate ends at {end_lr:.2e}, not min_lr={c['min_lr']:.2e}; set "
               f"lr_decay_iters={c['max_iters']}")
    if c['gradient_accumulation_steps']:
        yield (f"gradient_accumulation_steps={c['gradient_accumulation_steps']}: global batch "
               f"{batch_size} = {c['batch_size']} × that, in sequences")
