"""
nanoGPT-style configuration, shared by train.py, sample.py, plan.py and bench/.
A script keeps its knobs as commented module-level globals and calls

    globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))

Arguments: config files (plain Python assignments, e.g. configs/gpt_13b.py) and --key=value
overrides, applied in order. Unknown keys, wrong types and values out of range (a script's RULES
table, checked by configure) exit with one line that says what to do: a typo must never train the
wrong model silently. `python SCRIPT --help` (answer_help) lists the knobs, read from the script's
source without running it.
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

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'model.py')  # (its GPTConfig)


def is_knob(name, value):
    # (an enum is not one: train.py's loop variable `sig`, a signal.Signals, is also an int)
    return (not name.startswith('_') and isinstance(value, (int, float, bool, str, type(None)))
            and not isinstance(value, enum.Enum))


def check(key, value, defaults, where):
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else f"valid keys: {', '.join(sorted(defaults))}"
        die(f"unknown config key '{key}' in {where}; {hint}")
    want = type(defaults[key])
    if defaults[key] is None or isinstance(value, want):
        if want is not bool and isinstance(value, bool) and defaults[key] is not None:
            die(f"{key}={value!r} in {where}: expected {want.__name__}, got bool")
        return value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    die(f"{key}={value!r} in {where}: expected {want.__name__} like {defaults[key]!r}, got {type(value).__name__}")




def check_rule(key, value, rule):
    fault = rule_fault(key, value, rule)
    if fault:
        die(fault)


def rule_fault(key, value, rule):
    # What is wrong with key=value under a RULES entry, or None. An entry: '> 0', '>= 1', an
    # interval '[0, 1)', a regular expression a string knob must match whole
    # ('auto|cpu|cuda(:[0-9]+)?'), or '' (any value of the knob's type).
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={value}: must be a finite number"
    if not rule or value is None:
        return None
    bound = re.fullmatch(r'(>=?)\s*(\S+)', rule)
    interval = re.fullmatch(r'([\[(])\s*([^,]+),\s*([^\])]+)([\])])', rule)
    if isinstance(value, str):
        return None if re.fullmatch(rule, value) else f"{key}={value!r}: must be one of {rule}"
    if bound:
        low = float(bound[2])
        ok = value >= low if bound[1] == '>=' else value > low
    elif interval:
        low, high = float(interval[2]), float(interval[3])
        ok = ((low <= value if interval[1] == '[' else low < value)
              and (value <= high if interval[4] == ']' else value < high))
    else:
        raise ValueError(f"bad rule {rule!r} for {key}")  # a mistake in the script, not the user's
    return None if ok else f"{key}={value!r}: must be {'in ' if interval else ''}{rule}"


def parse_value(text):
    if text in ('true', 'false'):  # forgive lower case booleans from shell habits
        return text == 'true'
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: --device=cpu, --dataset=pydocs


def configure(defaults, argv=None, strict_files=True, rules=None):
    # strict_files=False: a config file may set knobs this script does not use (plan.py reads
    # only the model shape and batch from a train config); the command line is always strict.
    # rules: knob -> rule (check_rule), checked on the final values, every knob in it.
    argv = sys.argv[1:] if argv is None else argv
    config = dict(defaults)
    for arg in argv:
        if arg.startswith('--'):
            if '=' not in arg:
                die(f"'{arg}': write overrides as --key=value")
            key, text = arg[2:].split('=', 1)
            value = parse_value(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # a string knob keeps its text: --balance=5,2,1 is not a tuple
            config[key] = check(key, value, defaults, 'the command line')
        else:
            try:
                source = open(arg).read()
            except OSError as e:
                die(f"cannot read config file '{arg}' ({e.strerror}); configs live in configs/*.py")
            scope = {}
            try:
                exec(compile(source, arg, 'exec'), {}, scope)
            except Exception as e:
                die(f"config file '{arg}' does not run: {type(e).__name__}: {e}")
            for key, value in scope.items():
                if is_knob(key, value) and (strict_files or key in defaults):
                    config[key] = check(key, value, defaults, arg)
    for key, rule in (rules or {}).items():
        check_rule(key, config[key], rule)
    return config


# -----------------------------------------------------------------------------
# --help, answered from the script's source: nothing of it runs, so no torch import (instant).
def answer_help(path, argv=None, model=False):
    # -h or --help among the arguments: print the usage and the knobs of the script at path (model:
    # and GPTConfig's, as knobs() lists them), exit 0
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
        try:
            print(help_text(path, model), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def knobs(path, model=False):
    # [(group, name, default as written, comment lines)] of a script: its module-level assignments
    # of plain values between its first two '# ----' rulers (the whole file if it has none). A
    # comment line at column 0 there starts a group (train.py's '# I/O'); an indented one goes on
    # with the comment of the knob above it (sample.py's init_from). model (train.py): with every
    # field of model.py's GPTConfig that the script does not set, after the script's 'model' group.
    source = open(path, encoding='utf-8').read()
    lines = source.splitlines()
    rulers = [n for n, line in enumerate(lines, 1) if re.fullmatch(r'# -{20,}', line)]
    first, last = rulers[:2] if len(rulers) > 1 else (0, len(lines) + 1)
    found = _assigned(source, ast.parse(source).body, first, last)
    if model:
        mine = {name for _, name, _, _ in found}
        ours = [i for i, (g, _, _, _) in enumerate(found) if g.split(':')[0] == 'model']
        at, group = (ours[-1] + 1, found[ours[-1]][0]) if ours else (len(found), 'model')
        fields = [(group, name, text, notes) for _, name, text, notes in model_knobs()
                  if name not in mine]
        found[at:at] = fields
    return found


def model_knobs():
    # GPTConfig's fields [(group '', name, default as written, comment lines)], read from
    # model.py's source as knobs() reads a script's (nothing runs: no torch). Every field is a
    # model knob of train.py and plan.py, a new one included.
    source = open(MODEL, encoding='utf-8').read()
    cls = next(node for node in ast.parse(source).body
               if isinstance(node, ast.ClassDef) and node.name == 'GPTConfig')
    return _assigned(source, cls.body, cls.lineno, cls.end_lineno + 1)


def model_defaults():
    return {name: ast.literal_eval(text) for _, name, text, _ in model_knobs()}


def model_types():
    # {field: its type as annotated in GPTConfig (int, float, bool or str), else its default's}
    source = open(MODEL, encoding='utf-8').read()
    cls = next(node for node in ast.parse(source).body
               if isinstance(node, ast.ClassDef) and node.name == 'GPTConfig')
    named, defaults = {'int': int, 'float': float, 'bool': bool, 'str': str}, model_defaults()
    return {node.target.id: named.get(getattr(node.annotation, 'id', None),
                                      type(defaults[node.target.id]))
            for node in cls.body
            if isinstance(node, ast.AnnAssign) and node.target.id in defaults}


def _assigned(source, body, first, last):
    # knobs(): the plain-valued assignments among body's statements (x = 1, or x: int = 1) on
    # lines first+1 to last-1, with the comments beside and below them, in groups
    lines = source.splitlines()
    comments = {t.start[0]: (t.start[1], t.string.lstrip('#').strip())  # line -> (column, text)
                for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT}
    assigned = {}  # first line -> (name, value node)
    for node in body:
        if isinstance(node, ast.Assign) and [type(t) for t in node.targets] == [ast.Name]:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            target = node.target
        else:
            continue
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError):
            continue  # computed: not a knob
        if is_knob(target.id, value):
            assigned[node.lineno] = (target.id, node)
    found, group, above = [], '', None  # above: the knob the line above belongs to
    for n in range(first + 1, last):
        name, node = assigned.get(n, (None, None))
        if node:
            v = node.value  # its text as written (ast's offsets count UTF-8 bytes)
            text = (lines[n - 1].encode()[v.col_offset:v.end_col_offset].decode()
                    if v.lineno == v.end_lineno == n else ast.get_source_segment(source, v))
            above = [group, name, text,
                     [comments[i][1] for i in range(n, node.end_lineno + 1) if i in comments]]
            found.append(above)
        elif n in comments and lines[n - 1].lstrip().startswith('#'):
            column, text = comments[n]
            if column == 0:
                group, above = text, None
            elif above:
                above[3].append(text)
        elif not (node or lines[n - 1].strip()):
            above = None  # a blank line ends a knob's comment
    return [tuple(k) for k in found]


def defaults_of(path, model=False):
    # {knob: default} of the script at path, read as --help reads it (knobs): nothing of it runs
    return {name: ast.literal_eval(text) for _, name, text, _ in knobs(path, model)}


def rules_of(path):
    # The script's RULES table, read from its source: its entries written as 'knob': 'rule'. A
    # spread of another table (train.py's **shape.RULES) or a computed rule is not read.
    for node in ast.parse(open(path, encoding='utf-8').read()).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and [getattr(t, 'id', None) for t in node.targets] == ['RULES']):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def help_text(path, model=False):
    source = open(path, encoding='utf-8').read()
    script, items = os.path.basename(path), knobs(path, model)
    column = min(26, 4 + max((len(f"{name} = {default}") for _, name, default, _ in items),
                             default=0))
    # the usage and the docstring's first line, the knobs (what --help is asked for), the rest
    doc = (ast.get_docstring(ast.parse(source)) or '').strip().splitlines()
    first = next((i for i, line in enumerate(doc) if not line or line[0] in ' $'), len(doc))
    doc = ['\n'.join(doc[:first]), '\n'.join(doc[first:]).strip('\n')]  # (summary; the rest)
    out = [f"usage: python {script} [CONFIG.py ...] [--key=value ...]", '', doc[0], '',
           "Knobs, with their defaults (a config file or --key=value sets them):"]
    group = None
    for g, name, default, note in items:
        if g != group:
            out += ['', g] if g else ['']
            group = g
        note = note or ['']  # (its lines as the file breaks them)
        out.append((f"  {name} = {default}".ljust(column - 2) + '  ' + note[0]).rstrip())
        out += [' ' * column + line for line in note[1:]]
    out += ['', doc[1], '', textwrap.fill(
        f"Arguments, applied in order: config files (plain Python assignments of the knobs "
        f"above, as in configs/*.py) and --key=value overrides. Every value is checked against "
        f"its knob's type and range (RULES in {script}): an unknown key or a bad value stops "
        f"with one line, before anything runs.", 100)]
    return '\n'.join(out)
