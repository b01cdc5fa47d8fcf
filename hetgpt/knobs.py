"""
The knobs of train.py, sample.py and plan.py: the parser, every knob's rule,
the model's shape and the batch, the strategies' names, and --help. No torch:
a mistake is one line before the scripts import it.

A script keeps its knobs as commented module-level globals and calls

    globals().update(configure(
        {k: v for k, v in globals().items() if is_knob(k, v)},
        rules=TRAIN))

Arguments: config files (plain Python assignments, e.g. configs/gpt_13b.py)
and --key=value overrides, applied in order. An unknown key, a wrong type
or a value out of its rule exits with one line that says what to do: a typo
must never train the wrong model silently. `python SCRIPT --help`
(answer_help) lists the knobs, read from the script's source without
running it.
"""
import ast
import difflib
import enum
import io
import math
import os
import re
import sys
import textwrap
import tokenize

from hetgpt.errors import die

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, 'model.py')  # (its GPTConfig)
TRAIN_PY = os.path.join(ROOT, 'train.py')


# -----------------------------------------------------------------------------
# The strategies, cheapest first: each saves memory the one before it holds,
# at a cost in time. And the compute dtypes (dtype=auto under FSDP: tried in
# this order).
STRATEGIES = ('ddp', 'ddp+ac', 'fsdp-noreshard', 'fsdp', 'fsdp+ac',
              'fsdp+offload', 'fsdp+ac+offload')
DTYPES = ('bfloat16', 'float16', 'float32')


def flags(strategy):
    """What a strategy's name turns on."""
    shard = strategy.startswith('fsdp')
    return dict(ac='+ac' in strategy, shard=shard,
                offload='offload' in strategy,
                reshard_after_forward=shard and strategy != 'fsdp-noreshard')


def refuses_local_steps(strategy, node_ranks=()):
    """Why local steps (outer_interval > 0, hetgpt/run/local_steps.py)
    cannot run a plan of strategy on nodes of node_ranks ranks each; ''
    where they can (strategy None: the layout alone).

    They average whole models across nodes (no shards), local rank i of
    each node carrying piece i to its peers: as many ranks on every node.
    The one rule: make_plan, plan.py and LocalSteps ask it.
    """
    if strategy and flags(strategy)['shard']:
        return (f"local steps average whole models across nodes, "
                f"which {strategy} shards (they need plan ddp or ddp+ac)")
    counts = sorted(set(node_ranks), reverse=True)
    if len(counts) > 1:
        return (f"local steps need as many ranks on every node "
                f"(torchrun's --nproc_per_node), not "
                f"{' and '.join(map(str, counts))}")
    return ''


def dtype_name(dtype):
    """'bfloat16' for torch.bfloat16 or 'bfloat16': a dtype as the knob says it."""
    return str(dtype).replace('torch.', '')


# -----------------------------------------------------------------------------
# What each knob may be: a bound ('> 0', '>= 1'), an interval ('[0, 1)'), a
# regular expression a string knob must match whole, or '' (any value of its
# type). The upper bounds are far beyond any real run, so that only a slip
# (an extra zero, 10**9 for 10**3) meets them.

# The model's shape, GPTConfig's fields: 175B models are 96 × 12288, the
# largest trained widths about 25,000; contexts reach 1-10M tokens,
# vocabularies 1M. A field with no rule here (one a researcher added) is
# checked against its type only.
SHAPE = {
    'n_layer': '[1, 100000]', 'n_head': '[1, 1048576]',
    'n_embd': '[1, 1048576]', 'block_size': '[1, 16777216]',
    'vocab_size': '[1, 16777216]', 'dropout': '[0, 1)', 'bias': '',
    'init_std': '> 0'}

# The largest global batch, 2**24 = 16.8M sequences: 16 times a 1M-token
# batch at one token per sequence (GPT-3 175B: 1,536 × 2,048 tokens; Llama 3
# 405B: 16M tokens in 2,048 sequences), and the bound of the planner's work:
# train.py iterates over each step's micro-batches, and the plan lists them.
MAX_BATCH = 2**24

# make_optimizer's choice (train.py's knobs): the planner measures the
# optimizer built from them (hetgpt/planner/costs.py, set_train_knobs), and
# a run's measured.json names them (hetgpt/planner/measured.py)
OPTIMIZER = ('optimizer', 'muon_lr', 'muon_momentum', 'muon_weight_decay')

