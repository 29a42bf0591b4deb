"""Checkpoints as people have them (issue 45): `dpmerge task-vector` from a pretrained and a fine-tuned model folder
written by `save_pretrained`, `dpmerge merge --output-model` back into a folder `from_pretrained` loads, sharded
checkpoints in and out, a full checkpoint as the base, and clear errors for what cannot be read.

Every expected weight is computed here from the models in memory, not from anything dpmerge wrote."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, BertModel

from dpmerge.artifacts import SafetensorsFile, read_metadata
from dpmerge.checkpoints import open_checkpoint
from dpmerge.cli import main

SCALING = 0.3  # task arithmetic's default, asked for explicitly below


def tiny_bert_config(**overrides):
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37, max_position_embeddings=64, **overrides)


@pytest.fixture
def bert_folders(tmp_path):
    """A pretrained BertModel folder and two fine-tuned BertForSequenceClassification folders (their encoder
    under the prefix `bert.`, a classifier head of their own), one in one file and one in three shards, and the
    weights each holds in memory."""
    torch.manual_seed(0)
    config = tiny_bert_config()
    pretrained = BertModel(config).eval()
    pretrained.save_pretrained(tmp_path / "pretrained")
    tuned = []
    for index, shard in enumerate(["5GB", "40KB"]):
        model = BertForSequenceClassification(config)
        model.bert.load_state_dict(pretrained.state_dict())
        with torch.no_grad():
            for parameter in model.bert.parameters():
                parameter.add_(0.01 * torch.randn_like(parameter))
        model.save_pretrained(tmp_path / f"finetuned{index}", max_shard_size=shard)
        tuned.append({key: value.clone() for key, value in model.bert.state_dict().items()})
    assert (tmp_path / "finetuned1" / "model.safetensors.index.json").is_file()  # really sharded
    return tmp_path, pretrained, tuned


def task_vectors_of(folder, count=2, *extra):
    paths = []
    for index in range(count):
        path = folder / f"tau{index}.safetensors"
        main(["task-vector", "--pretrained", str(folder / "pretrained"),
              "--finetuned", str(folder / f"finetuned{index}"), "-o", str(path), *extra])
        paths.append(str(path))
    return paths


def test_task_vector_then_output_model_loads_back_as_w0_plus_merged_tau(bert_folders):
    folder, pretrained, tuned = bert_folders
    vectors = task_vectors_of(folder)
    out = folder / "merged"
    main(["merge", "--method", "task_arithmetic", "--param", f"scaling={SCALING}", "--base", str(folder / "pretrained"),
          "--output-model", str(out), *vectors])

    w0 = pretrained.state_dict()
    expected = {key: w0[key] + SCALING * ((tuned[0][key] - w0[key]) + (tuned[1][key] - w0[key])) for key in w0}
    loaded = BertModel.from_pretrained(out).eval()
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=1e-6, msg=key)
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (folder / "pretrained" / "config.json").read_text())

    reference = BertModel(tiny_bert_config()).eval()
    reference.load_state_dict(expected)
    tokens = torch.randint(0, 99, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).last_hidden_state, reference(tokens).last_hidden_state)

    record = read_metadata(out / "model.safetensors")
    assert record["format"] == "pt" and record["dpmerge"]["operator"] == "task_arithmetic"
    assert record["dpmerge"]["privacy"] == "none recorded"


def test_task_vector_matches_prefixed_names_and_records_what_it_left_out(bert_folders):
    folder, pretrained, tuned = bert_folders
    path = task_vectors_of(folder, 1)[0]
    tensors = SafetensorsFile(path)
    assert tensors.keys() == sorted(pretrained.state_dict())  # the pretrained names, not bert.*
    w0 = pretrained.state_dict()
    for key in tensors.keys():
        torch.testing.assert_close(tensors.get_tensor(key), tuned[0][key] - w0[key], rtol=0, atol=1e-7)
    record = tensors.metadata
    assert record["left_out"]["only_finetuned"] == ["classifier.bias", "classifier.weight"]
    assert record["renamed"]["embeddings.word_embeddings.weight"] == "bert.embeddings.word_embeddings.weight"


def test_sharded_base_gives_the_same_shards_and_index(bert_folders, tmp_path):
    folder, pretrained, tuned = bert_folders
    vectors = task_vectors_of(folder)
    sharded_base = tmp_path / "pretrained_sharded"
    pretrained.save_pretrained(sharded_base, max_shard_size="40KB")
    out, single = tmp_path / "merged_sharded", tmp_path / "merged.safetensors"
    main(["merge", "--method", "ties", "--base", str(sharded_base), "--output-model", str(out), "-o", str(single),
          *vectors])
    base_index = json.loads((sharded_base / "model.safetensors.index.json").read_text())
    assert json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] == base_index["weight_map"]
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(set(base_index["weight_map"].values()))
    loaded = BertModel.from_pretrained(out).state_dict()
    merged = SafetensorsFile(single)
    for key in merged.keys():
        assert torch.equal(loaded[key], merged.get_tensor(key)), key


def test_sharded_task_vectors_merge_like_single_files(tmp_path):
    generator = torch.Generator().manual_seed(0)
    w0 = {f"layer{i}.weight": torch.randn(8, 8, generator=generator) for i in range(3)}
    save_file(w0, tmp_path / "w0.safetensors")
    taus = [{key: torch.randn(8, 8, generator=generator) for key in w0} for _ in range(2)]
    save_file(taus[0], tmp_path / "tau0.safetensors")
    shards = tmp_path / "tau1"
    shards.mkdir()
    weight_map = {}
    for index, key in enumerate(sorted(w0)):
        save_file({key: taus[1][key]}, shards / f"part{index}.safetensors", metadata={"format": "pt"})
        weight_map[key] = f"part{index}.safetensors"
    (shards / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    out = tmp_path / "merged.safetensors"
    main(["merge", "--method", "weight_averaging", "--base", str(tmp_path / "w0.safetensors"), "-o", str(out),
          str(tmp_path / "tau0.safetensors"), str(shards / "model.safetensors.index.json")])
    merged = SafetensorsFile(out)
    for key in w0:
        torch.testing.assert_close(merged.get_tensor(key), w0[key] + (taus[0][key] + taus[1][key]) / 2)


def test_a_full_checkpoint_base_passes_the_tensors_no_vector_covers(tmp_path):
    generator = torch.Generator().manual_seed(0)
    full = {"top.weight": torch.randn(4, 4, generator=generator),
            "trunk.weight": torch.randn(6, 3, generator=generator),
            "trunk.bias": torch.randn(6, generator=generator), "buffer.count": torch.tensor([7])}
    save_file(full, tmp_path / "full.safetensors", metadata={"format": "pt"})
    taus = []
    for index in range(2):
        taus.append(torch.randn(4, 4, generator=generator))
        save_file({"top.weight": taus[-1]}, tmp_path / f"tau{index}.safetensors")
    out = tmp_path / "merged.safetensors"
    main(["merge", "--method", "task_arithmetic", "--param", "scaling=0.5",
          "--base", str(tmp_path / "full.safetensors"), "-o", str(out),
          str(tmp_path / "tau0.safetensors"), str(tmp_path / "tau1.safetensors")])
    merged = SafetensorsFile(out)
    assert merged.keys() == sorted(full)
    for key in ("trunk.weight", "trunk.bias", "buffer.count"):
        assert torch.equal(merged.get_tensor(key), full[key]), key
    torch.testing.assert_close(merged.get_tensor("top.weight"), full["top.weight"] + 0.5 * (taus[0] + taus[1]))
    assert merged.metadata["base"]["passed_through"] == 3


def test_float32_vectors_of_a_bfloat16_model_add_before_rounding(tmp_path):
    generator = torch.Generator().manual_seed(0)
    w0 = torch.randn(16, 16, generator=generator).bfloat16()
    save_file({"w": w0}, tmp_path / "pretrained.safetensors")
    tuned = []
    for index in range(2):
        tuned.append((w0.float() + 1e-3 * torch.randn(16, 16, generator=generator)).bfloat16())
        save_file({"w": tuned[-1]}, tmp_path / f"finetuned{index}.safetensors")
    vectors = []
    for index in range(2):
        vectors.append(str(tmp_path / f"tau{index}.safetensors"))
        main(["task-vector", "--pretrained", str(tmp_path / "pretrained.safetensors"), "--dtype", "float32",
              "--finetuned", str(tmp_path / f"finetuned{index}.safetensors"), "-o", vectors[-1]])
    assert SafetensorsFile(vectors[0]).dtype("w") == torch.float32
    out = tmp_path / "merged.safetensors"
    main(["merge", "--method", "weight_averaging", "--base", str(tmp_path / "pretrained.safetensors"), "-o", str(out),
          *vectors])
    expected = (w0.float() + ((tuned[0].float() - w0.float()) + (tuned[1].float() - w0.float())) / 2).bfloat16()
    assert torch.equal(SafetensorsFile(out).get_tensor("w"), expected)


def test_vectors_are_checked_against_the_base_they_were_taken_from(bert_folders, tmp_path):
    folder, pretrained, tuned = bert_folders
    vectors = task_vectors_of(folder)
    torch.manual_seed(5)
    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "other")
    with pytest.raises(SystemExit, match="is not the w0 .*tau0.safetensors was trained from"):
        main(["merge", "--method", "ties", "--base", str(tmp_path / "other"), "--output-model",
              str(tmp_path / "never"), *vectors])
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("case, expected", [
    ("pickle", "holds its weights as a PyTorch pickle"),
    ("missing_shard", "not_there.safetensors"),
    ("output_exists", "exists; the base .* is a model folder"),
    ("no_output", "give -o/--out"),
    ("personalized", "one model per task: --output-model writes one model"),
])
def test_what_cannot_be_read_or_written_is_refused_in_one_line(tmp_path, case, expected):
    generator = torch.Generator().manual_seed(0)
    base = tmp_path / "base"
    base.mkdir()
    save_file({"w": torch.randn(3, 3, generator=generator)}, base / "model.safetensors", metadata={"format": "pt"})
    vectors = []
    for index in range(2):
        vectors.append(str(tmp_path / f"tau{index}.safetensors"))
        save_file({"w": torch.randn(3, 3, generator=generator)}, vectors[-1])
    args = ["merge", "--method", "ties", "--base", str(base), "--output-model", str(tmp_path / "out")]
    if case == "pickle":
        (base / "model.safetensors").unlink()
        torch.save({"w": torch.zeros(3, 3)}, base / "pytorch_model.bin")
    elif case == "missing_shard":
        index = tmp_path / "tau1.index.json"
        index.write_text(json.dumps({"weight_map": {"w": "not_there.safetensors"}}))
        vectors[1] = str(index)
    elif case == "output_exists":
        (tmp_path / "out").mkdir()
    elif case == "no_output":
        args = args[:-2]
    elif case == "personalized":
        args[2] = "tall_masks"
    with pytest.raises((SystemExit, FileNotFoundError), match=expected):
        main([*args, *vectors])


def test_unrelated_checkpoints_make_no_task_vector(tmp_path):
    save_file({"a.weight": torch.zeros(2)}, tmp_path / "p.safetensors")
    save_file({"b.weight": torch.zeros(2)}, tmp_path / "f.safetensors")
    with pytest.raises(SystemExit, match="share no tensor names"):
        main(["task-vector", "--pretrained", str(tmp_path / "p.safetensors"), "--finetuned",
              str(tmp_path / "f.safetensors"), "-o", str(tmp_path / "tau.safetensors")])
    assert open_checkpoint(tmp_path / "p.safetensors").keys() == ["a.weight"]
