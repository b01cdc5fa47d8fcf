"""
data/prepare.py's speed and memory on an OpenWebText-shaped parquet file (bench/owt_parquet.py):
tokens per second and peak RSS of prepare.py as it was before datasets (f1497e5, read from git),
as it is (cached, and --streaming), and of the plain datasets path as nanoGPT's prepare.py takes
it (load_dataset, map with num_proc one document at a time, a np.memmap written from shards), the
same num_proc for all. The commands alternate, round after round; each starts with an empty
datasets cache of its own (HF_DATASETS_CACHE, removed after). Peak RSS: the largest sum over the
command's process tree, sampled every 0.1 s, and its largest single process (ru_maxrss).

    python bench/prepare_speed.py --mb 250 --rounds 2 --num_proc 2
    python bench/prepare_speed.py --parquet big.parquet --only after,streaming --rounds 1
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEFORE = "f1497e5"  # the last data/prepare.py before datasets

# nanoGPT's way (data/openwebtext/prepare.py), on one parquet file, without its shuffled split
PLAIN = """
import sys, numpy as np
from datasets import load_dataset
from hetgpt.data.tokenizer import EOT, gpt2_encoding
path, out, num_proc = sys.argv[1], sys.argv[2], int(sys.argv[3])
enc = gpt2_encoding()
def process(example):
    ids = enc.encode_ordinary(example["text"]) + [EOT]
    return {"ids": ids, "len": len(ids)}
ds = load_dataset("parquet", data_files=path, split="train")
tokens = ds.map(process, remove_columns=["text"], num_proc=num_proc, desc="tokenizing")
arr = np.memmap(out, dtype=np.uint16, mode="w+", shape=(int(np.sum(tokens["len"])),))
at, shards = 0, 1024
for i in range(shards):
    part = tokens.shard(num_shards=shards, index=i, contiguous=True).with_format("numpy")
    ids = np.concatenate(part["ids"])
    arr[at:at + len(ids)] = ids
    at += len(ids)
arr.flush()
"""


def tree_rss(pid):
    """The summed RSS of pid and its descendants, in bytes."""
    parents = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    parents[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    tree, total = {pid}, 0
    for _ in range(4):  # (depth: prepare, map's pool and its manager)
        tree |= {p for p, parent in parents.items() if parent in tree}
    for p in tree:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) * 1024
        except (OSError, StopIteration):
            pass
    return total


def run(cmd, env):
    """(wall seconds, peak summed RSS, peak single-process RSS) of cmd, run in a fresh parent."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    t0, peak = time.time(), 0
    p = subprocess.Popen([sys.executable, "-c", probe, *cmd], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    while p.poll() is None:
        peak = max(peak, tree_rss(p.pid))
        time.sleep(0.1)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{cmd[:3]} failed: {err[-2000:]}")
    return time.time() - t0, peak, int(out.split()[-1]) * 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parquet", help="an existing file (default: made by owt_parquet.py)")
    p.add_argument("--mb", type=float, default=250, help="megabytes of text to make")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num_proc", type=int, default=2)
    p.add_argument("--only", default="before,after,streaming,plain")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="prepare_speed.")
    try:
        path = args.parquet or os.path.join(work, "owt.parquet")
        if not args.parquet:
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "owt_parquet.py"), path,
                            "--mb", str(args.mb)], check=True)
        os.makedirs(os.path.join(work, "before", "data"))
        with open(os.path.join(work, "before", "data", "prepare.py"), "w") as f:
            f.write(subprocess.run(["git", "show", f"{BEFORE}:data/prepare.py"], cwd=ROOT,
                                   check=True, capture_output=True, text=True).stdout)
        out = os.path.join(work, "out")
        n = str(args.num_proc)
        common = ["--input", path, "--name", "owt", "--out_dir", out, "--num_proc", n]
        commands = {
            "before": [os.path.join(work, "before", "data", "prepare.py"), *common],
            "after": [os.path.join(ROOT, "data", "prepare.py"), *common],
            "streaming": [os.path.join(ROOT, "data", "prepare.py"), *common, "--streaming"],
            "plain": ["-c", PLAIN, path, os.path.join(out, "plain.bin"), n]}
        print(f"{path}: {os.path.getsize(path) / 1e6:,.0f} MB on disk; num_proc {n}; "
              f"{os.cpu_count()} CPUs")
        results = {}
        for r in range(args.rounds):
            for name in args.only.split(","):
                os.makedirs(out)
                cache = tempfile.mkdtemp(dir=work)
                env = dict(os.environ, HF_DATASETS_CACHE=cache, PYTHONPATH=ROOT)
                seconds, peak, largest = run([sys.executable, *commands[name]], env)
                shutil.rmtree(cache)
                tokens = sum(os.path.getsize(os.path.join(out, f)) // 2 for f in (
                    ["plain.bin"] if name == "plain" else ["owt/train.bin", "owt/val.bin"]))
                results.setdefault(name, []).append(tokens / seconds)
                print(f"round {r + 1} {name:9s} {tokens:,} tokens in {seconds:6.1f} s: "
                      f"{tokens / seconds:11,.0f} tokens/s, peak RSS {peak / 2**20:,.0f} MiB "
                      f"(largest process {largest / 2**20:,.0f} MiB)", flush=True)
                shutil.rmtree(out)
        best = {name: max(v) for name, v in results.items()}
        if "after" in best:
            for name, rate in best.items():
                print(f"best {name:9s} {rate:11,.0f} tokens/s, after / {name} "
                      f"{best['after'] / rate:.2f}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
