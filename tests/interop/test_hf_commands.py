"""``skiplab import hf`` and ``skiplab export hf`` through the command line: tiny random GPT-2 and LLaMA folders
written by ``save_pretrained`` (nothing from the hub) imported as runs that eval lm, generate and analyze take,
with Hugging Face's logits; runs trained here exported to folders ``from_pretrained`` loads with the same logits;
a round trip giving the tensors back; and every bad input one line, nothing written."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from skiplab.cli import main
from skiplab.train.lm import load_run
from tests.tokenization.test_pretrained_tokenizers import write_hf
from tests.train.test_distributed import one_thread

transformers = pytest.importorskip("transformers", minversion="5.0")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, T = 304, 32  # the tokenizer's 300 ids, padded, as hub models pad theirs
TOL = {"gpt2": 1e-5, "llama": 1e-4}  # tests/interop/test_hf.py measures the float32 differences
STORY = "the cat sat on the mat. the dog sat on the log. they were happy. "


def run(argv) -> int:
    return main([str(a) for a in argv])


def hf_config(kind: str, tie: bool = True, vocab: int = VOCAB):
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_positions=T, n_embd=32, n_layer=2, n_head=4, n_inner=48,
                                       tie_word_embeddings=tie, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=None, eos_token_id=None)
    return transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                    num_attention_heads=4, max_position_embeddings=T, rms_norm_eps=1e-5,
                                    tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None)


def hf_folder(folder: Path, kind: str, tie: bool = True, seed: int = 0, vocab: int = VOCAB, **save) -> Path:
    """A random tiny causal LM of ``kind`` saved by save_pretrained, with a byte-level BPE tokenizer.json."""
    torch.manual_seed(seed)
    cls = getattr(transformers, {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[kind])
    model = cls(hf_config(kind, tie, vocab))
    with torch.no_grad():  # LLaMA's norms start at one: random gains check that they map
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.normal_(1.0, 0.2)
    model.save_pretrained(folder, **save)
    write_hf(folder / "tokenizer.json", ["<|endoftext|>"])
    return folder


def hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("hftext")
    for split, n in (("train", 20), ("valid", 3), ("test", 3)):
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"text": STORY * (1 + i % 3)}) + "\n"
                                                     for i in range(n)))
    return root


def data(text: Path) -> list:
    return ["--corpus", "", "--train-file", text / "train.jsonl", "--valid-file", text / "valid.jsonl",
            "--test-file", text / "test.jsonl"]


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_an_imported_folder_has_hf_logits_and_evaluates_generates_and_is_analysed(kind, text, tmp_path, capsys):
    folder, out = hf_folder(tmp_path / "hf", kind, tie=kind == "gpt2"), tmp_path / "run"
    with one_thread():
        assert run(["import", "hf", folder, "--out", out, *data(text)]) == 0
        ckpt, model, tok = load_run(out)
        with torch.no_grad():
            assert torch.allclose(model(ids()), hf_logits(folder, ids()), atol=TOL[kind], rtol=0)
        assert tok.eot == tok._tok.token_to_id("<|endoftext|>") and tok.encode(STORY)  # the folder's tokenizer
        assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
        config = json.loads((out / "config.json").read_text())
        assert config["config"]["model"].startswith({"gpt2": "gpt2-small(", "llama": "llama-71m("}[kind])
        assert config["imported"]["class"] == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[kind]
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", out, "--device", "cpu"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["split"] and result["tokens"] > 0 and result["bpb"] > 0
        assert run(["generate", "--checkpoint", out, "--prompt", "the cat", "--max-new-tokens", "5"]) == 0
        assert capsys.readouterr().out.startswith("the cat")
        if kind == "llama":
            assert run(["analyze", "redundancy", out, "--examples", "4"]) == 0
            assert any((out / "analysis").iterdir())


def test_a_sharded_folder_imports(text, tmp_path):
    folder = hf_folder(tmp_path / "hf", "llama", tie=False, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 0
        _, model, _ = load_run(tmp_path / "run")
        with torch.no_grad():
            assert torch.allclose(model(ids()), hf_logits(folder, ids()), atol=TOL["llama"], rtol=0)


@pytest.mark.parametrize("kind,tie", [("gpt2", True), ("gpt2", False), ("llama", False), ("llama", True)])
def test_import_then_export_gives_the_tensors_back(kind, tie, text, tmp_path):
    folder = hf_folder(tmp_path / "hf", kind, tie=tie)
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 0
        assert run(["export", "hf", tmp_path / "run", "--out", tmp_path / "back"]) == 0
    before = safetensors_torch.load_file(folder / "model.safetensors")
    after = safetensors_torch.load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(before) == sorted(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("model", ["gpt2-small(d_model=32,heads=4,layers=2,ffn_dim=64,context=32)",
                                   "llama-71m(d_model=32,heads=4,layers=2,ffn_dim=48,context=32)"])
def test_a_trained_run_exports_to_a_folder_from_pretrained_loads(model, text, tmp_path):
    tokenizer = write_hf(tmp_path / "tok" / "tokenizer.json", ["<|endoftext|>"])
    out, folder = tmp_path / "run", tmp_path / "hf"
    with one_thread():
        assert run(["train", "lm", *data(text), "--tokenizer", f"hf:{tokenizer}", "--model", model, "--batch-size",
                    "4", "--max-steps", "4", "--eval-every", "2", "--warmup", "1", "--device", "cpu",
                    "--out", out]) == 0
        for average in (0, 2):
            assert run(["export", "hf", out, "--out", folder, "--average", average, "--overwrite"]) == 0
            _, ours, tok = load_run(out, average)
            x = torch.randint(0, ours.cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                assert torch.allclose(ours(x), hf_logits(folder, x), atol=1e-4, rtol=0)
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == tok.eot
    assert (folder / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    loaded = transformers.AutoTokenizer.from_pretrained(folder)  # the file as it is, whatever the config's class
    assert type(loaded) is transformers.PreTrainedTokenizerFast and loaded.eos_token_id == tok.eot  # not GPT2Tokenizer
    sample = "def f(x):\n    return 'é中文'<|endoftext|>  done"
    assert loaded.encode(sample, add_special_tokens=False) == tok.encode(sample)


def test_a_bytes_run_exports_its_tokenizer_and_comes_back_with_the_same_ids(text, tmp_path, capsys):
    """A run on bytes exports a tokenizer.json whose ids are the bytes (end of text 256); the folder imports back
    as a run that reads and generates text with those ids."""
    out, folder, back = tmp_path / "run", tmp_path / "hf", tmp_path / "back"
    model = "gpt2-small(d_model=32,heads=4,layers=2,ffn_dim=64,context=32)"
    with one_thread():
        assert run(["train", "lm", *data(text), "--model", model, "--batch-size", "4", "--max-steps", "2",
                    "--eval-every", "2", "--warmup", "1", "--device", "cpu", "--out", out]) == 0
        assert run(["export", "hf", out, "--out", folder]) == 0
        assert run(["import", "hf", folder, "--out", back, *data(text)]) == 0
        capsys.readouterr()
        assert run(["generate", "--checkpoint", back, "--prompt", "ab", "--max-new-tokens", "5",
                    "--temperature", "0"]) == 0
        imported = capsys.readouterr().out
        assert run(["generate", "--checkpoint", out, "--prompt", "ab", "--max-new-tokens", "5",
                    "--temperature", "0"]) == 0
        assert capsys.readouterr().out == imported  # the same weights, the same ids: the same text
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    sample = "def f(x):\n    return 'é中文'<|endoftext|>  done"
    assert loaded.encode(sample, add_special_tokens=False) == list(sample.encode("utf-8"))
    assert loaded.eos_token_id == 256 == json.loads((folder / "config.json").read_text())["eos_token_id"]
    assert loaded.decode(list(sample.encode("utf-8"))) == sample


def one_line_error(capsys, pattern: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.startswith("skiplab: error:") and "\n" not in err, err
    assert __import__("re").search(pattern, err), err


def test_bad_folders_are_one_line_and_write_nothing(text, tmp_path, capsys):
    neox = tmp_path / "neox"
    transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64).save_pretrained(neox)
    missing = hf_folder(tmp_path / "missing", "llama")
    state = safetensors_torch.load_file(missing / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    safetensors_torch.save_file(state, missing / "model.safetensors", metadata={"format": "pt"})
    corrupt = hf_folder(tmp_path / "corrupt", "gpt2")
    data_bytes = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data_bytes[: len(data_bytes) // 2])
    gqa = hf_folder(tmp_path / "gqa", "llama")
    config = json.loads((gqa / "config.json").read_text())
    (gqa / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 2}))
    small = hf_folder(tmp_path / "small", "llama", vocab=200)  # fewer ids than its tokenizer's 300
    head = hf_folder(tmp_path / "head", "gpt2")
    config = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2ForSequenceClassification"]}))
    untokenized = hf_folder(tmp_path / "untokenized", "gpt2")
    (untokenized / "tokenizer.json").unlink()
    cases = {untokenized: r"untokenized: no tokenizer .* give --corpus '' --train-file X\.bin",
             small: r"small: the tokenizer has 300 ids, the model 200",
             head: r"architectures \['GPT2ForSequenceClassification'\]; skiplab imports GPT2LMHeadModel",
             neox: r"unsupported architecture 'gpt_neox'", missing: r"missing model\.layers\.1\.mlp\.up_proj\.weight",
             corrupt: r"corrupt/model\.safetensors: not a readable safetensors file",
             gqa: r"grouped-query attention", tmp_path / "absent": r"absent: no such folder"}
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    for folder, pattern in cases.items():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 2
        one_line_error(capsys, pattern)
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run, no temporary folder left


def test_an_existing_out_is_refused_unless_overwrite(text, tmp_path, capsys):
    folder = hf_folder(tmp_path / "hf", "gpt2")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert run(["import", "hf", folder, "--out", other, *data(text)]) == 2
    one_line_error(capsys, r"other already exists; use --overwrite")
    assert run(["import", "hf", folder, "--out", other, "--overwrite", *data(text)]) == 2
    one_line_error(capsys, r"holds no config\.json .* refusing to overwrite")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    weights = (folder / "model.safetensors").read_bytes()  # the folder imported from, never its own run's --out
    assert run(["import", "hf", folder, "--out", folder, "--overwrite", *data(text)]) == 2
    one_line_error(capsys, r"hf is the folder imported from; give the run another folder")
    assert (folder / "model.safetensors").read_bytes() == weights
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 0
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 2
        one_line_error(capsys, r"run already exists")
        assert run(["import", "hf", folder, "--out", tmp_path / "run", "--overwrite", *data(text)]) == 0
        assert run(["export", "hf", tmp_path / "run", "--out", other]) == 2
        one_line_error(capsys, r"other already exists")
        assert run(["import", "hf", folder, "--out", tmp_path / "run2", *data(text)]) == 0
        before = sorted(p.name for p in (tmp_path / "run2").iterdir())
        assert run(["export", "hf", tmp_path / "run", "--out", tmp_path / "run2", "--overwrite"]) == 2
        one_line_error(capsys, r"run2 holds a run \(its last\.pt\); an export does not replace a run's checkpoints")
        assert sorted(p.name for p in (tmp_path / "run2").iterdir()) == before and "last.pt" in before
        assert run(["export", "hf", tmp_path / "run", "--out", tmp_path / "exported"]) == 0
    made = tmp_path / "made"
    made.mkdir()
    (made / "f").write_text("")
    for path in [tmp_path / "exported", *(tmp_path / "exported").iterdir()]:  # the modes of any new folder / file
        assert path.stat().st_mode & 0o777 == (made if path.is_dir() else made / "f").stat().st_mode & 0o777, path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "hf", "made", "other", "run", "run2"]


def test_a_design_hf_cannot_hold_is_one_line_and_writes_nothing(text, tmp_path, capsys):
    out = tmp_path / "run"
    with one_thread():
        assert run(["train", "lm", *data(text), "--model",
                    "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32)", "--connection", "PostLN",
                    "--batch-size", "4", "--max-steps", "1", "--eval-every", "1", "--device", "cpu", "--out", out]) == 0
        capsys.readouterr()
        assert run(["export", "hf", out, "--out", tmp_path / "hf"]) == 2
    one_line_error(capsys, r"connection 'PostLN' has no Hugging Face counterpart")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("vocab", [300, VOCAB])
def test_an_imported_run_fine_tunes_with_resume(text, tmp_path, vocab):
    """At the tokenizer's vocabulary (300) and padded past it (VOCAB, as hub models pad theirs: it was a state-dict
    size-mismatch traceback), the run resumes at the model's own vocabulary and trains."""
    folder, out = hf_folder(tmp_path / "hf", "llama", vocab=vocab), tmp_path / "run"
    with one_thread():
        recipe = ["--max-steps", "2", "--eval-every", "2", "--batch-size", "4", "--warmup", "1", "--device", "cpu"]
        assert run(["import", "hf", folder, "--out", out, *data(text), *recipe]) == 0
        assert run(["train", "lm", "--resume", "--out", out]) == 0
        ckpt, model, _ = load_run(out)
    assert ckpt["step"] == 2 and json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert model.cfg.vocab_size == vocab and ckpt["model_config"]["vocab_size"] == vocab
    with torch.no_grad():
        x = ids() % 300
        assert not torch.allclose(model(x), hf_logits(folder, x), atol=1e-3)  # it trained


