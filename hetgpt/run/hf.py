"""
To and from transformers' GPT-2 (GPT2LMHeadModel): our module names are
nanoGPT's, which are HF's, so the weights map one to one; HF's Conv1D
keeps four of them as (in, out) where nn.Linear has (out, in). Used by
train.py (init_from=gpt2*), sample.py (loading, --export_hf: the weights
and, for GPT-2's vocabulary, its tokenizer) and the tests.
"""
import os
import tempfile
from dataclasses import replace

import torch

from hetgpt.data import tokenizer
from hetgpt.errors import die, oneline
from model import GPT, GPTConfig

CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight',
          'mlp.c_proj.weight')


def from_hf(hf_model, **overrides):
    """A GPT from a loaded GPT2LMHeadModel (from the hub, a local
    directory, or made in a test); overrides: GPTConfig's fields. Raises
    ValueError when the model is not shaped as GPT-2."""
    hc = hf_model.config
    config = GPTConfig(block_size=hc.n_positions, vocab_size=hc.vocab_size,
                       n_layer=hc.n_layer, n_head=hc.n_head,
                       n_embd=hc.n_embd, bias=True, dropout=0.0)
    model = GPT(replace(config, **overrides))
    ours = model.state_dict()
    for k, v in hf_model.state_dict().items():
        # causal-mask buffers of old HF
        if k.endswith(('.attn.bias', '.attn.masked_bias')):
            continue
        if k not in ours:
            raise ValueError(f"unexpected HF key {k}")
        if k.endswith(CONV1D):
            v = v.t()
        if v.shape != ours[k].shape:
            raise ValueError(f"{k}: HF {tuple(v.shape)} vs ours "
                             f"{tuple(ours[k].shape)}")
        with torch.no_grad():
            ours[k].copy_(v)
    return model


def from_pretrained(name, **overrides):
    """A GPT from transformers' GPT-2 of that name, or dies in one line.

    'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' (or another hub name)
    from the HF cache, else from the hub (needs network once); or a
    transformers directory. A user mistake ends in one line (errors.die),
    within seconds: offline, transformers would retry for ~30 s.
    """
    need_transformers(f"init_from={name}")
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    from transformers import GPT2LMHeadModel
    try:
        hf_model = GPT2LMHeadModel.from_pretrained(name,
                                                   local_files_only=True)
    except Exception as e:
        if os.path.isdir(name):
            die(f"cannot load {name} with transformers ({oneline(e)}); "
                f"give a directory written by sample.py --export_hf or "
                f"transformers' save_pretrained")
        try:  # one HEAD request, no retries: is the hub there at all?
            get_hf_file_metadata(hf_hub_url(name, 'config.json'),
                                 timeout=constants.HF_HUB_ETAG_TIMEOUT)
        except OfflineModeIsEnabled:
            offline('HF_HUB_OFFLINE is set', name)
        except HfHubHTTPError as e:
            # the hub answered: a name it does not have, a gated repo, ...
            die(f"cannot load {name} from the Hugging Face hub "
                f"({oneline(e)}); init_from takes gpt2, gpt2-medium, "
                f"gpt2-large or gpt2-xl")
        except Exception as e:
            # no connection, a timeout, a proxy or TLS failure
            offline(f"no answer from {constants.ENDPOINT}: {oneline(e)}",
                    name)
        try:
            hf_model = GPT2LMHeadModel.from_pretrained(name)
        except Exception as e:
            # the network went away mid-download, a full disk, ...
            die(f"cannot load {name} from the Hugging Face hub "
                f"({oneline(e)})")
    try:
        return from_hf(hf_model, **overrides)
    except ValueError as e:
        # a transformers model, but not shaped as GPT-2
        die(f"{name} is not a GPT-2 model ({e})")


def need_transformers(what):
    """Dies in one line (what: what needs it) when transformers is not
    installed: it is of the interop set (requirements-dev.txt), not the
    runtime one."""
    try:
        import huggingface_hub, safetensors, transformers  # noqa: F401
    except ImportError as e:
        die(f"{what} needs transformers, huggingface_hub and safetensors "
            f"({oneline(e)}): pip install -c constraints.txt -r "
            f"requirements-dev.txt")


