"""
nanoGPT-style configuration, shared by train.py, sample.py, plan.py and bench/.
A script keeps its knobs as commented module-level globals and calls

    globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))

Arguments: config files (plain Python assignments, e.g. configs/gpt_13b.py) and --key=value
overrides, applied in order. Unknown keys, wrong types and values out of range (a script's RULES
table, checked by configure) exit with one line that says what to do: a typo must never train the
wrong model silently.
"""
import ast
import difflib
import math
import re
import sys


def is_knob(name, value):
    return not name.startswith('_') and isinstance(value, (int, float, bool, str, type(None)))


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


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


def oneline(e):
    # An exception as one line of an error message.
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def check_rule(key, value, rule):
    # A RULES entry: '> 0', '>= 1', an interval '[0, 1)', a regular expression a string knob must
    # match whole ('auto|cpu|cuda(:[0-9]+)?'), or '' (any value of the knob's type).
    if isinstance(value, float) and not math.isfinite(value):
        die(f"{key}={value}: must be a finite number")
    if not rule or value is None:
        return
    bound = re.fullmatch(r'(>=?)\s*(\S+)', rule)
    interval = re.fullmatch(r'([\[(])\s*([^,]+),\s*([^\])]+)([\])])', rule)
    if isinstance(value, str):
        if not re.fullmatch(rule, value):
            die(f"{key}={value!r}: must be one of {rule}")
        return
    if bound:
        low = float(bound[2])
        ok = value >= low if bound[1] == '>=' else value > low
    elif interval:
        low, high = float(interval[2]), float(interval[3])
        ok = ((low <= value if interval[1] == '[' else low < value)
              and (value <= high if interval[4] == ']' else value < high))
    else:
        raise ValueError(f"bad rule {rule!r} for {key}")  # a mistake in the script, not the user's
    if not ok:
        die(f"{key}={value!r}: must be {'in ' if interval else ''}{rule}")


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
