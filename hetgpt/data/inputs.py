"""
Where data/prepare.py's documents are: the files a user gives (--input), listed in a fixed
order and checked, what a folder holds besides them said in one line; OpenWebText's on the hub.
"""
import collections
import os

from hetgpt.errors import die, oneline

OWT_REPO = "Skylion007/openwebtext"
OWT_REVISIONS = ("main", "refs/convert/parquet")  # its own parquet, else the hub's conversion


def input_files(paths, kinds):
    """The files of paths, in order: files as given (their extension in kinds), and each folder's
    files of those kinds (sorted; hidden ones, and hidden folders, left out). Prints what the
    folders held that is not read, counted by kind, in one line."""
    files, skipped = [], collections.Counter()
    for p in paths:
        if not os.path.exists(p):
            die(f"{p} does not exist: give --input existing .txt/.jsonl/.parquet files or folders")
        if not os.path.isdir(p) and not p.lower().endswith(tuple(kinds)):
            die(f"{p}: unknown file type; --input takes .txt (one document), .jsonl or .parquet "
                f"(a 'text' field, or --text_field), or folders of them")
        found, other = [] if os.path.isdir(p) else [p], collections.Counter()
        for root, dirs, names in os.walk(p):
            other["hidden"] += sum(d.startswith(".") for d in dirs)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in names:
                kind = "hidden" if f.startswith(".") else os.path.splitext(f)[1].lower()
                found += [os.path.join(root, f)] if kind in kinds else []
                other[kind or "without extension"] += kind not in kinds
        if not found:
            die(f"{p} holds no .txt, .jsonl or .parquet files"
                + (f" (only {counted(+other)})" if +other else ""))
        files, skipped = files + sorted(found), skipped + other
    if +skipped:
        print(f"skipped {sum(skipped.values())} files: {counted(+skipped)}")
    return files


def counted(counter):
    by_count = sorted(counter.items(), key=lambda c: (-c[1], c[0]))
    return ", ".join(f"{n} {what}" for what, n in by_count)


def openwebtext_files():
    """OpenWebText's parquet files on the hub, at a branch's commit now, and where. Its loading
    script never runs: load_dataset of the repository would refuse it (datasets >= 4, nanoGPT
    issue #633); that of "parquet" never looks."""
    from huggingface_hub import HfApi, constants
    try:
        for revision in OWT_REVISIONS:
            info = HfApi().dataset_info(OWT_REPO, revision=revision)
            found = sorted(s.rfilename for s in info.siblings if s.rfilename.endswith(".parquet"))
            if found:
                root = f"hf://datasets/{OWT_REPO}@{info.sha}"
                return [f"{root}/{f}" for f in found], root
    except Exception as e:  # offline (HF_HUB_OFFLINE), no answer, a proxy or TLS failure
        die(f"cannot list {OWT_REPO} on {constants.ENDPOINT} ({oneline(e)}); it needs internet "
            f"(tens of GB), or --input DIR: a local copy of it")
    die(f"{OWT_REPO} has no parquet files on {constants.ENDPOINT}: give --input DIR, a copy")
