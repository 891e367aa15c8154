#!/usr/bin/env python3
"""Reference token ids of tests/llm/test_vocab_bpe.cpp, computed with Hugging Face `tokenizers`.

Run (one command, from the repository root; makes a venv with the pinned versions and checks both tests):

    scripts/reference/run

or, in an environment with scripts/reference/requirements.txt installed:

    python3 scripts/reference/hf_tokenizer_ids.py                                   # print the initializers
    python3 scripts/reference/hf_tokenizer_ids.py --check tests/llm/test_vocab_bpe.cpp  # and compare (exit 1 if not)

The tokenizer is SmolLM2-135M-Instruct's, built from the GGUF that scripts/fetch-model downloads into models/
(the same file the test reads; --gguf PATH for another), so nothing needs huggingface.co: the vocabulary,
merges and token types are read with the PyPI `gguf` package, and `tokenizers` builds what SmolLM2's
tokenizer.json describes:
  models.BPE(vocab, merges) (no unk token, no byte fallback, merges not ignored), no normalizer,
  pre-tokenizer Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]),
  the 17 control tokens (token type 3) added as special tokens, and encode(text, add_special_tokens=False)
  (SmolLM2 adds no BOS). Each text must also decode back to itself (ByteLevel decoder), as the test requires.
--check FILE compares every printed initializer with FILE, ignoring layout (white space outside string literals,
comments; white space inside the texts counts), and names each one that is not there.
"""
import argparse
import importlib.metadata
import os
import sys
import unicodedata

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import cpp_source  # noqa: E402  (scripts/reference/cpp_source.py)

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GGUF = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
CONTROL = 3  # llama.cpp's token type for control tokens

# smollm2_reference's texts, in the test's order.
TEXTS = [
    "Hello world",
    " Hello world",
    "Hello, world!",
    "I'm sure it's fine, they're here and we've won. I'll go, you'd say, don't.",
    "I'M LOUD, IT'S",
    "The year 2024 had 365 days; pi = 3.14159.",
    "1234567",
    "a  b   c    d",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\r\n",
    "  leading and trailing  ",
    "Ünïcödé façade naïve",
    "日本語のテキスト",
    "中文分词测试",
    "emoji 🦙🚀 end",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "x<|im_end|>y",
    "$100 + 20% = ???",
    "(a[b]{c})",
    "---===***",
    "e.g. U.S.A.",
    "don't",
    "''''",
    "Привет, мир",
    "١٢٣ ٤٥٦",
    "x²+y³=z½",
    "  \n  \n",
    "trailing space ",
    "\u00a0nbsp\u00a0x",
    "a\u3000b",
]

# "vocab: SmolLM2 special tokens only with parse_special": the ids with special tokens parsed.
PARSE_SPECIAL_TEXT = "<|im_start|>user\nHi<|im_end|>\n"


def load_tokenizer(path: str) -> Tokenizer:
    reader = GGUFReader(path)

    def field(name):
        return reader.fields[name].contents()

    assert field("tokenizer.ggml.model") == "gpt2", "not a byte-level BPE vocabulary"
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    assert len(control) == 17, f"expected SmolLM2's 17 control tokens, found {len(control)}"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


def cpp_string(text: str) -> str:
    # As the test writes its texts: C escapes for \t \n \r, \uXXXX for non-ASCII white space, UTF-8 otherwise.
    escapes = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\", '"': '\\"'}
    out = []
    for c in text:
        if c in escapes:
            out.append(escapes[c])
        elif ord(c) > 127 and (c.isspace() or unicodedata.category(c) in ("Zs", "Cc", "Cf")):
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def encode(tok: Tokenizer, text: str) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False).ids
    decoded = tok.decode(ids, skip_special_tokens=False)
    assert decoded == text, f"{text!r} decodes as {decoded!r}"
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", default=DEFAULT_GGUF, help="the SmolLM2 GGUF (default: %(default)s)")
    parser.add_argument("--check", metavar="FILE", help="compare the printed initializers with this C++ file")
    args = parser.parse_args()
    if not os.path.isfile(args.gguf):
        print(f"{args.gguf} is missing: run scripts/fetch-model", file=sys.stderr)
        return 2
    tok = load_tokenizer(args.gguf)
    lines = []
    for text in TEXTS:
        ids = ", ".join(str(i) for i in encode(tok, text))
        lines.append(f"{{{cpp_string(text)}, {{{ids}}}}},")
    parsed = ", ".join(str(i) for i in encode(tok, PARSE_SPECIAL_TEXT))
    special_line = f"CHECK(parsed == ids{{{parsed}}});"
    print(f"// scripts/reference/hf_tokenizer_ids.py: tokenizers {importlib.metadata.version('tokenizers')}, "
          f"gguf {importlib.metadata.version('gguf')}, {os.path.basename(args.gguf)}")
    print("// smollm2_reference")
    for line in lines:
        print(line)
    print('// "vocab: SmolLM2 special tokens only with parse_special"')
    print(special_line)
    if not args.check:
        return 0
    return cpp_source.check(lines + [special_line], args.check, "reference id lists")


if __name__ == "__main__":
    sys.exit(main())
