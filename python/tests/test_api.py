"""laga's planning and checking from Python: the dicts of laga.plan and laga.model are the CLI's
--json, key for key and number for number; bad input raises ValueError with the CLI's message."""

import json
import os
import subprocess

import pytest

import laga

CONFIGS = [
    ("tiny", dict(seq=64, sp=2, dtype="fp32")),
    ("small", dict(seq=2048, sp=4, kernel="eager", layers=2)),
    ("deepseek-v3.2", dict(seq=8192, sp=8, batch=2, overlap="on")),
]


def cli_json(tmp_path, command, flags):
    path = str(tmp_path / f"{command}.json")
    subprocess.run([laga._binary(), command, *flags, "--json", path], check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


# What differs from one run to the next: the wall-clock times of the planning run's (meta)
# collectives.
WALL_CLOCK = ("issued_s", "completed_s", "wait_s", "seconds", "hidden_s")


def without_times(d):
    """The JSON with the wall-clock times left out."""
    if isinstance(d, dict):
        return {k: without_times(v) for k, v in d.items() if k not in WALL_CLOCK}
    if isinstance(d, list):
        return [without_times(v) for v in d]
    return d


@pytest.mark.parametrize("model,options", CONFIGS)
def test_plan_is_the_clis_json(model, options, tmp_path):
    config = laga.Config.preset(model, **options)
    got = laga.plan(config)
    want = cli_json(tmp_path, "plan", config.flags())
    assert without_times(got) == without_times(want)
    assert got["forms"]["laga"]["activation_peak_bytes"] > 0


@pytest.mark.parametrize("model,options", CONFIGS)
def test_model_is_the_clis_json(model, options, tmp_path):
    config = laga.Config.preset(model, **options)
    hw = os.path.join(laga.resource_dir(), "docs", "hw", "h100-class.json")
    got = laga.model(config, hw="h100-class")
    want = cli_json(tmp_path, "model", config.flags() + ["--hw", hw])
    assert without_times(got) == without_times(want)


def test_config_to_dict_is_a_dumps_config(tmp_path):
    config = laga.Config.preset("tiny", seq=32, sp=2, form="laga", dtype="fp32")
    subprocess.run([laga._binary(), "run", *config.flags(), "--dump", str(tmp_path / "d")],
                   check=True, stdout=subprocess.DEVNULL)
    with open(tmp_path / "d" / "config.json") as f:
        assert config.to_dict() == json.load(f)


def test_config_from_hf_reads_a_hugging_face_config():
    hf = laga.Config.preset("deepseek-v3").to_dict()
    hf = {k: v for k, v in hf.items() if k not in ("seq_len", "sp", "form")}
    hf["architectures"] = ["DeepseekV3ForCausalLM"]  # an extra key, ignored
    config = laga.Config.from_hf(hf, seq=4096, sp=8)
    assert config.to_dict()["num_attention_heads"] == 128
    assert config.to_dict()["seq_len"] == 4096


def test_forms_lists_the_registry():
    forms = {f["name"]: f for f in laga.forms()}
    assert list(forms)[0] == "explicit"
    assert forms["dsa-gather"]["sparse"] and not forms["laga"]["sparse"]
    assert forms["ring-kv"]["layout"] == "zigzag" and forms["laga"]["layout"] == "contiguous"
    assert forms["laga-ulysses"]["takes_ulysses"] and not forms["laga"]["takes_ulysses"]
    assert forms["laga-fused"]["own_kernel"] == "latent"


@pytest.mark.parametrize("options,words", [
    (dict(sp=3, seq=96), ["--sp 3", "8"]),
    (dict(dtype="fp16", seq=32), ["fp16", "bf16"]),
    (dict(form="lagaa", seq=32), ["lagaa", "laga"]),
    (dict(seq=0), ["seq", "0"]),
])
def test_bad_input_raises_the_clis_message(options, words):
    with pytest.raises(ValueError) as e:
        laga.Config.preset("tiny", **options).to_dict()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match="deepseek-v3"):
        laga.Config.preset("gpt2").to_dict()
