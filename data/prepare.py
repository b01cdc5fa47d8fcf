"""
Tokenize a text corpus with the GPT-2 BPE into data/<name>/{train,val}.bin + meta.json.

    python data/prepare.py --dataset pydocs                 # offline: Python's own documentation
    python data/prepare.py --input notes/ more.jsonl --name notes
    python data/prepare.py --input dump/ --text_field content   # .jsonl/.parquet: another field
    python data/prepare.py --dataset openwebtext            # the hub's parquet files, read as needed
    python data/prepare.py --dataset openwebtext --input owt/  # a local copy of the hub's repository

The .bin files are flat np.uint16 arrays of token ids, every document followed by <|endoftext|>,
as in nanoGPT. The inputs are read as they are tokenized (a line, a batch of parquet rows at a
time), so memory does not grow with the corpus; each document goes to val or train by a draw
from (seed, its index). Importing this file is cheap and does nothing but put the repository on
sys.path, for the tokenizer (tokenizer.py).
"""
import argparse
import collections
import hashlib
import itertools
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as data/prepare.py, sys.path has data/, not the repository
    sys.path.insert(0, ROOT)
from hetgpt.tokenizer import EOT, gpt2_encoding  # noqa: E402  (the GPT-2 BPE, offline)

OWT_REPO = "Skylion007/openwebtext"
OWT_REVISION = "main"  # the branch read; its commit is written into meta.json's source
OWT_PARQUET_BRANCH = "refs/convert/parquet"  # the hub's own parquet copy of every dataset
INPUT_TYPES = (".txt", ".jsonl", ".parquet")
PROGRESS_SECONDS = 5  # between progress lines, when there is no tqdm bar


def die(msg):
    # configurator.die, which this script cannot import when run as data/prepare.py: a user's
    # mistake is one line on stderr and exit status 2.
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other mistake (argparse prints the usage too)
        die(f"{message} (python data/prepare.py -h for help)")

# -----------------------------------------------------------------------------
# sources: each yields its documents (str) in a deterministic order, a bit at a time


class Mistake(Exception):
    """A user's mistake found while reading the inputs: main() cleans up, then dies with it."""


def input_files(paths):
    """The files of --input, in order: files as given, and each folder's .txt/.jsonl/.parquet
    files (sorted; hidden ones, and hidden folders, left out). Prints what the folders held that
    is not read, in one line."""
    files, skipped = [], collections.Counter()
    for p in paths:
        if not os.path.exists(p):
            die(f"{p} does not exist: give --input existing .txt/.jsonl/.parquet files or folders")
        if os.path.isdir(p):
            found, other = [], collections.Counter()
            for root, dirs, names in os.walk(p):
                other["hidden"] += sum(d.startswith(".") for d in dirs)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in names:
                    if f.startswith("."):
                        other["hidden"] += 1
                    elif f.lower().endswith(INPUT_TYPES):
                        found.append(os.path.join(root, f))
                    else:
                        other[os.path.splitext(f)[1].lower() or "without extension"] += 1
            other = +other  # drops a zero count
            if not found:
                die(f"{p} holds no .txt, .jsonl or .parquet files"
                    + (f" (only {counted(other)})" if other else ""))
            files += sorted(found)
            skipped += other
        elif p.lower().endswith(INPUT_TYPES):
            files.append(p)
        else:
            die(f"{p}: unknown file type; --input takes .txt (one document), .jsonl or .parquet "
                f"(a 'text' field, or --text_field), or folders of them")
    if skipped:
        print(f"skipped {sum(skipped.values())} files: {counted(skipped)}")
    return files


def counted(counter):
    by_count = sorted(counter.items(), key=lambda c: (-c[1], c[0]))
    return ", ".join(f"{n} {what}" for what, n in by_count)


def file_documents(path, text_field):
    """(document, bytes of path read) for each document of a file: a .txt whole, the text_field
    of each line of a .jsonl and of each row of a .parquet, read a line or a batch of rows at a
    time (the memory a file takes does not grow with its size). Empty values (null, "") are
    documents with no text, which the caller leaves out."""
    kind = os.path.splitext(path)[1].lower()
    i = 0
    try:
        if kind == ".txt":
            with open(path, encoding="utf-8") as f:
                yield f.read(), os.path.getsize(path)
        elif kind == ".jsonl":
            with open(path, "rb") as f:
                done = 0
                for i, line in enumerate(f, 1):
                    done += len(line)
                    if not line.strip():
                        continue
                    row = json.loads(line.decode("utf-8"))
                    if not isinstance(row, dict):
                        raise Mistake(f"{path}:{i}: {json_type(row)}, not a JSON object "
                                      f"(each line of a .jsonl is one {{\"{text_field}\": ...}})")
                    if text_field not in row:
                        raise Mistake(f"{path}:{i}: no '{text_field}' field (its fields: "
                                      f"{', '.join(row) or 'none'}); name the text's field with "
                                      f"--text_field")
                    text = row[text_field]
                    if text is not None and not isinstance(text, str):
                        raise Mistake(f"{path}:{i}: '{text_field}' is {json_type(text)}, not a "
                                      f"string; name the text's field with --text_field")
                    yield text or "", done
        else:  # .parquet
            import pyarrow.parquet as pq
            with pq.ParquetFile(path) as pf:
                yield from parquet_documents(pf, path, text_field, os.path.getsize(path))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, bad JSON, not parquet
        where = f"{path}:{i}" if kind == ".jsonl" and i else path
        raise Mistake(f"cannot read {where} ({type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0]})") from None


