"""
Tokenize a text corpus with the GPT-2 BPE into data/<name>/{train,val}.bin + meta.json, through
HF datasets: load_dataset, then map with num_proc, as nanoGPT's prepare.py.

    python data/prepare.py --dataset pydocs                 # offline: Python's own documentation
    python data/prepare.py --input notes/ more.jsonl --name notes
    python data/prepare.py --dataset openwebtext            # the hub's parquet files, cached
    python data/prepare.py --dataset openwebtext --streaming   # read as tokenized, nothing cached
    python data/prepare.py --dataset openwebtext --input owt/  # a local copy of the hub's

The .bin files are flat np.uint16 arrays of token ids, every document followed by <|endoftext|>,
as nanoGPT's; a document goes to val by a draw from (seed, its index). datasets converts inputs
into its cache, map tokenizes them in num_proc processes; --streaming reads them as tokenized.
"""
import os
import signal
import sys

STOPS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, kill: the run ends in one line, nothing kept
stopped = []  # the stop signal received, if any
MAIN = os.getpid()  # prepare.py's process; map's processes are its forks


def stop(signum, frame):
    """A stop signal's handler: noted (datasets may wrap what it raises), then KeyboardInterrupt.
    In one of map's processes (a Ctrl-C reaches them all), without a word: a Ctrl-C is left to
    the main process, which ends its pool of them (SIGTERM, which ends one at once)."""
    if os.getpid() != MAIN:
        if signum != signal.SIGINT:
            os._exit(128 + signum)
        return
    stopped.append(signum)
    raise KeyboardInterrupt


def halt(more):
    """Says that a stop signal ended prepare.py, and exits as a process it ended: 128 + its
    number (130 for Ctrl-C), as shells and make report it; it is not the user's mistake (2)."""
    print(f"stopped ({signal.Signals(stopped[0]).name}): nothing written{more}", file=sys.stderr)
    sys.exit(128 + stopped[0])


def halted(signum, frame):
    """A stop signal's handler while the imports below run: halt."""
    stopped.append(signum)
    halt("")


if __name__ == "__main__":  # (main() puts stop in its place)
    for sig in STOPS:
        signal.signal(sig, halted)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as data/prepare.py, sys.path has data/, not the repository
    sys.path.insert(0, ROOT)
from hetgpt.errors import die, oneline  # noqa: E402
from hetgpt.data import digest  # noqa: E402
from hetgpt.data.inputs import OWT_REPO, input_files, openwebtext_files  # noqa: E402
from hetgpt.data.tokenizer import EOT, gpt2_encoding  # noqa: E402  (the GPT-2 BPE, offline)

BUILDERS = {".txt": "text", ".jsonl": "json", ".parquet": "parquet"}  # datasets' builders
SETS = ("train.bin", "val.bin", "meta.json")  # a data set's files, renamed into place together


class Mistake(Exception):
    """A user's mistake found while reading the inputs: main() cleans up, then dies with it."""


def load(files, text_field, streaming):
    """(what, a dataset, its text's column) for files, in order, each loaded when needed: one
    load_dataset for each .jsonl or .parquet file (a mistake names it), each run of .txt files."""
    import pyarrow.dataset
    from datasets import load_dataset
    # parquet: pyarrow's pre-buffering kept every row group read (1.4 GB RSS for a 1 GB file)
    options = {"text": {"sample_by": "document"}, "parquet": {"fragment_scan_options":
               pyarrow.dataset.ParquetFragmentScanOptions(pre_buffer=False)}}
    kind = lambda f: os.path.splitext(f)[1].lower()  # noqa: E731
    for _, group in itertools.groupby(files, lambda f: kind(f) == ".txt" or f):
        group = list(group)
        builder, what = BUILDERS[kind(group[0])], group[0]
        what += f" (and {len(group) - 1} more)" if len(group) > 1 else ""
        try:
            ds = load_dataset(builder, data_files=group, split="train", streaming=streaming,
                              **options.get(builder, {}))
            # a row group at a time: pyarrow's reader of a whole file ran ahead of the slower
            ds = ds.reshard() if streaming else ds  # tokenizer, holding it (RSS 1.8 GB for 1 GB)
        except Exception as e:  # no such file, not UTF-8, bad JSON, not parquet, no network, ...
            raise Mistake(f"cannot read {what} ({oneline(e.__cause__ or e)})") from None
        field = "text" if builder == "text" else text_field
        noun = "field" if builder == "json" else "column"
        if ds.features is not None and field not in ds.features:
            raise Mistake(f"{what} has no '{field}' {noun} (its {noun}s: {', '.join(ds.features)})"
                          f"; name the text's {noun} with --text_field")
        dtype = getattr(ds.features[field], "dtype", "?") if ds.features else "string"
        if dtype not in ("string", "large_string"):
            raise Mistake(f"{what}: {noun} '{field}' holds {dtype}, not text; name the text's "
                          f"{noun} with --text_field")
        yield what, ds, field


