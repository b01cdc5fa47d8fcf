"""
Where data/prepare.py's documents are: the files a user gives (--input),
listed in a fixed order and checked, what a folder holds besides them said
in one line; OpenWebText's on the hub.
"""
import collections
import os

from hetgpt.errors import die, oneline

OWT_REPO = "Skylion007/openwebtext"
# its own parquet, else the hub's conversion
OWT_REVISIONS = ("main", "refs/convert/parquet")


def input_files(paths, kinds):
    """The files of paths, in order: files as given (their extension in
    kinds), and each folder's files of those kinds (sorted; hidden ones,
    and hidden folders, left out). Prints what the folders held that is
    not read, counted by kind, in one line."""
    files, skipped = [], collections.Counter()
    for p in paths:
        if not os.path.exists(p):
            die(f"{p} does not exist: give --input existing "
                f".txt/.jsonl/.parquet files or folders")
        if not os.path.isdir(p) and not p.lower().endswith(tuple(kinds)):
            die(f"{p}: unknown file type; --input takes .txt (one "
                f"document), .jsonl or .parquet (a 'text' field, or "
                f"--text_field), or folders of them")
        found, other = [], collections.Counter()
        if not os.path.isdir(p):
            found = [p]
        for root, dirs, names in os.walk(p):
            other["hidden"] += sum(d.startswith(".") for d in dirs)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in names:
                kind = os.path.splitext(f)[1].lower()
                if f.startswith("."):
                    kind = "hidden"
                if kind in kinds:
                    found.append(os.path.join(root, f))
                else:
                    other[kind or "without extension"] += 1
        if not found:
            only = ""
            if +other:
                only = f" (only {counted(+other)})"
            die(f"{p} holds no .txt, .jsonl or .parquet files" + only)
        files, skipped = files + sorted(found), skipped + other
    if +skipped:
        print(f"skipped {sum(skipped.values())} files: "
              f"{counted(+skipped)}")
    return files


def counted(counter):
    """A Counter as '3 .py, 1 hidden': the most first, then by name."""
    by_count = sorted(counter.items(), key=lambda c: (-c[1], c[0]))
    return ", ".join(f"{n} {what}" for what, n in by_count)


def openwebtext_files():
    """OpenWebText's parquet files on the hub, at a branch's commit now,
    and where: (paths, root).

    Its loading script never runs: load_dataset of the repository would
    refuse it (datasets >= 4, nanoGPT issue #633); that of "parquet" never
    looks.
    """
    from huggingface_hub import HfApi, constants
    try:
        for revision in OWT_REVISIONS:
            info = HfApi().dataset_info(OWT_REPO, revision=revision)
            found = sorted(s.rfilename for s in info.siblings
                           if s.rfilename.endswith(".parquet"))
            if found:
                root = f"hf://datasets/{OWT_REPO}@{info.sha}"
                return [f"{root}/{f}" for f in found], root
    except Exception as e:
        # offline (HF_HUB_OFFLINE), no answer, a proxy or TLS failure
        die(f"cannot list {OWT_REPO} on {constants.ENDPOINT} "
            f"({oneline(e)}); it needs internet (tens of GB), or "
            f"--input DIR: a local copy of it")
    die(f"{OWT_REPO} has no parquet files on {constants.ENDPOINT}: give "
        f"--input DIR, a copy")