def parquet_documents(pf, path, text_field, size):
    """file_documents of a .parquet file pf of size bytes: the one column read, a row group at a
    time (asked for all row groups at once, pyarrow 26's iter_batches held the whole column)."""
    if text_field not in pf.schema_arrow.names:
        raise Mistake(f"{path} has no '{text_field}' column (its columns: "
                      f"{', '.join(pf.schema_arrow.names) or 'none'}); name the text's "
                      f"column with --text_field")
    rows, done = max(pf.metadata.num_rows, 1), 0
    batches = (b for g in range(pf.num_row_groups) for b in pf.iter_batches(
        batch_size=256, row_groups=[g], columns=[text_field], use_threads=False))  # one column
    for batch in batches:
        done += batch.num_rows
        for text in batch.column(0).to_pylist():
            if text is not None and not isinstance(text, str):
                raise Mistake(f"{path}: column '{text_field}' holds "
                              f"{pf.schema_arrow.field(text_field).type}, not text; "
                              f"name the text's column with --text_field")
            yield text or "", size * done // rows


def json_type(value):
    return {bool: "a boolean", int: "a number", float: "a number", list: "an array",
            dict: "an object", str: "a string"}.get(type(value), type(value).__name__)


def input_documents(files, sizes, text_field):
    """(document, bytes of all files read) for the documents of files, in order."""
    before = 0
    for path, size in zip(files, sizes):
        for text, done in file_documents(path, text_field):
            yield text, before + done
        before += size


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
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (HERE, ROOT)]
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


def is_val(seed, i, val_fraction):
    """Whether document i goes to val: a number in [0, 1) drawn from (seed, i) alone, so the
    split is decided as documents stream by, and is the same for the same input and seed."""
    h = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < val_fraction


def split_documents(docs, val_fraction, seed):
    """(is_val, document, progress) for each (document, progress) of docs. Each goes to val by
    is_val, but the last: it goes to val when no other did, to train when all others went to
    val, so that both sets have one. A single document is cut in two."""
    held, n, n_val = None, 0, 0  # the document before the current one: the last, once docs end
    for text, done in docs:
        if held is not None:
            v = is_val(seed, n - 1, val_fraction)
            n_val += v
            yield v, *held
        held, n = (text, done), n + 1
    if n == 0 or (n == 1 and len(held[0]) < 2):
        raise Mistake("no usable documents (all empty?): give files with text in them")
    text, done = held
    if n == 1:
        cut = int(len(text) * (1 - val_fraction))
        cut = text.rfind("\n", 0, cut) + 1 or cut  # at a line start when there is one
        cut = min(max(cut, 1), len(text) - 1)
        yield False, text[:cut], done
        yield True, text[cut:], done
    else:
        yield (n_val == 0 or (n_val < n - 1 and is_val(seed, n - 1, val_fraction))), text, done


def batches(items, max_chars=1 << 20, max_docs=1024):
    """(is_val flags, documents, progress) of about 1 MB: work units for the tokenizer processes."""
    flags, texts, chars = [], [], 0
    for v, text, done in items:
        flags.append(v)
        texts.append(text)
        chars += len(text)
        if chars >= max_chars or len(texts) >= max_docs:
            yield flags, texts, done
            flags, texts, chars = [], [], 0
    if texts:
        yield flags, texts, done


def encode_batch(texts):
    enc = gpt2_encoding()  # built once per process
    # encode_ordinary: an "<|endoftext|>" inside a text is ordinary text, only ours are EOT tokens
    ids = [enc.encode_ordinary(t) + [EOT] for t in texts]
    return np.array([len(x) for x in ids]), np.fromiter(itertools.chain.from_iterable(ids),
                                                        dtype=np.uint16)