def tokenize(texts, pool=None):
    """map's function: each document's GPT-2 tokens and <|endoftext|> (uint16), none for a blank
    one. encode_to_numpy with no special tokens is encode_ordinary, in threads without the GIL."""
    enc, blank = gpt2_encoding(), np.empty(0, np.uint32)  # (built once per process)
    ids = (pool.map if pool else map)(
        lambda t: enc.encode_to_numpy(t, disallowed_special=()) if t and t.strip() else blank,
        texts)
    return {"ids": [(np.append(x, EOT) if len(x) else x).astype(np.uint16) for x in ids]}


def token_batches(parts, streaming, num_proc, batch_size):
    """(token counts, token ids) of the documents of parts, a batch at a time: map's num_proc
    processes, or streaming (where map has none) num_proc threads that tiktoken runs at once."""
    from datasets.utils.tqdm import tqdm
    for what, ds, field in parts:
        try:
            if streaming:
                with ThreadPoolExecutor(num_proc) as pool, tqdm(desc="tokenizing",
                                                                unit=" docs") as bar:
                    for batch in ds.with_format("arrow").iter(batch_size=batch_size):
                        ids = tokenize(batch[field].to_pylist(), pool)["ids"]
                        bar.update(len(ids))
                        yield np.array([len(x) for x in ids]), np.concatenate(ids)
                continue
            tokens = ds.map(tokenize, batched=True, input_columns=[field], desc="tokenizing",
                            num_proc=num_proc if num_proc > 1 else None,
                            remove_columns=ds.column_names)
            for batch in tokens.with_format("arrow").iter(batch_size=10_000):
                ids = batch["ids"].combine_chunks()
                yield np.diff(ids.offsets.to_numpy()), ids.flatten().to_numpy()
        except Exception as e:  # as in load(); datasets wraps those of the cache's conversion
            raise Mistake(f"cannot read {what} ({oneline(e.__cause__ or e)})") from None


def is_val(seed, i, val_fraction):  # whether document i goes to val: a draw from (seed, i) alone
    h = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < val_fraction


def write_sets(folder, batches, val_fraction, seed, limit, only_text):
    """Writes the first limit (0: all) documents of batches (0 tokens: a blank one, left out)
    into folder/{train,val}.bin.tmp by is_val, but the last: it moves when all others are in one
    set, so that both have one (a single one, only_text(), is cut). {split: [tokens, docs]}."""
    files = {s: open(os.path.join(folder, f"{s}.bin.tmp"), "wb") for s in ("train", "val")}
    counts, n = {s: [0, 0] for s in files}, 0

    def write(lengths, ids, to_val):
        for s, docs in (("train", ~to_val), ("val", to_val)):
            part = ids[np.repeat(docs, lengths)]  # the tokens of this set's documents, in order
            part.tofile(files[s])
            counts[s] = [counts[s][0] + len(part), counts[s][1] + int(docs.sum())]

    try:
        for lengths, ids in batches:
            lengths = lengths[lengths > 0][:limit - n if limit else None]
            if len(lengths):
                ids, to_val = ids[:lengths.sum()], np.array(
                    [is_val(seed, n + j, val_fraction) for j in range(len(lengths))])
                write(lengths, ids, to_val)
                n, last = n + len(lengths), (bool(to_val[-1]), ids[-lengths[-1]:])
            if limit and n == limit:
                break
        if n == 0:
            raise Mistake("no usable documents (all empty?): give files with text in them")
        if n == 1 or counts["val"][1] == n * last[0]:  # all in one set: the last moves
            s, moved, to_val = "val" if last[0] else "train", [last[1]], [not last[0]]
            files[s].truncate(2 * (counts[s][0] - len(last[1]))), files[s].seek(0, 2)
            counts[s] = [counts[s][0] - len(last[1]), counts[s][1] - 1]
            if n == 1:  # cut in two, at a line start when there is one, text on both sides
                text = only_text()
                first, end = len(text) - len(text.lstrip()), len(text.rstrip())
                if end - first < 2:
                    raise Mistake(f"one document of one character ({text.strip()!r}): too "
                                  f"short to cut into train and val; give more text")
                cut = int(len(text) * (1 - val_fraction))
                cut = min(max(text.rfind("\n", 0, cut) + 1 or cut, first + 1), end - 1)
                moved, to_val = tokenize([text[:cut], text[cut:]])["ids"], [False, True]
            write(np.array([len(x) for x in moved]), np.concatenate(moved), np.array(to_val))
    finally:
        for f in files.values():
            f.close()
    return counts