def offline(why, name):
    """Dies: name is not in the HF cache, and the hub is out of reach
    (why)."""
    die(f"cannot load {name} from the Hugging Face hub (offline: {why}): "
        f"connect once to cache it, or set HF_HOME to a Hugging Face cache "
        f"that has it")


def _dims(t):
    """'768×2304': a tensor's shape, said."""
    return '×'.join(map(str, t.shape))


def save_hf(model, path):
    """Writes model for transformers (GPT2LMHeadModel) into path.

    Writes path/config.json, generation_config.json, model.safetensors
    and, when the model's vocabulary is GPT-2's 50257 tokens, GPT-2's
    tokenizer (tokenizer.save_hf_tokenizer), so that AutoTokenizer and
    pipeline('text-generation', model=path) work on it. Returns (the names
    of the files written, None or why there is no tokenizer). HF's GPT-2
    always has biases: a bias=False model exports zeros, which is the
    same network.
    """
    need_transformers("--export_hf")
    from transformers import GPT2Config, GPT2LMHeadModel
    c = model.config
    eot = None
    if c.vocab_size > tokenizer.EOT:  # if this vocab has it
        eot = tokenizer.EOT
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size,
        n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function='gelu_new', layer_norm_epsilon=1e-5,
        resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, tie_word_embeddings=True,
        bos_token_id=eot, eos_token_id=eot))
    ours, theirs = model.state_dict(), hf.state_dict()
    sd, wrong = {}, []
    for k, v in theirs.items():
        if k in ours:
            sd[k] = ours[k]
            if k.endswith(CONV1D):
                sd[k] = ours[k].t()
            if sd[k].shape != v.shape:
                wrong.append(f"{k} {_dims(sd[k])} here, {_dims(v)} in "
                             f"GPT-2")
        elif k.endswith('.bias') and k[:-len('bias')] + 'weight' in ours:
            sd[k] = torch.zeros_like(v)  # (bias=False)
        else:
            wrong.append(f"GPT-2's {k} not here")
    wrong += [f"{k} not in GPT-2" for k in ours if k not in theirs]
    if not wrong:
        hf.load_state_dict(sd)
        # the same weights may still compute another network (an edited
        # activation, norm or attention): the next-token logits of both,
        # on a few tokens, in float32
        idx = torch.arange(min(16, c.block_size)).view(1, -1) % c.vocab_size
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            mine = model(idx.to(device))[0].float().cpu()
            gpt2 = hf.eval()(idx).logits
        gap = (mine - gpt2).abs().max().item()
        if not gap <= 1e-3 * max(1.0, gpt2.abs().max().item()):
            wrong.append(f"its logits differ from GPT-2's by up to "
                         f"{gap:.3g} on the same weights")
    if wrong:
        more = ''
        if len(wrong) > 2:
            more = f"; {len(wrong) - 2} more"
        die(f"--export_hf writes GPT-2 (transformers' GPT2LMHeadModel), "
            f"and this model is another network ({', '.join(wrong[:2])}"
            f"{more}): export a model of GPT-2's model.py, or save it for "
            f"transformers yourself")
    # Only GPT-2's exact vocabulary gets its tokenizer: a smaller one (a
    # char-level model) is another tokenizer, and ids past 50257 would be
    # text the tokenizer cannot decode. (A checkpoint padded to 50304 is
    # loaded trimmed to 50257, so sample.py and HF's generate choose among
    # the same ids.)
    note = None
    if c.vocab_size != tokenizer.VOCAB_SIZE:
        note = (f"vocab_size {c.vocab_size} is not GPT-2's "
                f"{tokenizer.VOCAB_SIZE}")
    os.makedirs(path, exist_ok=True)
    # Written into a folder inside path, then moved in: a failure leaves
    # the last export whole.
    with tempfile.TemporaryDirectory(dir=path, prefix='.export-') as tmp:
        hf.save_pretrained(tmp)
        written = sorted(os.listdir(tmp))
        if note is None:
            try:
                written += tokenizer.save_hf_tokenizer(tmp, c.block_size)
            except ValueError as e:  # the repository's BPE files altered
                note = str(e)
        written.sort()
        for f in written:
            os.replace(os.path.join(tmp, f), os.path.join(path, f))
    # a tokenizer left by an earlier export is not this model's
    if note is not None:
        for f in tokenizer.HF_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(path, f)):
                os.remove(os.path.join(path, f))
    return written, note