class Progress:
    """A tqdm bar on a terminal; else (a log, or no tqdm) a line every PROGRESS_SECONDS with
    done/total and the time left."""

    def __init__(self, total, unit):
        self.total, self.unit, self.bar, self.done = total, unit, None, 0
        self.start = self.last = time.monotonic()
        try:
            from tqdm import tqdm
            if sys.stderr.isatty():
                self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc="tokenizing")
        except ImportError:
            pass

    def update(self, done):
        if self.bar is not None:
            self.bar.update(done - self.done)
        elif time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last, elapsed = time.monotonic(), time.monotonic() - self.start
            eta = elapsed * (self.total - done) / done if done else float("nan")
            print(f"tokenizing: {size(done, self.unit)}/{size(self.total, self.unit)} "
                  f"({100 * done / max(self.total, 1):.0f}%), ETA {clock(eta)}", flush=True)
        self.done = done

    def close(self):  # the bar ends its line, so an error below is a line of its own
        if self.bar is not None:
            self.bar.close()


def size(n, unit):
    return f"{n / 1e6:,.1f} MB" if unit == "B" else f"{n:,} {unit}"


def clock(seconds):
    if seconds != seconds:  # nan: nothing done yet
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def write_sets(folder, items, total, unit, pool, num_proc):
    """Tokenizes the (is_val, document, progress) items, in order, into folder/train.bin.tmp and
    val.bin.tmp; returns {split: (tokens, documents)}."""
    files = {s: open(os.path.join(folder, f"{s}.bin.tmp"), "wb") for s in ("train", "val")}
    counts = {s: [0, 0] for s in files}
    progress = Progress(total, unit)

    def write(flags, lengths, ids, done):
        for s, docs in (("train", ~np.array(flags)), ("val", np.array(flags))):
            part = ids[np.repeat(docs, lengths)]  # the tokens of this set's documents, in order
            part.tofile(files[s])
            counts[s][0] += len(part)
            counts[s][1] += int(docs.sum())
        progress.update(done)

    try:
        if pool is None:
            for flags, texts, done in batches(items):
                write(flags, *encode_batch(texts), done)
        else:  # a few batches per process in flight: the reading stays just ahead of the workers
            pending = collections.deque()
            for flags, texts, done in batches(items):
                pending.append((flags, pool.apply_async(encode_batch, (texts,)), done))
                if len(pending) >= 2 * num_proc:
                    flags, result, done = pending.popleft()
                    write(flags, *result.get(), done)
            while pending:
                flags, result, done = pending.popleft()
                write(flags, *result.get(), done)
    finally:
        for f in files.values():
            f.close()
        progress.close()
    return {s: tuple(c) for s, c in counts.items()}


def openwebtext_files(local):
    """OpenWebText's parquet files as [(name, bytes)] and an opener of a name: from the hub (its
    repository's *.parquet at OWT_REVISION, else the hub's own parquet conversion of it), or from
    local, a copy laid out as the hub's (`huggingface-cli download Skylion007/openwebtext
    --repo-type dataset --local-dir DIR`). The hub's files are read as pyarrow asks, a row group
    at a time (HfFileSystem: ranges of a file, through the hub client's endpoint, proxy and token
    settings), never whole: --limit reads only what it keeps. The repository's loading script is
    never run, and load_dataset(OWT_REPO) never called (datasets >= 4 refuses a repository that
    holds a script, even beside parquet files: nanoGPT issue #633)."""
    if local is not None:
        names = sorted(os.path.relpath(os.path.join(root, f), local)
                       for root, dirs, files in os.walk(local) for f in files
                       if f.endswith(".parquet") and not f.startswith("."))
        if not names:
            die(f"{local} holds no .parquet files: give a copy of the hub's {OWT_REPO} "
                f"(huggingface-cli download {OWT_REPO} --repo-type dataset --local-dir DIR)")
        return ([(n, os.path.getsize(os.path.join(local, n))) for n in names],
                lambda n: open(os.path.join(local, n), "rb"), f"{os.path.abspath(local)}")
    from huggingface_hub import HfApi, HfFileSystem, constants
    fs, found = HfFileSystem(), {}
    try:
        for revision in (OWT_REVISION, OWT_PARQUET_BRANCH):
            # the branch's commit now, read for the whole run and written into meta.json
            commit = HfApi().dataset_info(OWT_REPO, revision=revision).sha
            root = f"datasets/{OWT_REPO}@{commit}"
            found = fs.glob(f"{root}/**/*.parquet", detail=True)
            if found:
                break
    except Exception as e:  # offline (HF_HUB_OFFLINE), no answer, a proxy or TLS failure
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        die(f"cannot list {OWT_REPO} on {constants.ENDPOINT} ({reason}); it needs internet "
            f"(tens of GB, read as it is tokenized), or --input DIR: a local copy of it")
    if not found:
        die(f"{OWT_REPO} has no parquet files on {constants.ENDPOINT}, nor in its "
            f"{OWT_PARQUET_BRANCH}: give --input DIR, a local copy of it in parquet")
    names = sorted(found)
    return ([(n[len(root) + 1:], found[n]["size"]) for n in names],
            lambda n: fs.open(f"{root}/{n}", "rb", block_size=16 << 20),
            f"hf://{root}")


