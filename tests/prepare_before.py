"""
Prints test_prepare.BEFORE: the digests of the .bin files that data/prepare.py as it was before
datasets (f1497e5, read from git) makes from test_prepare.fixture_cases.
    python tests/prepare_before.py
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
import test_prepare  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    (tmp / "data").mkdir()
    (tmp / "data" / "prepare.py").write_text(subprocess.run(
        ["git", "show", "f1497e5:data/prepare.py"], cwd=ROOT, check=True, capture_output=True,
        text=True).stdout)
    (tmp / "in").mkdir()
    for case, args in test_prepare.fixture_cases(tmp / "in").items():
        subprocess.run([sys.executable, str(tmp / "data" / "prepare.py"), *args, "--name", case,
                        "--out_dir", str(tmp / "out"), "--num_proc", "2"], check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL)
        print(f"    {case!r}: {test_prepare.digest(tmp / 'out' / case)!r},")
