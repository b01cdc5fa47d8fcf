"""Run by tests/test_muon.py under torchrun (gloo, the CPU): a tiny GPT sharded by FSDP2 over the ranks
steps with optimizer=muon (hetgpt/run/whole_matrix.py) beside the same GPT whole in this process, on
the whole model's gradients (each rank's rows of them): the same arithmetic on the same numbers.
Writes, per rank, to argv[1]/<rank>.json: the largest difference from the whole model's weights
(Muon's matrices, AdamW's rest) and Muon momentum, torch.optim.Muon's own difference on the shards,
and the state bytes this rank holds between steps against its share (hetgpt/owners.py)."""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
from hetgpt import errors  # noqa: E402
from hetgpt.owners import owned  # noqa: E402
from hetgpt.run import optim, whole_matrix  # noqa: E402

errors.last_at_exit()  # ends as train.py does, without the interpreter's teardown (errors.py)
dist.init_process_group('gloo')
errors.skip_teardown()
rank, world = dist.get_rank(), dist.get_world_size()
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import distribute_tensor  # noqa: E402

CONFIG = dict(optimizer='muon', learning_rate=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8,
              muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.1)
torch.manual_seed(0)
whole = model.GPT(model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, bias=False,
                                  dropout=0.0))
nets = {'whole_matrix': copy.deepcopy(whole), 'shards': copy.deepcopy(whole)}
mesh = init_device_mesh('cpu', (world,))
for net in nets.values():
    for block in net.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
opts = {'whole': model.make_optimizer(whole, CONFIG),
        'whole_matrix': optim.whole(model.make_optimizer(nets['whole_matrix'], CONFIG)),
        'shards': model.make_optimizer(nets['shards'], CONFIG)}  # torch.optim.Muon on the shards
assert type(opts['whole_matrix'][1]) is whole_matrix.WholeMatrix

out = {'held': []}
for step in range(3):
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(step))
    whole(idx, idx)[1].backward()
    grads = {n: p.grad for n, p in whole.named_parameters()}
    for name, net in nets.items():
        for n, p in net.named_parameters():
            p.grad = distribute_tensor(grads[n], mesh, p.placements)
    for name in opts:
        for opt in opts[name]:
            opt.step()
            opt.zero_grad(set_to_none=True)
    # between steps: the tensors this rank's whole-matrix optimizer keeps
    wm = opts['whole_matrix'][1]
    held = sum(t.numel() for st in list(wm.state.values()) + list((wm.inner.state if wm.inner else {}).values())
               for t in st.values() if torch.is_tensor(t))
    out['held'].append(held)
sizes = [p.numel() for g in wm.param_groups for p in g['params']]
out['share'] = owned(sizes, world)[rank]
out['shards_local_rows'] = [p.to_local().shape[0] for g in wm.param_groups for p in g['params']]


def diff(net, muon):
    want = dict(whole.named_parameters())
    return max(float((p.full_tensor().detach() - want[n].detach()).abs().max()) for n, p in net.named_parameters()
               if ('.h.' in n and p.dim() == 2) == muon)


out['whole_matrix'], out['adamw'] = diff(nets['whole_matrix'], True), diff(nets['whole_matrix'], False)
out['shards'] = diff(nets['shards'], True)
# (and as tests/trainer.py's max_rel_diff: the norm of the difference over the weights')
got = {n: p.full_tensor().detach() for n, p in nets['shards'].named_parameters()}
want = {n: p.detach() for n, p in whole.named_parameters()}
out['shards_rel'] = float(sum(((got[n] - want[n]).double() ** 2).sum() for n in want) ** 0.5
                          / sum((w.double() ** 2).sum() for w in want.values()) ** 0.5)
# the state as one process's Muon holds it, each momentum sharded as its matrix; and loaded back
sd = wm.state_dict()
want = opts['whole'][1].state
mine = [p for g in opts['whole'][1].param_groups for p in g['params']]
out['momentum'] = max(float((sd['state'][i]['momentum_buffer'].full_tensor() - want[p]['momentum_buffer'])
                            .abs().max()) for i, p in enumerate(mine))
fresh = whole_matrix.WholeMatrix(model.make_optimizer(nets['whole_matrix'], CONFIG)[1])
fresh.load_state_dict(sd)
out['reloaded'] = all(torch.equal(fresh.inner.state[fresh.stand_in[p]]['momentum_buffer'],
                                  wm.inner.state[wm.stand_in[q]]['momentum_buffer'])
                      for p, q in zip(fresh.stand_in, wm.stand_in))
with open(os.path.join(sys.argv[1], f'{rank}.json'), 'w') as f:
    json.dump(out, f)
dist.destroy_process_group()
errors.end(0)
