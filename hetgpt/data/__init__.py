"""
Tokens in: the token files, the GPT-2 tokenizer, and the documents that
data/prepare.py reads.
"""
