"""
hetgpt's machinery, under the researcher's files at the root (model.py, train.py, sample.py):
one idea per module, none of them importing train.py.

  planner     the search: strategy, micro-batches and split per rank (plan.py is its command line)
  memory      the estimator: a rank's bytes at a step's peak under a strategy
  clock       the step-time model: a step's seconds on given ranks
  decision    the plan as train.py applies it (Plan), and its table
  cluster     identical ranks as one entry: what the planner sums over ranks and nodes
  costs       bytes, FLOPs and optimizer state, measured from model.py as built
  shape       the model's shape and the batch: their rules, and the one check (no torch)
  ladder      the strategies, cheapest first, and what each turns on (no torch)
  gpus        the GPU table: memory, FLOPS and bandwidths with their sources (no torch)
  hardware    the devices at hand and their memory
  balance     the uneven split of the batch, and the timing that rebalances it
  ckpt        checkpoints: save, load, and the one reader of a checkpoint's bytes
  hf          GPT-2 weights from and to Hugging Face
  tokenizer   the GPT-2 BPE from the files kept in the repository
  corpus      the token files, checked as untrusted input
  rundir      one run per out_dir: the lock and the claim
  metrics     metrics.jsonl: written by rank 0, read by plot.py, bench/ and tests
  signals     stop signals while training: checkpoint, then stop
  optim       the optimizer step: skipped and counted when not finite
  membership  who is in an elastic run, and whether they run the same run
  group       the process group and the watchdog
  errors      one line, exit 2: every entry point's way to fail
"""