# -----------------------------------------------------------------------------


def main(argv=None):
    """prepare.py: its arguments checked, the data set written; a stop signal (Ctrl-C) at any
    point ends it in one line, with nothing written (exit 128 + the signal's number)."""
    before = {sig: signal.signal(sig, stop) for sig in STOPS}  # (put back at the end)
    stopped.clear()
    try:
        run(argv)
    except KeyboardInterrupt:
        if not stopped:
            raise
        halt("")
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def run(argv):
    """Parses and checks the arguments, then writes the data set."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: die(f"{message} (python data/prepare.py -h for help)")  # 1 line
    p.add_argument("--dataset", choices=["pydocs", "openwebtext"], help="a built-in corpus")
    p.add_argument("--input", nargs="+", metavar="PATH", help=".txt/.jsonl/.parquet files or "
                   "folders (with --dataset openwebtext: a local copy of the hub's repository)")
    p.add_argument("--text_field", default="text", metavar="NAME",
                   help="the .jsonl field or .parquet column of the text (default: text)")
    p.add_argument("--name", help="output folder (default: the dataset, or the first input's stem)")
    p.add_argument("--out_dir", default=HERE, help="base folder of <name>/ (default: data/)")
    p.add_argument("--val_fraction", type=float, help="share of documents for val "
                   "(default: 0.0005 openwebtext, 0.05 otherwise)")
    p.add_argument("--seed", type=int, default=2357, help="seed of the val split")
    p.add_argument("--num_proc", type=int, default=os.cpu_count() or 1,
                   help="tokenizer processes (threads with --streaming)")
    p.add_argument("--streaming", action="store_true", help="read the inputs as they are "
                   "tokenized, in bounded memory, no copy in datasets' cache")
    p.add_argument("--limit", type=int, default=0, help="only the first N documents (streams)")
    p.add_argument("--overwrite", action="store_true", help="replace the data set that "
                   "OUT_DIR/NAME holds (without it: refused)")
    args = p.parse_args(argv)
    if (args.dataset is None) == (args.input is None) and args.dataset != "openwebtext":
        p.error("give either --dataset pydocs|openwebtext or --input PATH [PATH ...]")
    if args.dataset == "openwebtext" and args.input and (
            len(args.input) > 1 or not os.path.isdir(args.input[0])):
        p.error(f"--dataset openwebtext --input takes one folder: a local copy of {OWT_REPO}")
    val_fraction = args.val_fraction or (0.0005 if args.dataset == "openwebtext" else 0.05)
    if not 0 < val_fraction < 1 or args.val_fraction == 0:
        die(f"--val_fraction must be between 0 and 1, not {args.val_fraction}")
    for flag, low in (("seed", 0), ("num_proc", 1), ("limit", 0)):
        if getattr(args, flag) < low:
            die(f"--{flag} {getattr(args, flag)}: must be >= {low}")
    name = args.name or args.dataset or os.path.splitext(
        os.path.basename(os.path.normpath(args.input[0])))[0]
    if name in ("", ".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        die(f"--name {name!r}: give a plain folder name; the output goes to OUT_DIR/NAME")
    folder = os.path.join(args.out_dir, name)
    parent = os.path.abspath(folder)  # now, not after minutes of tokenizing
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        die(f"cannot write {folder}: {parent} is not a writable directory; "
            f"choose another --out_dir")
    held = [f for f in SETS if os.path.lexists(os.path.join(folder, f))]
    if held and not args.overwrite:  # a run resumed on it would train on other text
        die(f"{folder} holds a data set already ({', '.join(held)}): --overwrite to "
            f"replace it, or another --name")
    try:
        enc = gpt2_encoding()  # fail early, and map's processes inherit it
    except ValueError as e:
        die(str(e))
    streaming = args.streaming or args.limit > 0
    write(args, enc, folder, parent, held, val_fraction, streaming)


def write(args, enc, folder, parent, held, val_fraction, streaming):
    """Writes the data set into folder: into .tmp files, renamed only when all are complete (no
    half-written or mixed sets); a mistake, a full disk or a stop signal leaves nothing."""
    try:
        import datasets
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # our one line says what failed
        # its bars on a terminal (in a log: lines of \r-joined updates)
        (datasets.enable_progress_bars if sys.stderr.isatty() else datasets.disable_progress_bars)()
        if args.dataset == "pydocs":
            from hetgpt.data import pydocs
            print("collecting the Python documentation...")
            docs = datasets.Dataset.from_dict({"text": pydocs.documents()})
            parts = lambda: [("pydocs", docs, "text")]  # noqa: E731
            source = ("pydocs: pydoc_data topics and stdlib docstrings of Python "
                      + sys.version.split()[0])
        else:  # the user's files, a local copy of the hub's OpenWebText, or the hub's
            files, where = openwebtext_files() if not args.input else (
                input_files(args.input, BUILDERS), os.path.abspath(args.input[0]))
            source = f"openwebtext: {where}" if args.dataset else f"input: {', '.join(args.input)}"
            parts = lambda: load(files, args.text_field, streaming)  # noqa: E731
        os.makedirs(folder, exist_ok=True)
        batches = token_batches(parts(), streaming, args.num_proc, min(args.limit or 1000, 1000))
        counts = write_sets(folder, batches, val_fraction, args.seed, args.limit, lambda: next(
            d[f] for _, ds, f in parts() for d in ds if (d[f] or "").strip()))
        # the content of each .bin, as train.py's checks know it (hetgpt/data/digest.py)
        sums = {f: digest.sha256(os.path.join(folder, f + ".tmp")) for f in SETS[:2]}
        (n_train, train_docs), (n_val, val_docs) = counts["train"], counts["val"]
        with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
            json.dump({"tokenizer": "gpt2", "vocab_size": enc.n_vocab, "dtype": "uint16",
                       "eot_token": EOT, "train_tokens": n_train, "val_tokens": n_val,
                       "train_docs": train_docs, "val_docs": val_docs, "source": source,
                       "val_fraction": val_fraction, "seed": args.seed, "sha256": sums},
                      f, indent=2)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # the three renames: all or none
    except BaseException as e:  # a mistake in the inputs, a full disk, Ctrl-C: nothing changed
        for sig in STOPS:  # (a second Ctrl-C does not stop the cleanup)
            signal.signal(sig, signal.SIG_IGN)
        for f in SETS:
            if os.path.isfile(os.path.join(folder, f + ".tmp")):
                os.remove(os.path.join(folder, f + ".tmp"))
        made = os.path.abspath(folder)
        while made != parent and os.path.isdir(made) and not os.listdir(made):
            os.rmdir(made)  # the folders this run made, from the deepest up
            made = os.path.dirname(made)
        if stopped:
            halt(f"; {folder} is as it was" if held else "")
        if isinstance(e, (Mistake, OSError)):
            die(str(e) if isinstance(e, Mistake) else f"cannot write {folder} ({e.strerror or e})")
        raise
    for f in SETS:
        os.replace(os.path.join(folder, f + ".tmp"), os.path.join(folder, f))
    for sig in STOPS:  # done: a stop from here on (one pending, too) is let go
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    # the digests' caches, for train.py's first start: after a tick of the file system's clock
    # (a cache written in the tick its file changed is not trusted)
    time.sleep(0.05)
    for f in SETS[:2]:
        path = os.path.join(folder, f)
        digest.remember(path, sums[f], os.stat(path))
    print(f"wrote {folder}: train {n_train:,} tokens ({train_docs:,} docs), "
          f"val {n_val:,} tokens ({val_docs:,} docs)")
    if n_val < 1025:
        print(f"note: val has only {n_val} tokens; train.py needs more than block_size+1 there "
              f"(raise --val_fraction or add documents)")


if __name__ == "__main__":
    main()
