"""
The package's shape, read from a checkout's sources (nothing runs): what
plan.py and train.py reach through their imports, the modules train.py's
loop calls, and the package's line statistics (issue 47's table).

  python bench/layout.py              # this checkout
  python bench/layout.py /tmp/old     # another (e.g. a git worktree of 724c3cf)

The loop: train.py from its '# The loop' ruler to the end, and the
functions of train.py it calls (forward, validate, ...). A call there is
a module's when it calls the module (optim.step(...)) or a global that
train.py made from the module (speed.end(...): speed = Speed(...), from
balance). A script's reach counts the script itself.
"""
import ast
import os
import sys


def lines(path):
    """The non-blank lines of a file."""
    with open(path, encoding='utf-8') as f:
        return [line.rstrip('\n') for line in f if line.strip()]


def modules(root):
    """{dotted name: path} of the repository's Python modules."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith('.')
                   and d not in ('tests', 'bench', '__pycache__')]
        for f in files:
            if not f.endswith('.py'):
                continue
            path = os.path.join(folder, f)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] == '__init__':
                parts = parts[:-1]
            found['.'.join(parts)] = path
    return found


def imports(path, known):
    """The repository's modules a file imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                names.append(sub if sub in known else node.module)
        for name in names:
            parts = name.split('.')
            for k in range(1, len(parts) + 1):
                if '.'.join(parts[:k]) in known:
                    out.add('.'.join(parts[:k]))
    return out


def closure(path, known):
    """The repository's files a file reaches through imports."""
    seen, todo = set(), list(imports(path, known))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += imports(known[name], known)
    return {known[n] for n in seen}


def loop_modules(root, known):
    """The package's modules that train.py's loop calls."""
    source = open(os.path.join(root, 'train.py'), encoding='utf-8').read()
    tree = ast.parse(source)
    by_name = {}  # a global of train.py -> the module it came from
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                by_name[a.asname or a.name] = sub if sub in known \
                    else node.module
    for node in tree.body:  # x = module.f(...) or x = F(...)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            head = func.value if isinstance(func, ast.Attribute) else func
            origin = by_name.get(getattr(head, 'id', None))
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name) and origin:
                        by_name.setdefault(t.id, origin)
    start = source.splitlines().index('# The loop')
    region = [n for n in tree.body if n.lineno > start]
    functions = {n.name: n for n in tree.body
                 if isinstance(n, ast.FunctionDef)}
    todo, used, done = list(region), set(), set()
    while todo:  # the names called: f(...), x.f(...), with x(...) as a with
        node = todo.pop()
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            head = n.func
            while isinstance(head, ast.Attribute):
                head = head.value
            if isinstance(head, ast.Name):
                used.add(head.id)
                if head.id in functions and head.id not in done:
                    done.add(head.id)
                    todo.append(functions[head.id])
    found = {by_name[n] for n in used if n in by_name}
    return sorted(m for m in found
                  if m.startswith('hetgpt.') and m in known)


def stats(paths):
    """Line statistics of some files."""
    text, ifexp, funcs, docs = [], 0, 0, 0
    for p in paths:
        text += lines(p)
        tree = ast.parse(open(p, encoding='utf-8').read())
        ifexp += sum(isinstance(n, ast.IfExp) for n in ast.walk(tree))
        defs = [n for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        funcs += len(defs)
        docs += sum(ast.get_docstring(n) is not None for n in defs)
    n = max(1, len(text))
    return dict(files=len(paths), lines=len(text),
                mean=sum(map(len, text)) / n,
                long=sum(len(t) >= 90 for t in text) / n,
                ifexp=100 * ifexp / n, docs=docs / max(1, funcs))


def main(root):
    known = modules(root)
    package = [p for name, p in known.items()
               if name.startswith('hetgpt.') or name == 'hetgpt']
    package = [p for p in package if not p.endswith('__init__.py')
               or lines(p)]
    out = {}
    for script in ('plan.py', 'train.py'):  # (the script itself counted)
        path = os.path.join(root, script)
        reached = closure(path, known) | {path}
        out[script] = stats(sorted(reached))
    loop = loop_modules(root, known)
    out['loop'] = stats([known[m] for m in loop])
    out['package'] = stats(package)
    core = [os.path.join(root, f) for f in ('model.py', 'train.py')]
    out['core'] = stats(core)
    print(f"root: {root}")
    for key in ('plan.py', 'train.py'):
        s = out[key]
        print(f"{key} reaches {s['files']} files, {s['lines']:,} lines")
    s = out['loop']
    print(f"the loop calls {s['files']} modules, {s['lines']:,} lines: "
          f"{', '.join(m[7:] for m in loop)}")
    for key in ('package', 'core'):
        s = out[key]
        print(f"{key}: {s['files']} files, {s['lines']:,} lines, mean "
              f"{s['mean']:.1f} chars, {s['long']:.1%} >= 90, "
              f"{s['ifexp']:.2f} inline conditionals per 100 lines, "
              f"{s['docs']:.0%} of functions with a docstring")
    return out


if __name__ == '__main__':
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1] if len(sys.argv) > 1 else here)