# train.py's knobs
TRAIN = {
    **SHAPE,
    'batch_size': '[1, 16777216]', 'micro_batch_size': '[0, 16777216]',
    'gradient_accumulation_steps': '[0, 16777216]',
    'out_dir': '.+', 'dataset': '.+',
    'init_from': 'scratch|resume|auto|gpt2(-medium|-large|-xl)?',
    'eval_interval': '[1, 1e9]', 'eval_iters': '[1, 1e6]',
    'log_interval': '[1, 1e9]', 'keep_last': '[1, 1e6]',
    'checkpoint_interval': '[0, 1e9]', 'max_iters': '[1, 1e9]',
    'eval_only': '', 'always_save_checkpoint': '', 'new_dataset': '',
    'decay_lr': '', 'wandb_log': '', 'wandb_project': '',
    'wandb_run_name': '', 'compile': '',
    'learning_rate': '> 0', 'weight_decay': '>= 0', 'min_lr': '>= 0',
    'beta1': '[0, 1)', 'beta2': '[0, 1)', 'adam_eps': '>= 0',
    'optimizer': 'adamw|muon', 'muon_lr': '> 0',
    'muon_momentum': '[0, 1)', 'muon_weight_decay': '>= 0',
    'grad_clip': '>= 0', 'max_bad_steps': '[1, 1e9]',
    'warmup_iters': '[0, 1e9]', 'lr_decay_iters': '[0, 1e9]',
    # (+ 1,000,003 × iter_num: within 64 bits)
    'seed': '[0, 1e18]',
    'device': 'auto|cpu|cuda(:[0-9]+)?',
    'dtype': 'auto|(float32|bfloat16|float16)'
             '(,(float32|bfloat16|float16))*',
    'plan': '|'.join(map(re.escape, ('auto',) + STRATEGIES)),
    'memory_fraction': '(0, 1]', 'init_device': 'auto|cpu|meta',
    'balance': r'auto|even|[0-9.,]+', 'rebalance_interval': '[1, 1e9]',
    'stall_timeout': '[0, 1e7]',  # (seconds: 1e7 is 16 weeks)
    'outer_interval': '[0, 1e9]',
    # What float32 can apply (the outer state is float32): the outer step
    # adds outer_lr × the round's change to each weight, which float32
    # holds to a rounding unit of 2^-24 to 2^-23 of itself. Above 2^24 a
    # change of one unit, rounding noise, moves a weight by more than its
    # own size; below 2^-24 (6e-08: rounded up) a change no larger than
    # the weight moves it by under one unit, rounded to nothing or to one
    # unit: the round's training is lost. The momentum: 0.99999994 is
    # 1 - 2^-24, the largest float32 below 1; a larger one is 1 in
    # float32, a buffer that never decays.
    'outer_lr': '[6e-08, 16777216]', 'outer_momentum': '[0, 0.99999994]'}

# sample.py's knobs (top_k's bound: vocab_size's). max_new_tokens: 100,000
# at most, as generate() keeps a sample in one tensor grown by torch.cat, so
# n tokens copy n²/2 ids of 8 bytes: 40 GB at 100,000, 4 TB at a million.
SAMPLE = {
    'init_from': '.+', 'out_dir': '.+', 'start': '',
    'num_samples': '[1, 1000000]', 'max_new_tokens': '[0, 100000]',
    'temperature': '>= 0', 'top_k': '[0, 16777216]',
    'seed': '[0, 4294967295]', 'device': 'auto|cpu|cuda(:[0-9]+)?|mps',
    'use_kv_cache': '', 'export_hf': ''}


# Past the model's block_size generate() crops the context to its last
# block_size tokens and recomputes the whole of it for every new token (the
# positions shift: a KV cache would be stale). Those positions, at most
# 2**30: GPT-2 small's forward over them is 2.7e17 FLOP, minutes of an H100
# at its peak, weeks of a CPU. (GPT-2's block of 1,024 never meets it under
# the 100,000 tokens; a block of 16,384 does past 81,919.)
SAMPLE_POSITIONS = 2**30


