#!/usr/bin/env python3
"""Reference values of tests/runtime/test_quants_ggml.cpp, computed with gguf-py (the PyPI `gguf` package).

Run (one command, from the repository root; makes a venv with the pinned versions and checks both tests):

    scripts/reference/run

or, in an environment with scripts/reference/requirements.txt installed:

    python3 scripts/reference/gguf_quants.py                                         # print the initializers
    python3 scripts/reference/gguf_quants.py --check tests/runtime/test_quants_ggml.cpp  # and compare (exit 1 if not)

gguf-py is an implementation of ggml's formats in numpy, independent of ggml's C code and of troupe's. The
script prints, as C++ that the test can paste:
  1. the bytes of quantize(x) for the 32-value formats (q4_0 q4_1 q5_0 q5_1 q8_0), x_i = ((37 i mod 64) - 29) / 16
     for i < 64 (ggml's quantize_row_*_ref algorithms, exact rounding ties included);
  2. checksums of dequantize(raw) for two blocks of bytes (73 i + 11) mod 256 with the fp16 scale fields set to
     0.5 (0x3800) and 0.25 (0x3400): sum_i (i + 1) y_i and sum_i |y_i| (summed in double in index order, as the
     test does), and the first and last values;
  3. the same for mxfp4, with the E8M0 exponent bytes of the two blocks set to 127 and 128;
  4. the i-quant grid checksums sum_i (i + 1) v_i over each grid's values in order, and that of ksigns_iq2xs.
--check FILE compares every printed initializer with FILE, ignoring layout (white space outside string literals,
comments, string literals split in two), and names each one that is not there.
"""
import argparse
import importlib.metadata
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import cpp_source  # noqa: E402  (scripts/reference/cpp_source.py)

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

# The 32-value formats whose quantizers gguf-py implements (troupe's names, gguf-py's types).
QUANTIZED = [("q4_0", Q.Q4_0), ("q4_1", Q.Q4_1), ("q5_0", Q.Q5_0), ("q5_1", Q.Q5_1), ("q8_0", Q.Q8_0)]

# Dequantized formats: the byte offsets, within a block, of the fp16 fields set to 0.5 then 0.25 (the
# formats' block layouts; iq1_m keeps its scale in the top nibbles of its scale bytes, so has none).
DEQUANTIZED = [
    ("q4_0", Q.Q4_0, [0]),
    ("q4_1", Q.Q4_1, [0, 2]),
    ("q5_0", Q.Q5_0, [0]),
    ("q5_1", Q.Q5_1, [0, 2]),
    ("q8_0", Q.Q8_0, [0]),
    ("q2_K", Q.Q2_K, [80, 82]),  # scales[16] qs[64] d dmin
    ("q3_K", Q.Q3_K, [108]),  # hmask[32] qs[64] scales[12] d
    ("q4_K", Q.Q4_K, [0, 2]),  # d dmin scales[12] qs[128]
    ("q5_K", Q.Q5_K, [0, 2]),  # d dmin scales[12] qh[32] qs[128]
    ("q6_K", Q.Q6_K, [208]),  # ql[128] qh[64] scales[16] d
    ("iq4_nl", Q.IQ4_NL, [0]),
    ("iq4_xs", Q.IQ4_XS, [0]),
    ("tq1_0", Q.TQ1_0, [52]),  # qs[48] qh[4] d
    ("tq2_0", Q.TQ2_0, [64]),  # qs[64] d
    ("iq2_xxs", Q.IQ2_XXS, [0]),
    ("iq2_xs", Q.IQ2_XS, [0]),
    ("iq2_s", Q.IQ2_S, [0]),
    ("iq3_xxs", Q.IQ3_XXS, [0]),
    ("iq3_s", Q.IQ3_S, [0]),
    ("iq1_s", Q.IQ1_S, [0]),
    ("iq1_m", Q.IQ1_M, []),
]
FP16_VALUES = (0.5, 0.25)

# The grids: troupe's table name, gguf-py's class, and the values a grid entry takes.
GRIDS = [
    ("iq2xxs", quants.IQ2_XXS),
    ("iq2xs", quants.IQ2_XS),
    ("iq2s", quants.IQ2_S),
    ("iq3xxs", quants.IQ3_XXS),
    ("iq3s", quants.IQ3_S),
    ("iq1s", quants.IQ1_S),
]


