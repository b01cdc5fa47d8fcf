"""
nanoGPT-style configuration, shared by train.py, sample.py, plan.py and bench/.
A script keeps its knobs as commented module-level globals and calls

    globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))

Arguments: config files (plain Python assignments, e.g. configs/gpt_13b.py) and --key=value
overrides, applied in order. Unknown keys and wrong types exit with one line that says what to
do: a typo must never train the wrong model silently.
"""
import ast
import difflib
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


def parse_value(text):
    if text in ('true', 'false'):  # forgive lower case booleans from shell habits
        return text == 'true'
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: --device=cpu, --dataset=pydocs


def configure(defaults, argv=None, strict_files=True):
    # strict_files=False: a config file may set knobs this script does not use (plan.py reads
    # only the model shape and batch from a train config); the command line is always strict.
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
    return config