def check_sample(max_new_tokens, block_size, prompt):
    """Ends in one line when a sample of max_new_tokens after a prompt of
    `prompt` tokens recomputes more than SAMPLE_POSITIONS positions past
    the model's block_size."""
    past = prompt + max_new_tokens - block_size
    if past <= 0 or past * block_size <= SAMPLE_POSITIONS:
        return
    most = SAMPLE_POSITIONS // block_size + block_size - prompt
    die(f"max_new_tokens={max_new_tokens}: past this model's block_size="
        f"{block_size} every new token recomputes the whole block (the "
        f"context is cropped, no KV cache): {past:,} × {block_size:,} "
        f"positions, above 2**30; use at most {max(0, most):,}")


# -----------------------------------------------------------------------------
# Reading the knobs: config files and --key=value overrides
def is_knob(name, value):
    """Whether a module global is a knob: a plain value, not private."""
    if name.startswith('_') or isinstance(value, enum.Enum):
        return False  # (train.py's `sig`, a signal.Signals, is an int)
    plain = (int, float, bool, str, type(None))
    return isinstance(value, plain)


def check(key, value, defaults, where):
    """value for key, if the key is known and the value of its type."""
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=3, cutoff=0.6)
        if close:
            hint = f"did you mean {' or '.join(close)}?"
        else:
            hint = f"valid keys: {', '.join(sorted(defaults))}"
        die(f"unknown config key '{key}' in {where}; {hint}")
    default = defaults[key]
    want = type(default)
    if default is None:
        return value
    if isinstance(value, want):
        if want is not bool and isinstance(value, bool):
            die(f"{key}={value!r} in {where}: expected "
                f"{want.__name__}, got bool")
        return value
    if want is float and type(value) is int:
        return float(value)
    die(f"{key}={value!r} in {where}: expected {want.__name__} like "
        f"{default!r}, got {type(value).__name__}")


def check_rule(key, value, rule):
    """Ends in one line when value breaks the rule."""
    fault = rule_fault(key, value, rule)
    if fault:
        die(fault)


def rule_fault(key, value, rule):
    """What is wrong with key=value under its rule, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={value}: must be a finite number"
    if not rule or value is None:
        return None
    if isinstance(value, str):
        if re.fullmatch(rule, value):
            return None
        return f"{key}={value!r}: must be one of {rule}"
    bound = re.fullmatch(r'(>=?)\s*(\S+)', rule)
    interval = re.fullmatch(r'([\[(])\s*([^,]+),\s*([^\])]+)([\])])', rule)
    if bound:
        low = float(bound[2])
        ok = value >= low if bound[1] == '>=' else value > low
        if not ok:
            return f"{key}={value!r}: must be {rule}"
        return None
    if not interval:  # a mistake in the table, not the user's
        raise ValueError(f"bad rule {rule!r} for {key}")
    low, high = float(interval[2]), float(interval[3])
    above = low <= value if interval[1] == '[' else low < value
    below = value <= high if interval[4] == ']' else value < high
    if above and below:
        return None
    return f"{key}={value!r}: must be in {rule}"


def parse_value(text):
    """A command line's value: a Python literal, else the text itself."""
    if text in ('true', 'false'):  # shell habits
        return text == 'true'
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: --device=cpu


def configure(defaults, argv=None, strict_files=True, rules=None):
    """The knobs: defaults, then each config file and --key=value in argv.

    strict_files=False: a config file may set knobs this script does not
    use (plan.py reads the model and the batch from a train config); the
    command line is always strict. rules: knob -> rule, checked on the
    final values.
    """
    if argv is None:
        argv = sys.argv[1:]
    config = dict(defaults)
    for arg in argv:
        if arg.startswith('--'):
            key, value = _override(arg, defaults)
            config[key] = check(key, value, defaults, 'the command line')
            continue
        for key, value in _config_file(arg).items():
            if is_knob(key, value) and (strict_files or key in defaults):
                config[key] = check(key, value, defaults, arg)
    for key, rule in (rules or {}).items():
        check_rule(key, config[key], rule)
    return config


def _override(arg, defaults):
    """(key, value) of a --key=value argument."""
    if '=' not in arg:
        die(f"'{arg}': write overrides as --key=value")
    key, text = arg[2:].split('=', 1)
    value = parse_value(text)
    if isinstance(defaults.get(key), str):
        value = text  # a string keeps its text: --balance=5,2,1
    return key, value


def _config_file(path):
    """The names a config file assigns, run as plain Python."""
    try:
        source = open(path).read()
    except OSError as e:
        die(f"cannot read config file '{path}' ({e.strerror}); "
            f"configs live in configs/*.py")
    scope = {}
    try:
        exec(compile(source, path, 'exec'), {}, scope)
    except Exception as e:
        die(f"config file '{path}' does not run: "
            f"{type(e).__name__}: {e}")
    return scope