def double_literal(v: float) -> str:
    return repr(float(v))  # the shortest decimal that reads back as the same double (with ".0" if integral)


def float_literal(v: np.float32) -> str:
    return repr(float(v)) + "f"  # the float's exact value as a double; every value here is dyadic and short


def patterned(n: int) -> bytearray:
    return bytearray((i * 73 + 11) % 256 for i in range(n))


def checksums(y: np.ndarray) -> tuple[float, float]:
    weighted = 0.0
    abs_sum = 0.0
    for i, v in enumerate(y.tolist()):  # in index order, in double, as the C++ loop does
        weighted += (i + 1) * v
        abs_sum += abs(v)
    return weighted, abs_sum


def quantizer_lines() -> list[str]:
    x = np.array([((i * 37) % 64 - 29) / 16.0 for i in range(64)], dtype=np.float32)
    return [f'{{type::{name}, "{gguf.quantize(x, qt).tobytes().hex()}"}},' for name, qt in QUANTIZED]


def dequantizer_lines() -> list[str]:
    out = []
    for name, qt, offsets in DEQUANTIZED:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qt]
        raw = patterned(2 * type_size)
        for b in range(2):
            for off, value in zip(offsets, FP16_VALUES):
                raw[b * type_size + off : b * type_size + off + 2] = struct.pack("<e", value)
        y = gguf.dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), qt).astype(np.float32).reshape(-1)
        assert y.size == 2 * block_size, name
        weighted, abs_sum = checksums(y)
        offs = "{" + ", ".join(str(o) for o in offsets) + "}"
        out.append(f"{{type::{name}, {offs}, {double_literal(weighted)}, {double_literal(abs_sum)}, "
                   f"{float_literal(y[0])}, {float_literal(y[-1])}}},")
    return out


def mxfp4_lines() -> list[str]:
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q.MXFP4]
    raw = patterned(2 * type_size)
    raw[0] = 127
    raw[type_size] = 128
    y = gguf.dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), Q.MXFP4).astype(np.float32).reshape(-1)
    assert y.size == 2 * block_size
    weighted, abs_sum = checksums(y)
    return [
        f"CHECK(weighted == {double_literal(weighted)});",
        f"CHECK(abs_sum == {double_literal(abs_sum)});",
        f"CHECK(y.front() == {float_literal(y[0])});",
        f"CHECK(y.back() == {float_literal(y[-1])});",
    ]


def grid_lines() -> list[str]:
    out = []
    for name, cls in GRIDS:
        cls.init_grid()
        values = cls.grid.reshape(-1)
        assert np.all(values == np.round(values)), name
        ints = [int(v) for v in values.tolist()]
        checksum = sum((i + 1) * v for i, v in enumerate(ints))
        domain = ", ".join(str(int(v)) for v in cls.grid_map)
        out.append(f"check(iq_grids::{name}, {{{domain}}}, {checksum});")
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).tolist()
    assert len(ksigns) == 128
    out.append(f"CHECK(sum == {sum((i + 1) * s for i, s in enumerate(ksigns))});")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="FILE", help="compare the printed initializers with this C++ file")
    args = parser.parse_args()
    sections = [
        ('"32-value quantizers match ggml\'s reference output byte for byte": expected[]', quantizer_lines()),
        ('"dequantizers agree with an independent decoder ...": cases[]', dequantizer_lines()),
        ('"mxfp4 decodes patterned blocks as gguf-py does ..."', mxfp4_lines()),
        ('"the i-quant grids are the format\'s ..."', grid_lines()),
    ]
    print(f"// scripts/reference/gguf_quants.py: gguf {importlib.metadata.version('gguf')}, numpy {np.__version__}")
    for title, lines in sections:
        print(f"// {title}")
        for line in lines:
            print(line)
    if not args.check:
        return 0
    return cpp_source.check([line for _, lines in sections for line in lines], args.check, "reference values")


if __name__ == "__main__":
    sys.exit(main())