def test_gpt2s_vocab_and_merges_are_its_tokenizer(text, tmp_path):
    folder = hf_folder(tmp_path / "hf", "gpt2")
    tokenizers = pytest.importorskip("tokenizers")
    reference = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference.model.save(str(folder))  # vocab.json and merges.txt, as GPT-2's hub folder holds them
    (folder / "tokenizer.json").unlink()
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 0
    _, _, tok = load_run(tmp_path / "run")
    for line in (STORY, "naïve café, 中文 and emoji 🙂 <|endoftext|> end"):
        assert tok.encode(line) == reference.encode(line, add_special_tokens=False).ids
        assert tok.decode(tok.encode(line)) == line.replace("<|endoftext|>", "")
    assert tok.eot == reference.token_to_id("<|endoftext|>")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["config"]["tokenizer"] == f"hf:{(tmp_path / 'run' / 'tokenizer.json').resolve()}"


def test_a_tokenizer_without_end_of_text_takes_the_configs_eos(text, tmp_path, capsys):
    folder = hf_folder(tmp_path / "hf", "llama")
    write_hf(folder / "tokenizer.json", ["<pad>"])  # no end-of-text token of its own
    capsys.readouterr()
    assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 2
    one_line_error(capsys, r"no end-of-text token .*eos_token_id \(None\) names no token of it: set eos_token_id")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 0
    _, _, tok = load_run(tmp_path / "run")
    assert tok.eot == 0 and tok.header["eot_token"] == "<pad>"