# -----------------------------------------------------------------------------
# The model's shape and the batch
def fault(args):
    """What is wrong with a model shape, in one line; None if nothing.

    args: a config's knobs, or a checkpoint's model_args (untrusted). Each
    field against its type (as annotated) and its rule. A checkpoint may
    lack a float (dropout, init_std: no part of the weights' shapes), and a
    field whose default is None.
    """
    defaults = model_defaults()
    for name, want in model_types().items():
        value = args.get(name)
        if value is None:
            if want is float or defaults[name] is None:
                continue
            return f"{name} is missing"
        allowed = (int, float) if want is float else (want,)
        if type(value) not in allowed:  # (a bool is no int)
            return f"{name}={value!r} is not {want.__name__}"
        bad = rule_fault(name, value, SHAPE.get(name, ''))
        if bad:
            return bad
    n_embd, n_head = args['n_embd'], args['n_head']
    if n_embd % n_head:
        heads = [h for h in range(1, 129) if n_embd % h == 0][-6:]
        return (f"n_embd={n_embd} is not divisible by n_head={n_head}; "
                f"pick n_head among {heads}")
    return None


def check_shape(config):
    """Ends in one line when the config's model shape is bad."""
    bad = fault(config)
    if bad:
        die(bad)


def check_train(config):
    """Ends in one line when train.py's config is bad: its model shape,
    or a schedule that decays up to min_lr."""
    check_shape(config)
    lr, low = config['learning_rate'], config['min_lr']
    if config['decay_lr'] and low > lr:
        die(f"min_lr={low} is above learning_rate={lr}: lower min_lr")


def lr_at(config, it):
    """train.py's learning rate at step it (nanoGPT's get_lr): a linear
    warmup over warmup_iters, then a cosine decay to min_lr at
    lr_decay_iters; decay_lr=False: learning_rate throughout."""
    lr, low = config['learning_rate'], config['min_lr']
    warmup, end = config['warmup_iters'], config['lr_decay_iters']
    if not config['decay_lr']:
        return lr
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > end:
        return low
    ratio = (it - warmup) / max(1, end - warmup)
    return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - low)


def batch_of(batch_size, gradient_accumulation_steps=0,
             micro_batch_size=0):
    """(global batch, micro-batch) of a config.

    hetgpt's batch_size is the global batch. A config that sets
    gradient_accumulation_steps > 0 speaks nanoGPT: batch_size is then the
    micro-batch, and the global batch is batch_size × the steps, whatever
    the world size. A global batch above MAX_BATCH is a mistake.
    """
    steps = gradient_accumulation_steps
    if steps <= 0:
        return batch_size, micro_batch_size
    batch = batch_size * steps
    if batch > MAX_BATCH:
        die(f"gradient_accumulation_steps={steps}: the global batch "
            f"batch_size × gradient_accumulation_steps = {batch_size} × "
            f"{steps} = {batch:,} sequences is above {MAX_BATCH:,} "
            f"(2**24); nanoGPT's meaning: batch_size is the micro-batch")
    return batch, micro_batch_size or batch_size


def feeds(batch_size, world_size):
    """Ends in one line when the batch cannot give each rank a sequence."""
    if batch_size >= world_size:
        return
    if world_size <= MAX_BATCH:
        what = "raise it or use fewer ranks"
    else:
        what = (f"at most {MAX_BATCH:,} ranks (2**24, the largest "
                f"batch_size); use fewer ranks")
    die(f"batch_size={batch_size} cannot feed {world_size} ranks: {what}")


def split_weights(balance, batch_size, world_size):
    """The balance knob's weights: None (auto: by speed), or one per rank."""
    feeds(batch_size, world_size)
    if balance == 'auto':
        return None
    if balance == 'even':
        return [1.0] * world_size
    texts = balance.split(',')
    weights = [float(w) for w in texts
               if re.fullmatch(r'\d+(\.\d*)?', w)]
    if len(weights) != len(texts) or len(texts) != world_size \
            or min(weights) <= 0:
        ones = ','.join(['1'] * world_size)
        die(f"balance={balance!r}: give auto, even, or {world_size} "
            f"positive weights like {ones}")
    return weights


