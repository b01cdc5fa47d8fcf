"""
plot.py on a metrics.jsonl made here: writes a real PNG; a user's mistake (usage, no matplotlib, no
metrics or rows, nowhere to write) is one line on stderr and exit status 2.
"""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

from trainer import one_error_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plot(*out_dirs, hide_matplotlib=False):
    cmd = [sys.executable, 'plot.py', *out_dirs]
    if hide_matplotlib:  # run plot.py as if matplotlib were not installed: its import fails
        cmd[1:2] = ['-c', "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                          "runpy.run_path('plot.py', run_name='__main__')", 'plot.py']
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def write_metrics(path):
    with open(path, 'w') as f:
        for it in range(0, 301, 10):
            lr = 2e-3 * min(1, (it + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * it / 300))
            f.write(json.dumps(dict(iter=it, loss=10.8 * math.exp(-it / 80) + 3, lr=lr, tokens=4096 * (it + 1),
                                    tokens_per_sec=9000.0, mfu=None)) + '\n')
            if it % 100 == 0:
                f.write(json.dumps(dict(iter=it, tokens=4096 * (it + 1), val_loss=10.9 * math.exp(-it / 80) + 3.2,
                                        train_loss=10.8 * math.exp(-it / 80) + 3)) + '\n')
        f.write('{"iter": 310, "lo')  # a half-written last line while training runs


def test_plot_writes_png(tmp_path):
    write_metrics(tmp_path / 'metrics.jsonl')
    r = plot(str(tmp_path))
    assert r.returncode == 0, r.stderr
    png = tmp_path / 'loss.png'
    data = png.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 10_000
    import matplotlib.image
    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 500
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 10  # lines, text, legend: not a blank canvas


def test_plot_compares_runs(tmp_path):
    # two runs in one plot (compare.png in the first), a colour each; the first's loss.png untouched
    for run in ('a', 'b'):
        (tmp_path / run).mkdir()
        write_metrics(tmp_path / run / 'metrics.jsonl')
    text = (tmp_path / 'b' / 'metrics.jsonl').read_text()  # b's losses 2 higher: apart from a's
    (tmp_path / 'b' / 'metrics.jsonl').write_text(re.sub(
        r'"(loss|val_loss)": ([\d.]+)', lambda m: f'"{m[1]}": {float(m[2]) + 2}', text))
    r = plot(str(tmp_path / 'a'), str(tmp_path / 'b'))
    assert r.returncode == 0, r.stderr
    import matplotlib.image
    pixels = matplotlib.image.imread(str(tmp_path / 'a' / 'compare.png'))
    rgb = pixels.reshape(-1, pixels.shape[-1])[:, :3]
    for colour in ((0.12, 0.47, 0.71), (1.0, 0.5, 0.05)):  # matplotlib's C0 and C1: a run each
        assert (np.abs(rgb - colour).max(axis=1) < 0.01).sum() > 100, colour
    assert not (tmp_path / 'a' / 'loss.png').exists()
    assert 'no' in one_error_line(plot(str(tmp_path / 'a'), str(tmp_path / 'nothing')))


def test_plot_without_matplotlib(tmp_path):
    write_metrics(tmp_path / 'metrics.jsonl')
    r = plot(str(tmp_path), hide_matplotlib=True)
    assert one_error_line(r) == "error: plot.py needs matplotlib: pip install matplotlib"
    assert not (tmp_path / 'loss.png').exists()


def test_plot_without_metrics(tmp_path):
    assert 'train' in one_error_line(plot(str(tmp_path / 'nothing')))
    write_metrics(tmp_path / 'metrics.jsonl')  # the file given where its folder is wanted
    assert 'give the run\'s folder' in one_error_line(plot(str(tmp_path / 'metrics.jsonl')))


def test_plot_usage():
    for args in ([], ['a', '--out'], ['--out']):  # (-h and --help: tests/test_help.py)
        r = subprocess.run([sys.executable, 'plot.py', *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert 'usage: python plot.py OUT_DIR' in one_error_line(r)


def test_plot_without_rows(tmp_path):
    # empty, or lines that are not train.py's rows (not objects, no iter or tokens, no number)
    others = ['3', '[1, 2]', '{"iter": "x", "tokens": 1, "loss": 2}', '{"iter": 1, "loss": 2}',
              '{"iter": 1, "tokens": 2, "loss": "low"}']
    for text in ('', '\n'.join(others) + '\n'):
        (tmp_path / 'metrics.jsonl').write_text(text)
        assert 'no train or eval rows' in one_error_line(plot(str(tmp_path)))
    (tmp_path / 'metrics.jsonl').write_bytes(b'\xff\xfe{"iter": 1}\n')  # not UTF-8
    assert 'no train or eval rows' in one_error_line(plot(str(tmp_path)))


def test_plot_cannot_write(tmp_path):
    write_metrics(tmp_path / 'metrics.jsonl')
    (tmp_path / 'loss.png').mkdir()  # where the picture goes, a directory is in the way
    (tmp_path / 'loss.png' / 'keep.txt').write_text('mine')
    assert 'loss.png is not a file' in one_error_line(plot(str(tmp_path)))
    assert (tmp_path / 'loss.png' / 'keep.txt').read_text() == 'mine'