def test_a_folder_of_integer_weights_is_one_line_and_writes_nothing(text, tmp_path, capsys):
    """Weights are floating-point: a folder whose tensors are integers is one line naming the file and a tensor,
    before anything is written (nn.Module.to refused it with a traceback)."""
    folder = hf_folder(tmp_path / "hf", "gpt2")
    state = safetensors_torch.load_file(folder / "model.safetensors")
    safetensors_torch.save_file({k: (v * 100).to(torch.int64) for k, v in state.items()}, folder / "model.safetensors",
                                metadata={"format": "pt"})
    capsys.readouterr()
    assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 2
    one_line_error(capsys, rf"{folder / 'model.safetensors'}: transformer\.\S+ holds int64 values, not "
                           "floating-point weights")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("tokenizer", [True, False])
def test_an_imported_runs_checkpoint_loads_weights_only(text, tmp_path, capsys, tokenizer):
    """Every skiplab checkpoint loads with plain torch.load(path, weights_only=True): an imported folder without a
    tokenizer (a run on token files, as its error message suggests) too, whose last.pt held an empty bytes that
    weights_only refuses; its run then evaluates and exports."""
    folder = hf_folder(tmp_path / "hf", "gpt2")
    source = data(text)
    if not tokenizer:
        (folder / "tokenizer.json").unlink()
        for split in ("train", "valid", "test"):
            torch.randint(0, 300, (400,), generator=torch.Generator().manual_seed(0)).numpy().astype("uint16").tofile(
                tmp_path / f"{split}.bin")
        source = ["--corpus", "", *(x for s in ("train", "valid", "test")
                                   for x in (f"--{s}-file", tmp_path / f"{s}.bin"))]
    out = tmp_path / "run"
    with one_thread():
        assert run(["import", "hf", folder, "--out", out, *source]) == 0
        ckpt = torch.load(out / "last.pt", weights_only=True)
        assert (ckpt["tokenizer"] is None) == (not tokenizer) and ckpt["kind"] == "lm"
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", out, "--device", "cpu"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] > 0
        assert run(["export", "hf", out, "--out", tmp_path / "back"]) == 0
    assert (tmp_path / "back" / "model.safetensors").is_file()


