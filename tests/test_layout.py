"""
The house by role (README's "The package"): the planner (a dry run) imports
nothing of the run or the data; model.py reaches only its initial-weights
helper; the knobs and the GPU table import no torch; plan.py's import
closure holds no checkpoint code and no process group; and README's table
names every module of the package once. Imports are read from the sources
(every `import`, at module level or inside a function), and plan.py's
closure is also seen as Python loads it.
"""
import ast
import json
import os
import re
import subprocess
import sys

from trainer import ROOT

PACKAGE = os.path.join(ROOT, 'hetgpt')
LEAVES = {'errors', 'knobs', 'hardware', 'gpus', 'rates', 'init_weights', 'owners'}


def modules():
    """{dotted name: path} of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith('.py'):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if rel[-1] == '__init__':
                    rel = rel[:-1]
                found['.'.join(rel)] = path
    return found


MODULES = modules()


def imports(path):
    """The modules a source file imports, wherever in it, by dotted name:
    `from a.b import c` gives a.b.c where that is a module, else a.b."""
    tree = ast.parse(open(path, encoding='utf-8').read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
    return out


def closure(path):
    """Every module of the repository reached from a file's imports, and
    every outside module they name (torch, ...), as {name: importer}."""
    seen, todo = {}, [(name, path) for name in imports(path)]
    while todo:
        name, by = todo.pop()
        if name in seen:
            continue
        seen[name] = by
        parts = name.split('.')
        for k in range(1, len(parts) + 1):  # a package's __init__ too
            prefix = '.'.join(parts[:k])
            if prefix in MODULES and prefix not in seen:
                todo.append((prefix, by))
        where = MODULES.get(name)
        if where is None and name in ('model', 'train', 'plan', 'sample'):
            where = os.path.join(ROOT, f'{name}.py')
        if where:
            todo += [(n, where) for n in imports(where)]
    return seen


def rel(path):
    return os.path.relpath(path, ROOT)


def test_the_package_is_three_folders_and_shared_leaves():
    top = {name.split('.')[1] for name in MODULES if name != 'hetgpt'}
    assert top == {'planner', 'run', 'data'} | LEAVES, top
    for name, path in MODULES.items():
        if name.count('.') == 1 and name.split('.')[1] in LEAVES:
            mine = {n for n in imports(path) if n.startswith('hetgpt.')}
            above = {n for n in mine if n.split('.')[1] not in LEAVES}
            assert not above, f"{rel(path)}, a shared leaf, imports {above}"


def test_the_planner_imports_nothing_of_the_run_or_the_data():
    for name, path in MODULES.items():
        if not name.startswith('hetgpt.planner'):
            continue
        reached = closure(path)
        bad = {n: rel(by) for n, by in reached.items()
               if n.startswith(('hetgpt.run', 'hetgpt.data'))}
        assert not bad, f"{rel(path)} reaches {bad} (module: its importer)"


def test_model_py_imports_only_its_initial_weights_helper():
    mine = {n for n in imports(os.path.join(ROOT, 'model.py'))
            if n.startswith('hetgpt')}
    assert mine == {'hetgpt.init_weights'}, mine
    reached = closure(os.path.join(ROOT, 'model.py'))
    assert {n for n in reached if n.startswith('hetgpt.')} == {'hetgpt.init_weights'}


def test_the_knobs_and_the_gpu_table_import_no_torch():
    for leaf in ('knobs', 'gpus', 'rates', 'errors'):
        reached = closure(MODULES[f'hetgpt.{leaf}'])
        assert not any(n.split('.')[0] in ('torch', 'numpy') for n in reached), \
            (leaf, sorted(reached))
    # and as Python loads them
    code = ("import sys; import hetgpt.knobs, hetgpt.gpus, hetgpt.rates; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout == 'False\n', r.stderr


def test_plan_py_loads_no_checkpoint_code_and_no_process_group():
    reached = closure(os.path.join(ROOT, 'plan.py'))
    bad = {n: rel(by) for n, by in reached.items()
           if n.startswith(('hetgpt.run', 'torch.distributed.checkpoint'))
           or n == 'torch.distributed'}
    assert not bad, bad
    # and as it runs: a real plan, then what Python had loaded
    code = ("import json, runpy, sys\n"
            "sys.argv = ['plan.py', 'configs/gpt_tiny.py', '--gpus', '2xcpu',"
            " '--host_mem', '16']\n"
            "try:\n"
            "    runpy.run_path('plan.py', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "import torch.distributed as dist\n"
            "print(json.dumps([sorted(sys.modules), dist.is_initialized()]))\n")
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded, initialized = json.loads(r.stdout.splitlines()[-1])
    assert 'plan: ' in r.stdout and not initialized
    bad = [n for n in loaded if n.startswith(('hetgpt.run', 'hetgpt.data',
                                              'torch.distributed.checkpoint'))]
    assert not bad, bad


def test_readme_names_every_module_once():
    # README's table of modules: a row per module, `hetgpt/[folder/]name.py`
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    rows = re.findall(r'^\| `hetgpt/((?:planner/|run/|data/)?\w+\.py)` \|', text, re.M)
    named = [f"hetgpt.{r[:-3].replace('/', '.')}" for r in rows]
    have = {n for n in MODULES if n.count('.') >= 1 and not n.endswith('__init__')
            and n not in ('hetgpt.planner', 'hetgpt.run', 'hetgpt.data')}
    assert sorted(named) == sorted(set(named)), "a module named twice"
    assert set(named) == have, (set(named) ^ have)
    # and the package's __init__ keeps no second index: it names no module
    init = open(os.path.join(PACKAGE, '__init__.py'), encoding='utf-8').read()
    for name in have:
        assert not re.search(rf"\b{name.split('.')[-1]}\b", init), (name, init)