def notes(config, batch_size):
    """train.py's notes on its knobs, once the run is set up.

    A schedule that max_iters cuts short (the learning rate it ends at),
    and nanoGPT's meaning of batch_size.
    """
    c = config
    end_lr = lr_at(c, c['max_iters'])
    cut = c['max_iters'] < c['lr_decay_iters']
    if c['decay_lr'] and cut and not c['eval_only']:
        yield (f"warning: max_iters={c['max_iters']} < "
               f"lr_decay_iters={c['lr_decay_iters']}: the learning rate "
               f"ends at {end_lr:.2e}, not min_lr={c['min_lr']:.2e}; set "
               f"lr_decay_iters={c['max_iters']}")
    steps = c['gradient_accumulation_steps']
    if steps:
        yield (f"gradient_accumulation_steps={steps}: global batch "
               f"{batch_size} = {c['batch_size']} × that, in sequences")


# What the run can do: a knob against the run's own numbers, known once it
# is planned (train.py). The watchdog ends a rank when its main thread
# calls no progress for stall_timeout seconds; between two calls (each
# micro-batch's forward, each evaluation piece's, a step's end) a healthy
# run spends at most a step (a micro-batch's backward, the optimizer, the
# reductions; an evaluation piece is a forward of at most a micro-batch)
# and, with local steps, the outer exchange. STALL_STEPS times that: the
# prediction's error and a slow moment.
STALL_STEPS = 3


def run_bounds(config, step, exchange=0.0):
    """knob -> (the least value that works, what it comes from), for the
    knobs this run bounds. step: the plan's predicted step (seconds);
    exchange: local steps' outer exchange (seconds; counted only with
    outer_interval). A knob at 0 is off and has no bound."""
    if not config['outer_interval']:
        exchange = 0.0
    wait = STALL_STEPS * (step + exchange)
    what = f"a step of this plan is predicted at {step:.3g} s"
    if exchange:
        what += f" and local steps' exchange at {exchange:.3g} s"
    return {'stall_timeout': (wait, what)}


def check_run(config, step, exchange=0.0):
    """Ends in one line when a knob is below what this run needs."""
    for key, (least, what) in run_bounds(config, step, exchange).items():
        value = config[key]
        if value and value < least:
            die(f"{key}={value} is below what this run needs: {what}; "
                f"set {key} to at least {math.ceil(least)} (0: off)")


# -----------------------------------------------------------------------------
# The knobs as a script's source writes them: --help, and the defaults
# plan.py and the planner take from train.py, with nothing of it run
def answer_help(path, argv=None, model=False):
    """With -h or --help in argv: print the knobs of the script at path
    (model: and GPTConfig's) and exit 0."""
    if argv is None:
        argv = sys.argv[1:]
    if '-h' not in argv and '--help' not in argv:
        return
    try:
        print(help_text(path, model), flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)


def knobs(path, model=False):
    """[(group, name, default as written, comment lines)] of a script.

    Its module-level assignments of plain values between its first two
    '# ----' rulers (the whole file without them). A comment at column 0
    there starts a group (train.py's '# I/O'); an indented one goes on
    with the comment of the knob above it. model (train.py): with every
    field of GPTConfig the script does not set, after its 'model' group.
    """
    source = open(path, encoding='utf-8').read()
    lines = source.splitlines()
    rulers = [n for n, line in enumerate(lines, 1)
              if re.fullmatch(r'# -{20,}', line)]
    first, last = 0, len(lines) + 1
    if len(rulers) > 1:
        first, last = rulers[:2]
    found = _assigned(source, ast.parse(source).body, first, last)
    if not model:
        return found
    mine = {name for _, name, _, _ in found}
    ours = [i for i, k in enumerate(found) if k[0].split(':')[0] == 'model']
    at, group = len(found), 'model'
    if ours:
        at, group = ours[-1] + 1, found[ours[-1]][0]
    found[at:at] = [(group, name, text, notes)
                    for _, name, text, notes in model_knobs()
                    if name not in mine]
    return found


def _gptconfig():
    """(model.py's source, its GPTConfig class as parsed)."""
    source = open(MODEL, encoding='utf-8').read()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == 'GPTConfig':
            return source, node


def model_knobs():
    """GPTConfig's fields as knobs() lists a script's: every field is a
    model knob of train.py and plan.py, a new one included."""
    source, cls = _gptconfig()
    return _assigned(source, cls.body, cls.lineno, cls.end_lineno + 1)