def test_a_data_dir_prepared_with_another_tokenizer_is_refused_at_import(text, tmp_path, capsys):
    """An imported run reads text with the folder's own tokenizer: a --data-dir of bytes tokens could never serve it
    (its evaluation failed later, naming flags of training); refused in one line, nothing written."""
    folder = hf_folder(tmp_path / "hf", "gpt2")
    assert run(["prepare", "lm", "--corpus", "", "--train-file", text / "train.jsonl", "--valid-file",
                text / "valid.jsonl", "--test-file", text / "test.jsonl", "--tokenizer", "bytes",
                "--out", tmp_path / "bytes"]) == 0
    capsys.readouterr()
    assert run(["import", "hf", folder, "--out", tmp_path / "run", "--corpus", "", "--data-dir", tmp_path / "bytes"]) == 2
    one_line_error(capsys, r"holds tokens of --tokenizer bytes, not of .*hf's tokenizer: give the corpus's text folder")
    assert not (tmp_path / "run").exists()


def test_overwrite_never_deletes_a_run_or_a_model_kept_inside_out(text, tmp_path, capsys):
    """Replacing --out removed everything in it: a run, or the very model folder imported, kept inside was lost."""
    nest = hf_folder(tmp_path / "nest", "gpt2")  # a model folder (config.json), holding the model to import
    inner = hf_folder(nest / "model", "gpt2")
    with one_thread():
        capsys.readouterr()
        assert run(["import", "hf", inner, "--out", nest, "--overwrite", *data(text)]) == 2
        one_line_error(capsys, r"nest holds a model folder in .*nest/model, which replacing .*nest would delete")
        assert (inner / "model.safetensors").is_file()
        assert run(["import", "hf", inner, "--out", tmp_path / "run", *data(text)]) == 0
        shutil.copytree(tmp_path / "run", nest / "myrun")
        capsys.readouterr()
        assert run(["export", "hf", nest / "myrun", "--out", nest, "--overwrite"]) == 2
        one_line_error(capsys, r"nest holds a (run|model folder) in .*nest/(model|myrun), which replacing")
        assert (nest / "myrun" / "last.pt").is_file()
        (tmp_path / "afile").write_text("")
        assert run(["export", "hf", tmp_path / "run", "--out", tmp_path / "afile"]) == 2
        one_line_error(capsys, r"afile is a file, not a folder; give another --out")
        assert run(["import", "hf", inner / "config.json", "--out", tmp_path / "run3", *data(text)]) == 2
        one_line_error(capsys, r"config\.json is a file; give the Hugging Face model's folder")


