#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors (fuzz/corpus/safetensors/): small hand-made files, valid
and invalid, each one a case the reader must handle — weights of the fuzz target's micro model in
laga's and Hugging Face's naming, every dtype, zero-size and scalar tensors, and the malformations
(truncation, overlaps, gaps, duplicate keys, ...). The config and cli seeds are plain text files,
written by hand. Run from anywhere: python3 fuzz/make_seeds.py"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
         "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def payload(dtype, n, seed):
    """n little-endian values of dtype: small distinct numbers (floats), or a byte pattern."""
    if dtype == "F32":
        return struct.pack(f"<{n}f", *[(i + seed) * 0.125 - 1 for i in range(n)])
    if dtype == "F64":
        return struct.pack(f"<{n}d", *[(i + seed) * 0.25 - 2 for i in range(n)])
    if dtype == "F16":
        return struct.pack(f"<{n}e", *[(i + seed) * 0.5 - 3 for i in range(n)])
    if dtype == "BF16":
        return b"".join(struct.pack("<f", (i + seed) * 0.0625 - 0.5)[2:] for i in range(n))
    return bytes((i * 37 + seed) % 256 for i in range(n * SIZES[dtype]))


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] -> bytes of a valid file, data in the given order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for i, (name, dtype, shape) in enumerate(tensors):
        blob = payload(dtype, numel(shape), i)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def raw(header_text, data=b"", length=None):
    """A file from header text as given (possibly invalid), with an explicit length if asked."""
    text = header_text.encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


# The micro model of fuzz_safetensors.cpp: D 4, H 2, Lq 2 (or 0), Lkv 2, Dn 2, Dr 2, Dv 2.
MICRO = [("attn_norm", [4]), ("wq_a", [2, 4]), ("q_norm", [2]), ("wq_b", [8, 2]), ("wkv_a", [4, 4]),
         ("kv_norm", [2]), ("wkv_b", [8, 2]), ("wo", [4, 4])]
HF = {"wq_a": "q_a_proj", "q_norm": "q_a_layernorm", "wq_b": "q_b_proj", "wq": "q_proj",
      "wkv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "wkv_b": "kv_b_proj", "wo": "o_proj"}


def hf_name(name):
    if name == "attn_norm":
        return "model.layers.0.input_layernorm.weight"
    return f"model.layers.0.self_attn.{HF[name]}.weight"


MICRO_NO_Q_LORA = [("attn_norm", [4]), ("wq", [8, 4]), ("wkv_a", [4, 4]), ("kv_norm", [2]), ("wkv_b", [8, 2]),
                   ("wo", [4, 4])]

seeds = {
    "micro_laga_f32": safetensors([(f"layers.0.{n}", "F32", s) for n, s in MICRO],
                                  {"format": "pt", "producer": "laga"}),
    "micro_laga_bf16_reversed": safetensors([(f"layers.0.{n}", "BF16", s) for n, s in reversed(MICRO)]),
    "micro_hf_f16_with_extras": safetensors([(hf_name(n), "F16", s) for n, s in MICRO_NO_Q_LORA] +
                                            [("model.embed_tokens.weight", "I64", [3, 2]),
                                             ("model.layers.0.mlp.gate.weight", "F8_E4M3", [2, 2])],
                                            {"format": "pt"}),
    "micro_hf_f64": safetensors([(hf_name(n), "F64", s) for n, s in MICRO]),
    "every_dtype": safetensors([(f"t.{d}", d, [2, 3]) for d in SIZES]),
    "zero_size_and_scalar": safetensors([("empty", "F32", [0, 5]), ("scalar", "F32", []), ("big_zero", "BF16", [7, 0, 9])]),
    "empty_header": safetensors([]),
    "metadata_only": safetensors([], {"a": "b", "producer": "laga"}),
    # Malformed: each must be a usage error naming the problem.
    "truncated": safetensors([("x", "F32", [4, 4])])[:-5],
    "trailing_bytes": safetensors([("x", "F32", [2])]) + b"\0\0\0\0",
    "length_beyond_file": raw('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4, length=1 << 20),
    "length_over_limit": raw("{}", length=(1 << 63) + 5),
    "too_short": b"\x10\0\0",
    "not_json": raw("this is not json"),
    "header_array": raw("[1, 2, 3]"),
    "duplicate_key": raw('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                         '"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "overlap": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                   '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12),
    "gap": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
    "size_mismatch": raw('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"\0" * 8),
    "negative_dim": raw('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}'),
    "huge_dims": raw('{"a":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}}'),
    "float_offsets": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]}}', b"\0" * 4),
    "unknown_dtype": raw('{"a":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}}', b"\0"),
    "missing_shape": raw('{"a":{"dtype":"F32","data_offsets":[0,4]}}', b"\0" * 4),
    "metadata_not_strings": raw('{"__metadata__":{"n":1}}'),
    "deep_nesting": raw('{"a":' + "[" * 20 + "]" * 20 + "}"),
    "micro_wrong_shape": safetensors([(f"layers.0.{n}", "F32", [s[0] + 1] + s[1:]) for n, s in MICRO]),
}

os.makedirs(OUT, exist_ok=True)
for name, blob in seeds.items():
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(blob)
print(f"wrote {len(seeds)} seeds to {OUT}")