def model_defaults():
    """{field: default} of GPTConfig, read from model.py's source."""
    return {name: ast.literal_eval(text)
            for _, name, text, _ in model_knobs()}


def model_types():
    """{field: its type as annotated in GPTConfig, else its default's}."""
    _, cls = _gptconfig()
    named = {'int': int, 'float': float, 'bool': bool, 'str': str}
    defaults = model_defaults()
    types = {}
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign):
            continue
        name = node.target.id
        if name in defaults:
            written = getattr(node.annotation, 'id', None)
            types[name] = named.get(written, type(defaults[name]))
    return types


def _assignment(node):
    """The name a plain `x = 1` or `x: int = 1` assigns, else None."""
    if isinstance(node, ast.Assign):
        if [type(t) for t in node.targets] == [ast.Name]:
            return node.targets[0]
    elif isinstance(node, ast.AnnAssign) and node.value:
        if isinstance(node.target, ast.Name):
            return node.target
    return None


def _assigned(source, body, first, last):
    """knobs(): the plain-valued assignments among body's statements on
    lines first+1 to last-1, with the comments beside and below them, in
    groups."""
    lines = source.splitlines()
    comments = {}  # line -> (column, text)
    readline = io.StringIO(source).readline
    for t in tokenize.generate_tokens(readline):
        if t.type == tokenize.COMMENT:
            text = t.string.lstrip('#').strip()
            comments[t.start[0]] = (t.start[1], text)
    assigned = {}  # first line -> (name, node)
    for node in body:
        target = _assignment(node)
        if target is None:
            continue
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError):
            continue  # computed: not a knob
        if is_knob(target.id, value):
            assigned[node.lineno] = (target.id, node)
    found, group, above = [], '', None  # above: the knob being commented
    for n in range(first + 1, last):
        name, node = assigned.get(n, (None, None))
        if node:
            text = _written(source, lines, node.value, n)
            said = [comments[i][1] for i in range(n, node.end_lineno + 1)
                    if i in comments]
            above = [group, name, text, said]
            found.append(above)
        elif n in comments and lines[n - 1].lstrip().startswith('#'):
            column, text = comments[n]
            if column == 0:
                group, above = text, None
            elif above:
                above[3].append(text)
        elif not lines[n - 1].strip():
            above = None  # a blank line ends a knob's comment
    return [tuple(k) for k in found]


def _written(source, lines, value, n):
    """A value's text as written (ast's offsets count UTF-8 bytes)."""
    if value.lineno == value.end_lineno == n:
        raw = lines[n - 1].encode()
        return raw[value.col_offset:value.end_col_offset].decode()
    return ast.get_source_segment(source, value)


def defaults_of(path, model=False):
    """{knob: default} of the script at path, as --help reads them."""
    return {name: ast.literal_eval(text)
            for _, name, text, _ in knobs(path, model)}


def help_text(path, model=False):
    """The script's usage, its docstring and its knobs."""
    source = open(path, encoding='utf-8').read()
    script, items = os.path.basename(path), knobs(path, model)
    widths = [len(f"{name} = {default}") for _, name, default, _ in items]
    column = min(26, 4 + max(widths, default=0))
    # the docstring's summary, the knobs, then the docstring's rest
    doc = ast.get_docstring(ast.parse(source)) or ''
    doc = doc.strip().splitlines()
    first = len(doc)
    for i, line in enumerate(doc):
        if not line or line[0] in ' $':
            first = i
            break
    summary = '\n'.join(doc[:first])
    rest = '\n'.join(doc[first:]).strip('\n')
    out = [f"usage: python {script} [CONFIG.py ...] [--key=value ...]",
           '', summary, '',
           "Knobs, with their defaults (a config file or --key=value "
           "sets them):"]
    group = None
    for g, name, default, note in items:
        if g != group:
            out += ['', g] if g else ['']
            group = g
        note = note or ['']  # (its lines as the file breaks them)
        head = f"  {name} = {default}".ljust(column - 2)
        out.append(f"{head}  {note[0]}".rstrip())
        out += [' ' * column + line for line in note[1:]]
    out += ['', rest, '', textwrap.fill(
        "Arguments, applied in order: config files (plain Python "
        "assignments of the knobs above, as in configs/*.py) and "
        "--key=value overrides. Every value is checked against its "
        "knob's type and rule (hetgpt/knobs.py): an unknown key or a "
        "bad value stops with one line, before anything runs.", 100)]
    return '\n'.join(out)
