"""
The README's commands run as written after `make demo`: every line of its ```sh blocks that is
safe on this CPU machine, in order, in a copy of the repository where the demo has run (its
pydocs corpus and a checkpoint in out/tiny, made here in a few steps). A line that is not run is
in SKIP, with the reason.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = {  # the start of a README command: why this test does not run it
    'make ': 'make demo, check and test: this suite is make test',
    'pip install': 'an install from the network',
    'torchrun': 'a node of GPUs',
}


def readme_commands():
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    blocks = re.findall(r'^```sh\n(.*?)^```', text, flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_s_commands_run_as_written_after_make_demo(tmp_path):
    commands = readme_commands()
    run = [c for c in commands if not any(c.startswith(s) for s in SKIP)]
    assert any('train.py' in c for c in run) and any('plan.py' in c for c in run), commands
    work = tmp_path / 'hetgpt'
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(
        '.git', '.venv*', 'out', '__pycache__', '.pytest_cache', 'data'))
    (work / 'data').mkdir()
    shutil.copy(os.path.join(ROOT, 'data', 'prepare.py'), work / 'data')
    (work / 'my_texts').mkdir()  # the README's stand-in for the reader's own texts
    for i in range(3):
        (work / 'my_texts' / f'{i}.txt').write_text(f"My text number {i}.\n" * 40)
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore',
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])

    def sh(command):
        return subprocess.run(['bash', '-c', command], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)

    # make demo's state: its corpus, and its run in out/tiny (2 steps of it, eager, here)
    assert sh('python data/prepare.py --dataset pydocs').returncode == 0
    demo = sh('python train.py configs/gpt_tiny.py --device=cpu --max_iters=2 --compile=False')
    assert demo.returncode == 0, demo.stderr[-2000:]
    for command in run:
        p = sh(command)
        assert p.returncode == 0, (command, p.stdout[-1000:], p.stderr[-2000:])
        assert 'Traceback' not in p.stderr, (command, p.stderr[-2000:])
