"""
gloo's collectives as FSDP and DDP call them, timed between two machines (bench/two_nodes.py starts
it under torchrun in each network namespace): all_reduce of a float32 tensor (DDP), and
all_gather_into_tensor and reduce_scatter_tensor of its halves (FSDP2). Rank 0 prints one line:
  gloo <MB> MB: all_reduce <ms> ms, all_gather_into_tensor <ms> ms, reduce_scatter_tensor <ms> ms
(each the median of 5 after one to warm up).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt import errors  # noqa: E402
from hetgpt.run.process_group import gloo_interface  # noqa: E402

errors.last_at_exit()  # ends as train.py does, without the interpreter's teardown (errors.py)
gloo_interface(os.environ.get('MASTER_ADDR'))
dist.init_process_group('gloo')
errors.skip_teardown()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 7_265_024  # gpt_tiny's, at block_size 256
full, part = torch.ones(n), torch.ones(n // dist.get_world_size())
full = full[:part.numel() * dist.get_world_size()]
calls = {'all_reduce': lambda: dist.all_reduce(full),
         'all_gather_into_tensor': lambda: dist.all_gather_into_tensor(full, part),
         'reduce_scatter_tensor': lambda: dist.reduce_scatter_tensor(part, full)}
times = {}
for name, call in calls.items():
    call()
    seen = []
    for _ in range(5):
        dist.barrier()
        t = time.perf_counter()
        call()
        seen.append(time.perf_counter() - t)
    times[name] = statistics.median(seen)
if dist.get_rank() == 0:
    print(f"gloo {4 * full.numel() / 1e6:.1f} MB: " + ', '.join(
        f"{k} {v * 1e3:.0f} ms" for k, v in times.items()), flush=True)
dist.barrier()
dist.destroy_process_group()
errors.end(0)
