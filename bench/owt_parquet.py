"""
An OpenWebText-shaped parquet file, made offline, for bench/prepare_speed.py and the memory
check of data/prepare.py: one 'text' column of web-page-sized English documents.

    python bench/owt_parquet.py OUT.parquet --mb 250

The shape is OpenWebText's as published (Gokaslan & Cohen, 2019: 40 GB of text in 8,013,769
documents, those under 128 tokens dropped): document lengths drawn from a log-normal with a mean
of 5,000 characters, none under 600 (about 128 GPT-2 tokens). The words are the pydocs corpus's
(hetgpt/data/pydocs.py: Python's documentation, English prose and code), paragraphs drawn at random,
about 0.3 GPT-2 tokens a character (OpenWebText: 9.0B tokens in 40 GB, 0.23). Row groups of 1,000
rows (datasets' writer batch), snappy compression (pyarrow's default). Same arguments, same file.
"""
import argparse
import math
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt.data import pydocs  # noqa: E402

MEAN_CHARS, MIN_CHARS, SIGMA = 5000, 600, 0.9
ROWS_PER_GROUP = 1000

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("out")
p.add_argument("--mb", type=float, default=250, help="megabytes of text (default 250)")
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

paragraphs = [x for d in pydocs.documents() for x in d.split("\n\n") if x.strip()]
rng = random.Random(args.seed)
mu = math.log(MEAN_CHARS) - SIGMA ** 2 / 2  # the log-normal's mean is exp(mu + sigma²/2)
total, rows = 0, []
with pq.ParquetWriter(args.out, pa.schema([("text", pa.string())])) as writer:
    while total < args.mb * 1e6:
        want, doc, chars = max(MIN_CHARS, int(rng.lognormvariate(mu, SIGMA))), [], 0
        while chars < want:
            doc.append(rng.choice(paragraphs))
            chars += len(doc[-1]) + 2
        rows.append("\n\n".join(doc))
        total += len(rows[-1].encode())
        if len(rows) == ROWS_PER_GROUP:
            writer.write_table(pa.table({"text": rows}))
            rows = []
    if rows:
        writer.write_table(pa.table({"text": rows}))
print(f"wrote {args.out}: {total / 1e6:,.0f} MB of text, {os.path.getsize(args.out) / 1e6:,.0f} MB "
      f"on disk")