def openwebtext_documents(files, opener):
    """(document, bytes of all files read) of OpenWebText's parquet files, in order: each read
    by the reader of a local .parquet (parquet_documents), a row group at a time."""
    import pyarrow.parquet as pq
    before = 0
    for name, size in files:
        try:
            with opener(name) as f, pq.ParquetFile(f) as pf:
                for text, done in parquet_documents(pf, name, "text", size):
                    yield text, before + done
        except (OSError, ValueError) as e:  # a dropped connection, a damaged file
            raise Mistake(f"cannot read {name} ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0]})") from None
        before += size

# -----------------------------------------------------------------------------


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["pydocs", "openwebtext"], help="a built-in corpus")
    p.add_argument("--input", nargs="+", metavar="PATH",
                   help=".txt/.jsonl/.parquet files or folders (with --dataset openwebtext: a "
                        "local copy of the hub's repository)")
    p.add_argument("--text_field", default="text", metavar="NAME",
                   help="the .jsonl field or .parquet column of the text (default: text)")
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
    if (args.dataset is None) == (args.input is None) and args.dataset != "openwebtext":
        p.error("give either --dataset pydocs|openwebtext or --input PATH [PATH ...]")
    if args.dataset == "openwebtext" and args.input and (
            len(args.input) > 1 or not os.path.isdir(args.input[0])):
        p.error("--dataset openwebtext --input takes one folder: a local copy of the hub's "
                f"{OWT_REPO}")
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
    except ValueError as e:
        die(str(e))

    if args.dataset == "openwebtext":
        files, opener, source = openwebtext_files(args.input[0] if args.input else None)
        docs = openwebtext_documents(files, opener)
        total, source = sum(size for _, size in files), f"openwebtext: {source}"
    elif args.dataset == "pydocs":
        print("collecting the Python documentation...")
        docs = pydocs_documents()
        total = sum(len(d) for d in docs)  # characters, as progress below
        docs = zip(docs, itertools.accumulate(len(d) for d in docs))
        source = f"pydocs: pydoc_data topics and stdlib docstrings of Python {sys.version.split()[0]}"
    else:
        files = input_files(args.input)
        try:
            sizes = [os.path.getsize(f) for f in files]
        except OSError as e:  # a link to nowhere, a file gone since the listing
            die(f"cannot read {e.filename} ({e.strerror})")
        docs, total = input_documents(files, sizes, args.text_field), sum(sizes)
        source = "input: " + ", ".join(args.input)
    docs = (d for d in docs if d[0].strip())  # blank documents are left out
    docs = itertools.islice(docs, args.limit) if args.limit else docs
    items, unit = split_documents(docs, val_fraction, args.seed), "B"

    pool = None
    if num_proc > 1:
        import multiprocessing
        pool = multiprocessing.Pool(num_proc)
    try:  # into .tmp files, renamed only when all are complete: no half-written or mixed sets
        os.makedirs(folder, exist_ok=True)
        counts = write_sets(folder, items, total, unit, pool, num_proc)
    except BaseException as e:  # a mistake in the inputs, a full disk, Ctrl-C: nothing changed
        for s in ("train", "val"):
            if os.path.isfile(os.path.join(folder, f"{s}.bin.tmp")):
                os.remove(os.path.join(folder, f"{s}.bin.tmp"))
        made = os.path.abspath(folder)
        while made != parent and os.path.isdir(made) and not os.listdir(made):
            os.rmdir(made)  # the folders this run made, from the deepest up
            made = os.path.dirname(made)
        if isinstance(e, Mistake):
            die(str(e))
        if isinstance(e, OSError):
            die(f"cannot write {folder} ({e.strerror or e})")
        raise
    finally:
        if pool is not None:
            pool.terminate()
    (n_train, train_docs), (n_val, val_docs) = counts["train"], counts["val"]
    meta = {"tokenizer": "gpt2", "vocab_size": enc.n_vocab, "dtype": "uint16", "eot_token": EOT,
            "train_tokens": n_train, "val_tokens": n_val, "train_docs": train_docs,
            "val_docs": val_docs,
            "source": source, "val_fraction": val_fraction, "seed": args.seed}
    with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=2)
    for f in ("train.bin", "val.bin", "meta.json"):
        os.replace(os.path.join(folder, f + ".tmp"), os.path.join(folder, f))
    print(f"wrote {folder}: train {n_train:,} tokens ({train_docs:,} docs), "
          f"val {n_val:,} tokens ({val_docs:,} docs)")
    if n_val < 1025:
        print(f"note: val has only {n_val} tokens; train.py needs more than block_size+1 there "
              f"(raise --val_fraction or add documents)")


if __name__ == "__main__":
    main()
