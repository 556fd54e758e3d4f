"""Reads a `laga run --dump DIR` directory into torch tensors, bits as written (bfloat16 stays
bfloat16), and runs the CLI to write one."""

import json
import os
import struct
import subprocess

import torch

import laga

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "I32": torch.int32, "F64": torch.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = _DTYPES[e["dtype"]]
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(e["shape"]).clone()
    return out


def dump(out_dir, flags):
    """`laga run FLAGS --dump OUT_DIR`; returns (config dict, tensors)."""
    subprocess.run([laga._binary(), "run", *flags, "--dump", out_dir], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    return config, read_safetensors(os.path.join(out_dir, "tensors.safetensors"))
