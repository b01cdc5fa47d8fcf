"""
GPT-2's BPE tokenizer, offline: tiktoken's "gpt2" encoding (the same ids as
tiktoken.get_encoding("gpt2")), and the same tokenizer written for
transformers.

    from hetgpt.data.tokenizer import gpt2_encoding
    enc = gpt2_encoding()
    enc.encode("Hello world")           # [15496, 995]
    save_hf_tokenizer("hf/tiny", 1024)  # vocab.json, merges.txt, ...

The two BPE files are kept in the repository (hetgpt/data/gpt2: OpenAI's
encoder.json and vocab.bpe) and read through tiktoken's own loader, which
checks them against the sha256 hashes of tiktoken's "gpt2" definition:
never the network. Importing this file is cheap: tiktoken and transformers
are imported when used.
"""
import functools
import hashlib
import json
import os

EOT = 50256  # <|endoftext|>
VOCAB_SIZE = 50257
# The hashes tiktoken's own "gpt2" definition expects
# (tiktoken_ext/openai_public.py).
VOCAB_BPE_SHA256 = (
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5")
ENCODER_JSON_SHA256 = (
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783")
FILES = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2", f)
    for f in ("encoder.json", "vocab.bpe"))
# What save_hf_tokenizer writes (the names transformers reads).
HF_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json",
                      "tokenizer_config.json", "special_tokens_map.json")


def _damaged(path):
    """The ValueError that says a BPE file is not the original."""
    return ValueError(
        f"{path} is not GPT-2's BPE file (sha256 mismatch): restore it "
        f"(git checkout -- {os.path.relpath(path)})")


def check_files(encoder_json, vocab_bpe):
    """The contents (encoder_json, vocab_bpe); raises ValueError when one
    is not the original."""
    contents = []
    for path, expected in ((encoder_json, ENCODER_JSON_SHA256),
                           (vocab_bpe, VOCAB_BPE_SHA256)):
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != expected:
            raise _damaged(path)
        contents.append(data)
    return contents


def gpt2_encoding_from_files(encoder_json, vocab_bpe):
    """tiktoken's "gpt2" from local files, through tiktoken's loader
    (hash-checked, no cache written); raises ValueError when a file is not
    the original."""
    import tiktoken
    import tiktoken.load
    # the regex of tiktoken's "gpt2"
    from tiktoken_ext.openai_public import r50k_pat_str
    # (tiktoken's own check would name a download)
    check_files(encoder_json, vocab_bpe)
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    # "": tiktoken reads the files, copies nothing
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe, encoder_json, VOCAB_BPE_SHA256, ENCODER_JSON_SHA256)
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    return tiktoken.Encoding(
        "gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT},
        explicit_n_vocab=VOCAB_SIZE)


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """The GPT-2 tokenizer (tiktoken "gpt2") from the repository's files."""
    return gpt2_encoding_from_files(*FILES)


def save_hf_tokenizer(path, model_max_length):
    """Writes GPT-2's tokenizer for transformers (AutoTokenizer, pipeline)
    into the directory path: HF_TOKENIZER_FILES, whose names it returns.
    Raises ValueError when the BPE files are not the originals, OSError
    when path cannot be written."""
    encoder, merges = check_files(*FILES)
    os.makedirs(path, exist_ok=True)
    # encoder.json and vocab.bpe are GPT-2's vocab.json and merges.txt
    # under their HF names
    vocab_json = os.path.join(path, "vocab.json")
    merges_txt = os.path.join(path, "merges.txt")
    for name, data in ((vocab_json, encoder), (merges_txt, merges)):
        with open(name, "wb") as f:
            f.write(data)
    from transformers import GPT2TokenizerFast
    # Positional: (vocab_file, merges_file) in transformers 4, (vocab,
    # merges) in 5. No clean-up of spaces in decoding (" ." stays " ."):
    # decoded text is the bytes of the tokens, as tiktoken's.
    tok = GPT2TokenizerFast(vocab_json, merges_txt,
                            model_max_length=model_max_length,
                            clean_up_tokenization_spaces=False)
    tok.save_pretrained(path)
    special = os.path.join(path, "special_tokens_map.json")
    # transformers 5 keeps these in tokenizer_config.json only
    if not os.path.exists(special):
        eot = {t: "<|endoftext|>"
               for t in ("bos_token", "eos_token", "unk_token")}
        with open(special, "w") as f:
            json.dump(eot, f, indent=2)
    return list(HF_TOKENIZER_FILES)