def test_an_imports_data_files_are_recorded_absolute(text, tmp_path, capsys, monkeypatch):
    """Relative --train-file and the like were recorded as given: eval lm from another folder could not find them."""
    folder = hf_folder(tmp_path / "hf", "gpt2")
    monkeypatch.chdir(text)
    with one_thread():
        assert run(["import", "hf", folder, "--out", tmp_path / "run", "--corpus", "", "--train-file", "train.jsonl",
                    "--valid-file", "valid.jsonl", "--test-file", "test.jsonl"]) == 0
        config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
        assert config["train_file"] == str(text / "train.jsonl") and config["test_file"] == str(text / "test.jsonl")
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", tmp_path / "run", "--device", "cpu"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] > 0


def test_llama_dropout_is_not_carried_either_way(text, tmp_path, capsys):
    """LLaMA's attention_dropout drops attention probabilities only; skiplab's dropout drops embeddings and
    sub-layer outputs too. An import of attention_dropout > 0 is refused; an export of a run trained with dropout
    writes 0 and says so (it wrote attention_dropout = dropout, and imported it as skiplab's dropout)."""
    folder = hf_folder(tmp_path / "hf", "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    capsys.readouterr()
    assert run(["import", "hf", folder, "--out", tmp_path / "run", *data(text)]) == 2
    one_line_error(capsys, r"attention_dropout=0\.5: skiplab's dropout would drop the embeddings")
    assert not (tmp_path / "run").exists()
    with one_thread():
        assert run(["train", "lm", "--model", "llama-71m(d_model=32,heads=4,layers=1,ffn_dim=40,context=32)",
                    "--dropout", "0.1", *data(text), "--tokenizer", "bytes", "--max-steps", "1", "--batch-size", "2",
                    "--eval-every", "1", "--warmup", "0", "--device", "cpu", "--out", tmp_path / "dropped"]) == 0
        capsys.readouterr()
        assert run(["export", "hf", tmp_path / "dropped", "--out", tmp_path / "exported"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("skiplab: warning:")]
    assert len(said) == 1 and "dropout 0.1 (a training setting) is not carried" in said[0], err
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["attention_dropout"] == 0.0
