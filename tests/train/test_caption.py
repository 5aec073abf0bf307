"""Captioning: the captioner family, the translation loop over images, beam search, the COCO metrics, the formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from skiplab.cli import main
from skiplab.decoding import beam_search, greedy_search
from skiplab.decoding.search import max_lengths
from skiplab.models import build_model, model_config
from skiplab.tasks import get as get_task, load_trained
from skiplab.data.captions import Vocabulary
from skiplab.tasks.caption import caption_images, describe_split, load_model
from skiplab.train.caption import CaptionTrainConfig, load_split, stack_sources
from skiplab.train.mt import MTTrainConfig
from tests.conftest import write_fashion_mnist

TINY = "captioner-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,trunk_width=4)"


@pytest.fixture(scope="module")
def scenes_dir(tmp_path_factory):
    """Fashion-MNIST files with 5,000 training images held out for validation and a few hundred more."""
    return write_fashion_mnist(tmp_path_factory.mktemp("fashion"), n_train=5200, n_test=60)


def scene_args(fashion: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "caption", "--data-dir", str(fashion), "--train-scenes", "40", "--valid-scenes", "8",
            "--test-scenes", "6", "--min-count", "1", "--batch-size", "20", "--max-steps", "4", "--warmup", "2",
            "--save-every", "2", "--device", "cpu", "--model", TINY, "--out", str(out), *extra]


def test_train_decode_and_score_on_fashion_mnist_scenes(scenes_dir, tmp_path, capsys):
    pytest.importorskip("pycocoevalcap")  # scored with it
    out = tmp_path / "run"
    assert main(scene_args(scenes_dir, out, "--decoder-connection", "SAS")) == 0
    assert {"checkpoint_2.pt", "checkpoint_4.pt", "last.pt", "summary.json"} <= {p.name for p in out.iterdir()}
    stored = json.loads((out / "config.json").read_text())
    assert stored["data"]["train_pairs"] == 200 and stored["data"]["train_images"] == 40  # five captions a scene
    capsys.readouterr()

    task = get_task("caption")
    cfg = CaptionTrainConfig(**{**stored["config"], "adam_betas": tuple(stored["config"]["adam_betas"])})
    summary = task.score(cfg, json.loads((out / "summary.json").read_text()), progress=False)
    for key in ("test_bleu4", "test_rouge_l", "test_cider"):
        assert isinstance(summary[key], float) and 0 <= summary[key] <= 1000, key
    assert summary["averaged"] == 2
    captions = json.loads((out / "test.beam3.avg2.captions.json").read_text())
    assert sorted(captions) == [str(i) for i in range(6)]  # one caption per test scene

    assert main(["eval", "caption", "--checkpoint", str(out), "--beam", "1", "--split", "valid"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["images"] == 8 and result["beam"] == 1
    assert set(json.loads(Path(result["captions"]).read_text())) == {str(i) for i in range(8)}
    assert json.loads((out / "valid.beam1.json").read_text())["CIDEr"] == result["CIDEr"]  # the report, kept
    assert main(["eval", "caption", "--checkpoint", str(out / "checkpoint_2.pt"), "--beam", "1", "--split",
                 "valid"]) == 0  # another checkpoint: its own files, the last one's kept
    other = json.loads(capsys.readouterr().out)
    assert Path(other["captions"]).name == "valid.beam1.of-checkpoint_2.captions.json" and other["step"] == 2
    assert (out / "valid.beam1.captions.json").is_file() and (out / "valid.beam1.of-checkpoint_2.json").is_file()
    # the model the task loads for the analyses reads the same examples the loop trained on
    trained = load_trained(out)
    ex = next(trained.examples("valid", 3, batch=15))
    assert ex.inputs[0].shape == (15, 1, 64, 64) and ex.masks["encoder"].shape == (15, 64)
    assert trained.losses(ex, trained.model(*ex.inputs)).shape == (15,)
    for analysis in ("gradients", "gates", "norms"):  # the encoder-decoder analyses take a captioning run
        assert main(["analyze", analysis, str(out), "--examples", "8"]) == 0, analysis
    gates = json.loads((out / "analysis" / "gates.json").read_text())
    assert {r["block"] for r in gates["connections"]} == {"decoder.0"}  # SAS on the decoder only; the trunk has none


def test_a_figure_shows_images_with_each_runs_caption(scenes_dir, tmp_path, capsys, monkeypatch):
    import skiplab.tasks.caption as task_module

    runs = {c: tmp_path / c for c in ("PostLN", "SAS")}
    for c, out in runs.items():
        assert main(scene_args(scenes_dir, out, "--connection", c)) == 0
    drawn = {}
    real = task_module.draw_captions
    monkeypatch.setattr(task_module, "draw_captions", lambda *a, **k: drawn.update(args=a) or real(*a, **k))
    figure = tmp_path / "fig" / "captions.png"
    capsys.readouterr()
    assert main(["eval", "caption", "--checkpoint", str(runs["PostLN"]), "--beam", "1", "--figure", str(figure),
                 "--figure-images", "4", "--compare", str(runs["SAS"])]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["figure"] == str(figure) and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    images, references, rows = drawn["args"][:3]
    assert len(images) == 4 and images[0].shape == (64, 64) and images[0].dtype == np.uint8
    data = load_split(json.loads((runs["PostLN"] / "config.json").read_text())["config"], "test")
    assert references == [data.raw[i][0] for i in range(4)]
    assert list(rows) == ["PostLN", "SAS"]  # each run named by its connection
    assert rows["PostLN"] == [json.loads(Path(result["captions"]).read_text())[str(i)] for i in range(4)]
    sas, vocab, _ = load_model(runs["SAS"])
    src = torch.stack([torch.from_numpy(data.load(i))[None] for i in range(4)])
    # greedy to 16 words and an end (--max-caption-len 16): a caption cut at the limit keeps 16 words
    assert rows["SAS"] == [" ".join(vocab.tokens(h)[:16]) for h in greedy_search(sas, src, max_len_a=0, max_len_b=17)]
    # two runs of one design are told apart by their paths; one run twice is an error
    copy = tmp_path / "copy"
    shutil.copytree(runs["SAS"], copy)
    assert main(["eval", "caption", "--checkpoint", str(runs["SAS"]), "--beam", "1", "--figure",
                 str(tmp_path / "same.png"), "--compare", str(copy)]) == 0
    assert list(drawn["args"][2]) == [f"SAS ({runs['SAS']})", f"SAS ({copy})"]
    capsys.readouterr()
    assert main(["eval", "caption", "--checkpoint", str(copy), "--figure", str(tmp_path / "twice.png"),
                 "--compare", str(runs["SAS"]), str(copy)]) == 2
    assert "more than once" in capsys.readouterr().err and not (tmp_path / "twice.png").exists()
    before = figure.read_bytes()
    assert main(["eval", "caption", "--checkpoint", str(runs["SAS"]), "--figure", str(figure)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists; use --overwrite" in err and figure.read_bytes() == before
    assert main(["eval", "caption", "--checkpoint", str(runs["SAS"]), "--compare", str(runs["PostLN"])]) == 2
    assert "give --figure FILE" in capsys.readouterr().err


def test_beam_one_is_greedy_and_the_cache_equals_recomputation(scenes_dir):
    """The captioner's incremental decoding (cached self-attention, cross-attention keys computed once) gives
    the logits of the teacher-forced forward pass; beam 1 is greedy search."""
    torch.manual_seed(0)
    model = build_model(model_config(TINY, vocab_size=30, decoder_connection="PreLN")).eval()
    images = torch.randint(0, 256, (3, 1, 64, 64), dtype=torch.uint8)
    prefix = torch.tensor([[2, 7, 9, 4], [2, 5, 5, 6], [2, 8, 11, 12]])
    full = torch.log_softmax(model(images, prefix).float(), dim=-1)
    state = model.start(model.encode(images))
    for t in range(prefix.shape[1]):
        torch.testing.assert_close(model.step(prefix[:, t], state), full[:, t], atol=1e-5, rtol=1e-5)
    beams = beam_search(model, images, beam=1, max_len_a=0, max_len_b=6)
    assert [b[0].tokens for b in beams] == greedy_search(model, images, 0, 6)


def test_a_caption_has_at_most_the_words_training_cut_captions_to():
    """A limit of 5 tokens with EOS is at most 4 words: a hypothesis the search ended at the limit (no EOS: five
    words) keeps its first four (captions decoded one word past --max-caption-len before)."""
    vocab = Vocabulary.build([["a", "red", "coat", "and", "a", "bag"]], min_count=1)
    torch.manual_seed(0)
    model = build_model(model_config(TINY, vocab_size=len(vocab))).eval()
    with torch.no_grad():  # the output layer (tied) far from end of sentence: every caption runs to the limit
        model.embed.weight[vocab.words.index("red")] = -50 * model.embed.weight[4:].mean(0)
    images = [np.random.default_rng(k).integers(0, 256, (64, 64, 1), dtype=np.uint8) for k in range(4)]
    hyps = beam_search(model, stack_sources(images), beam=2, max_len_a=0, max_len_b=5)
    words = [vocab.tokens(h[0].tokens) for h in hyps]
    assert max(len(w) for w in words) == 5  # the untrained model runs to the limit
    got = caption_images(model, vocab, images, 2, 5)
    assert got == [" ".join(w[:4]) for w in words]


def test_a_source_of_images_has_no_length():
    images = torch.zeros(2, 1, 8, 8, dtype=torch.uint8)
    assert max_lengths(images, 0, 7).tolist() == [7, 7]
    assert max_lengths(torch.tensor([[5, 6, 0], [5, 0, 0]]), 1.5, 1).tolist() == [4, 2]
    with pytest.raises(ValueError, match="not token ids"):
        max_lengths(images, 1.0, 7)


def test_encoder_and_decoder_take_their_own_connections():
    for spec, family in ((TINY, "captioner"), ("transformer-small(d_model=32,ffn_dim=64,heads=2)", "transformer")):
        model = build_model(model_config(spec, vocab_size=20, encoder_connection="PostLN", decoder_connection="SAS"))
        enc, dec = model.encoder.layers[0], model.decoder.layers[0]
        assert type(enc.conn_attn).__name__ == "ExpandedSkip", family
        assert {type(dec.conn_self).__name__, type(dec.conn_cross).__name__} == {"SelfAdaptiveScaling"}, family
    same = model_config("transformer-small")
    assert same.stack_connection("encoder") == same.stack_connection("decoder") == "PostLN"
    with pytest.raises(ValueError, match="Nope"):
        model_config("transformer-small", encoder_connection="Nope")


def test_features_input_masks_padded_regions():
    model = build_model(model_config("captioner-base(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,"
                                     "feature_dim=6)", vocab_size=20)).eval()
    feats = torch.randn(2, 4, 6)
    feats[1, 2:] = 0  # the second image has two regions
    _, mask = model.image_sequence(feats)
    assert mask[:, 0, 0].tolist() == [[True] * 4, [True, True, False, False]]
    alone = model(feats[1:, :2], torch.tensor([[2, 5, 6]]))
    padded = model(feats, torch.tensor([[2, 5, 6], [2, 5, 6]]))[1:]
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"expected features \(B, N, 6\)"):
        model.image_sequence(torch.randn(2, 4, 5))


def write_coco(root: Path, size: int = 32) -> dict[str, Path]:
    """COCO-format files: three splits' captions_*.json and RGB PNGs; a Karpathy dataset.json and .npz
    features for the same images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    words = ["a", "red", "blue", "square", "circle", "on", "the", "left", "right"]
    images, karpathy = root / "images", {"dataset": "coco", "images": []}
    (root / "feats").mkdir(parents=True)
    images.mkdir()
    files = {}
    for split, n, first in (("train", 6, 1), ("val", 2, 100), ("test", 2, 200)):
        data = {"images": [], "annotations": []}
        for k in range(n):
            image_id = first + k
            name = f"COCO_{split}_{image_id:012d}.png"
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(images / name)
            np.savez_compressed(root / "feats" / f"{image_id}.npz", feat=rng.standard_normal((3 + k % 2, 8)).astype(np.float32))
            data["images"].append({"id": image_id, "file_name": name, "height": size, "width": size})
            caps = [" ".join(rng.choice(words, 5)).capitalize() + "." for _ in range(5)]
            data["annotations"] += [{"id": image_id * 10 + j, "image_id": image_id, "caption": c} for j, c in enumerate(caps)]
            karpathy["images"].append({"filepath": "", "filename": name, "imgid": image_id, "cocoid": image_id,
                                       "split": "restval" if k == 0 and split == "train" else split,
                                       "sentids": [], "sentences": [{"raw": c, "tokens": c.lower()[:-1].split()}
                                                                    for c in caps]})
        files[split] = root / f"captions_{split}2014.json"
        files[split].write_text(json.dumps(data))
    files["karpathy"] = root / "dataset_coco.json"
    files["karpathy"].write_text(json.dumps(karpathy))
    return {**files, "images": images, "feats": root / "feats"}


def test_coco_and_karpathy_files_load_and_train_a_step(tmp_path, capsys):
    pytest.importorskip("pycocoevalcap")  # scored with it
    coco = write_coco(tmp_path / "coco")
    pixels = "captioner-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,trunk_width=4,channels=3,image_size=32)"
    common = ["--dataset", "", "--min-count", "1", "--batch-size", "10", "--max-steps", "1", "--warmup", "1",
              "--save-every", "1", "--device", "cpu"]
    assert main(["train", "caption", *common, "--model", pixels, "--captions", str(coco["train"]),
                 "--valid-captions", str(coco["val"]), "--test-captions", str(coco["test"]),
                 "--image-dir", str(coco["images"]), "--out", str(tmp_path / "coco-run")]) == 0
    stored = json.loads((tmp_path / "coco-run" / "config.json").read_text())
    assert stored["data"]["train_images"] == 6 and stored["data"]["train_pairs"] == 30
    features = "captioner-base(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,feature_dim=8)"
    assert main(["train", "caption", *common, "--model", features, "--captions", str(coco["karpathy"]),
                 "--feature-dir", str(coco["feats"]), "--out", str(tmp_path / "karpathy-run")]) == 0
    stored = json.loads((tmp_path / "karpathy-run" / "config.json").read_text())
    assert stored["data"]["train_images"] == 6  # restval read as train
    model, vocab, ckpt = load_model(tmp_path / "karpathy-run")
    result = describe_split(model, vocab, ckpt["config"], "test", beam=2)
    assert sorted(result["captions"]) == [200, 201] and isinstance(result["CIDEr"], float)
    capsys.readouterr()
    figure = tmp_path / "rgb.png"  # colour images draw; region features have no picture to draw
    assert main(["eval", "caption", "--checkpoint", str(tmp_path / "coco-run"), "--figure", str(figure)]) == 0
    assert figure.stat().st_size > 0 and json.loads(capsys.readouterr().out)["images"] == 2
    assert main(["eval", "caption", "--checkpoint", str(tmp_path / "karpathy-run"), "--figure",
                 str(tmp_path / "feats.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs images" in err and not (tmp_path / "feats.png").exists()


def test_karpathy_files_read_as_their_references_say(tmp_path, capsys):
    """A sentence without "raw" is scored against its tokens joined (it was an empty reference: CIDEr 181 read
    42, silently); an image id given twice is refused (the second image replaced the first in the scores while the
    count said both); an image without sentences is left out, as in a COCO file; --test-captions beside a Karpathy
    file is refused (it was ignored); a COCO run names each split's own file."""
    coco = write_coco(tmp_path / "coco")
    karpathy = json.loads(coco["karpathy"].read_text())
    test = [im for im in karpathy["images"] if im["split"] == "test"]
    for sentence in test[0]["sentences"][1:]:
        del sentence["raw"]
    config = dict(dataset="", captions=str(coco["karpathy"]), valid_captions="", test_captions="",
                  image_dir=str(coco["images"]), feature_dir="", data_dir="", model=TINY.replace(")", ",channels=3)"))
    coco["karpathy"].write_text(json.dumps(karpathy))
    split = load_split(config, "test")
    assert split.raw[0][1:] == [" ".join(s["tokens"]) for s in test[0]["sentences"][1:]]
    assert split.raw[0][0] == test[0]["sentences"][0]["raw"]
    test[1]["sentences"] = []
    coco["karpathy"].write_text(json.dumps(karpathy))
    split = load_split(config, "test")
    assert split.ids == [test[0]["cocoid"]] and split.name == "dataset_coco.json test (1 images)"
    with pytest.raises(ValueError, match="a Karpathy split file, which holds every split itself: --test-captions"):
        load_split({**config, "test_captions": "no_such_file.json"}, "test")
    test[1]["cocoid"] = test[0]["cocoid"]
    coco["karpathy"].write_text(json.dumps(karpathy))
    with pytest.raises(ValueError, match=f"image id {test[0]['cocoid']} appears twice"):
        load_split(config, "test")
    files = {**config, "captions": str(coco["train"]), "valid_captions": str(coco["val"]),
             "test_captions": str(coco["test"])}
    assert load_split(files, "test").name == "captions_test2014.json test (2 images)"
    assert load_split(files, "train").name == "captions_train2014.json train (6 images)"


def test_a_self_critical_run_resumes_as_it_would_have_gone_on(scenes_dir, tmp_path):
    """The sampling generator is saved with the checkpoint: a self-critical run stopped at step 2 and resumed
    draws the samples the uninterrupted run drew (it started again from the seed: other samples, other losses
    from step 3 on)."""
    xe = tmp_path / "xe"
    assert main(scene_args(scenes_dir, xe)) == 0

    def scst(out, steps, *extra):
        args = scene_args(scenes_dir, out, "--scst-from", str(xe), "--scst-samples", "3", "--schedule", "constant",
                          "--lr", "5e-3", "--warmup", "0", *extra)
        args[args.index("--batch-size") + 1] = "8"
        args[args.index("--max-steps") + 1] = str(steps)
        return main(args)

    assert scst(tmp_path / "full", 4) == 0
    assert scst(tmp_path / "cut", 2) == 0 and scst(tmp_path / "cut", 4, "--resume") == 0
    losses = [[json.loads(x)["loss"] for x in (tmp_path / run / "steps.jsonl").read_text().splitlines()]
              for run in ("full", "cut")]
    assert len(losses[0]) == 4 and losses[0] == losses[1]
    full, cut = (torch.load(tmp_path / run / "last.pt", weights_only=True)["model"] for run in ("full", "cut"))
    assert all(torch.equal(full[k], cut[k]) for k in full)


def test_bad_caption_data_is_one_line_and_writes_nothing(tmp_path, capsys):
    coco = write_coco(tmp_path / "coco")
    pixels = "captioner-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,trunk_width=4,channels=3,image_size=32)"
    base = ["train", "caption", "--dataset", "", "--min-count", "1", "--max-steps", "1", "--device", "cpu",
            "--captions", str(coco["train"]), "--valid-captions", str(coco["val"])]
    missing = sorted(coco["images"].glob("COCO_train*"))[0]
    missing.rename(missing.with_suffix(".bak"))
    out = tmp_path / "run"
    assert main([*base, "--model", pixels, "--image-dir", str(coco["images"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and not out.exists()
    missing.with_suffix(".bak").rename(missing)
    bigger = pixels.replace("image_size=32", "image_size=64")
    assert main([*base, "--model", bigger, "--image-dir", str(coco["images"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected 64x64" in err and not out.exists()
    assert main([*base, "--model", pixels, "--feature-dir", str(coco["feats"]), "--out", str(out)]) == 2
    assert "input=features" in capsys.readouterr().err
    assert main(["train", "caption", "--dataset", "", "--max-steps", "1", "--captions", str(coco["train"]),
                 "--image-dir", str(coco["images"]), "--model", pixels, "--out", str(out)]) == 2
    assert "--valid-captions" in capsys.readouterr().err and not out.exists()


def test_captioner_is_not_a_translation_model():
    with pytest.raises(ValueError, match="not a translation model"):
        MTTrainConfig(max_steps=1, model="captioner-small")
    with pytest.raises(ValueError, match="not a captioning model"):
        CaptionTrainConfig(max_steps=1, model="transformer-small")


def test_scenes_split_is_the_composed_set(scenes_dir):
    cfg = CaptionTrainConfig(max_steps=1, data_dir=str(scenes_dir), train_scenes=5, valid_scenes=3, test_scenes=4)
    split = load_split(cfg, "test")
    assert len(split) == 4 and split.load(0).shape == (64, 64) and len(split.raw[0]) == 5
    assert split.tokens[0][0] == split.raw[0][0].lower().replace(",", " ").split()  # commas its only punctuation
    again = load_split(cfg, "test")
    assert np.array_equal(split.load(3), again.load(3)) and split.raw == again.raw


def test_self_critical_stage_starts_from_a_run_and_trains(scenes_dir, tmp_path, capsys):
    xe = tmp_path / "xe"
    assert main(scene_args(scenes_dir, xe)) == 0
    scst = tmp_path / "scst"
    args = scene_args(scenes_dir, scst, "--scst-from", str(xe), "--scst-samples", "3", "--schedule", "constant",
                      "--lr", "5e-6", "--warmup", "0")
    args[args.index("--batch-size") + 1] = "8"
    assert main(args) == 0
    stored = json.loads((scst / "config.json").read_text())
    assert stored["data"]["scst_from"] == str(xe) and stored["data"]["scst_from_step"] == 4
    assert [r["lr"] for r in map(json.loads, (scst / "metrics.jsonl").read_text().splitlines())] == [5e-6, 5e-6]
    steps = [json.loads(x) for x in (scst / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 4  # one line an update (8 images x 3 samples each)
    start = torch.load(xe / "last.pt", weights_only=True)
    assert torch.load(scst / "checkpoint_2.pt", weights_only=True)["tokenizer"] == start["tokenizer"]
    bigger = scene_args(scenes_dir, tmp_path / "other", "--scst-from", str(xe))
    bigger[bigger.index(TINY)] = TINY.replace("d_model=32", "d_model=48")
    capsys.readouterr()
    assert main(bigger) == 2 and "give the same model" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_self_critical_loss_is_the_rewarded_log_likelihood(scenes_dir, monkeypatch):
    """With the samples and the greedy captions fixed, the loss is -Σ (r_k - r_greedy) log p(sample k), the
    log-probabilities those of the model without dropout."""
    import skiplab.decoding as decoding
    from skiplab.data.captions import Vocabulary
    from skiplab.train.caption import ImageBatch, SelfCritical

    cfg = CaptionTrainConfig(max_steps=1, data_dir=str(scenes_dir), train_scenes=4, valid_scenes=2, test_scenes=2)
    split = load_split(cfg, "train")
    vocab = Vocabulary.build((t for caps in split.tokens for t in caps), 1)
    torch.manual_seed(0)
    model = build_model(model_config(TINY, vocab_size=len(vocab), dropout=0.3)).train()
    sc = SelfCritical(vocab, split, 2, 5, seed=0)
    ref = split.tokens[1][0]
    samples = [vocab.encode(ref, bos_eos=False), [5, 6], vocab.encode(ref[:4], bos_eos=False)[:4], [7]]
    monkeypatch.setattr(decoding, "greedy_search", lambda m, s, a, b: [[4], [5]])
    monkeypatch.setattr(decoding, "sample_search", lambda m, s, n, L, g: (samples, [True, True, False, True]))
    batch = ImageBatch(split, [0, 1], 2).to("cpu")
    loss = sc(model, model, batch)
    assert model.training  # put back
    model.eval()
    expected = 0.0
    for k, (tokens, eos) in enumerate(zip(samples, [True, True, False, True])):
        image = k // 2
        gain = sc.cider.sentence(vocab.decode(tokens), sc.references[image]) - sc.cider.sentence(
            vocab.decode([[4], [5]][image]), sc.references[image])
        tgt = [*tokens, Vocabulary.EOS] if eos else tokens
        logits = model(batch.src[image:image + 1], torch.tensor([[Vocabulary.BOS, *tokens]]))[0].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(tgt)), torch.tensor(tgt)].sum()
        expected = expected - gain * logp
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-4)
    assert sc.cider.sentence(vocab.decode(samples[2]), sc.references[1]) > 0  # a reference's words earn reward


def test_sampling_draws_from_the_model(scenes_dir):
    """One step sampled 4,000 times: each word's frequency is its probability under the model (4 sigma)."""
    from skiplab.decoding import sample_search

    torch.manual_seed(1)
    model = build_model(model_config(TINY, vocab_size=8)).eval()
    image = torch.randint(0, 256, (1, 1, 64, 64), dtype=torch.uint8)
    tokens, ended = sample_search(model, image, n=4000, max_len=1, generator=torch.Generator().manual_seed(0))
    state = model.start(model.encode(image))
    with torch.no_grad():
        probs = model.step(torch.tensor([2]), state).exp()[0]
    probs[[0, 2]] = 0
    probs = probs / probs.sum()
    first = [t[0] if t else 3 for t in tokens]  # an empty output ended at once: EOS (3)
    for word in range(8):
        freq = sum(f == word for f in first) / 4000
        p = float(probs[word])
        assert abs(freq - p) <= 4 * (p * (1 - p) / 4000) ** 0.5 + 1e-9, (word, freq, p)
    assert sum(ended) == sum(f == 3 for f in first)


def test_the_constant_schedule_warms_up_then_holds():
    from skiplab.train.recipe_mt import peak_lr, schedule_lr

    assert peak_lr("constant", 5e-6, 512, 10) == 5e-6
    assert [schedule_lr("constant", s, 1e-3, 4) for s in (1, 2, 4, 5, 100)] == pytest.approx(
        [2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3])
    assert schedule_lr("constant", 1, 1e-3, 0) == 1e-3
    assert schedule_lr("inverse_sqrt", 16, 1e-3, 4) == pytest.approx(1e-3 * (4 / 16) ** 0.5)


@pytest.mark.parametrize("command", [["compare", "caption", "--connections", "PostLN,SAS"], ["demo", "caption"]])
def test_compare_caption_ranks_designs_by_cider(scenes_dir, tmp_path, capsys, command):
    pytest.importorskip("pycocoevalcap")  # scored with it
    out = tmp_path / "cmp"
    args = scene_args(scenes_dir, out)[2:]  # the options without "train caption"
    args[args.index("--max-steps") + 1] = "2"
    assert main([*command, *args, "--seeds", "1"]) == 0
    table = (out / "table.md").read_text()
    assert "CIDEr" in table and "PostLN" in table and "SAS" in table
    summaries = [json.loads(p.read_text()) for p in out.glob("*/seed1/summary.json")]
    assert len(summaries) == 2 and all(isinstance(s["test_cider"], float) for s in summaries)


def test_compare_caption_without_the_metrics_package_says_so_before_training(scenes_dir, tmp_path, capsys,
                                                                            monkeypatch):
    from skiplab.interop import coco_eval

    monkeypatch.setattr(coco_eval, "_package_missing", lambda: coco_eval.INSTALL)
    out = tmp_path / "cmp"
    args = scene_args(scenes_dir, out)[2:]
    assert main(["compare", "caption", "--connections", "PostLN,SAS", *args, "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["skiplab: error: captioning runs are compared by their test CIDEr, which cannot be computed here: "
                   "pycocoevalcap is not installed: pip install skiplab[caption]"]
    assert not out.exists()  # nothing written, nothing trained


def test_what_each_metric_needs_is_told_before_scoring(monkeypatch):
    from skiplab.interop import coco_eval

    monkeypatch.setattr(coco_eval, "_package_missing", lambda: None)
    monkeypatch.setattr(coco_eval, "_java_missing", lambda: "no java on PATH")
    assert [coco_eval.unavailable(m) for m in ("BLEU", "ROUGE_L", "CIDEr", "meteor", "SPICE")] == [
        None, None, None, "no java on PATH", "no java on PATH"]
    monkeypatch.setattr(coco_eval, "_java_missing", lambda: None)
    assert coco_eval.unavailable("METEOR") is None
    monkeypatch.setattr(coco_eval, "_package_missing", lambda: coco_eval.INSTALL)
    assert {coco_eval.unavailable(m) for m in coco_eval.METRICS} == {coco_eval.INSTALL}
    with pytest.raises(ValueError, match="unknown metric 'BLEU-5'; known: BLEU, METEOR"):
        coco_eval.unavailable("BLEU-5")


def test_a_run_whose_cider_cannot_be_computed_is_named_and_left_out_of_the_mean(scenes_dir, tmp_path, capsys):
    """CIDEr-D of one test image is refused by the scorer (a string saying why in the summary): compare names the run
    and tables the rest rather than averaging the string."""
    pytest.importorskip("pycocoevalcap")  # scored with it
    out = tmp_path / "cmp"
    args = scene_args(scenes_dir, out)[2:]
    args[args.index("--test-scenes") + 1] = "1"
    args[args.index("--max-steps") + 1] = "2"
    assert main(["compare", "caption", "--connections", "PostLN,SAS", *args, "--seeds", "1"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "no CIDEr" in line]
    assert [line.split(":")[2].strip() for line in said] == ["PostLN seed 1", "SAS seed 1"]  # skiplab: warning: ...
    assert all("CIDEr-D needs at least two images" in line for line in said)
    rows = [line for line in (out / "table.md").read_text().splitlines() if line.startswith(("| PostLN", "| SAS"))]
    assert len(rows) == 2 and all("| no value " in row and "| 1 / 0 / 0 " in row for row in rows)


def test_a_coco_file_is_told_from_karpathys_by_its_keys_not_its_first_bytes(tmp_path):
    """captions_train2014.json lists its images first; its "annotations" key comes megabytes in."""
    coco = write_coco(tmp_path / "coco")
    data = json.loads(coco["train"].read_text())
    coco["train"].write_text(json.dumps({"info": {"description": "x" * 10_000}, **data}))
    cfg = CaptionTrainConfig(max_steps=1, dataset="", captions=str(coco["train"]), valid_captions=str(coco["val"]),
                             image_dir=str(coco["images"]),
                             model="captioner-small(channels=3,image_size=32)")
    assert load_split(cfg, "train").ids == list(range(1, 7)) and load_split(cfg, "valid").ids == [100, 101]


def test_teacher_forcing_pads_and_shifts():
    from skiplab.train.caption import teacher_forcing

    tgt_in, tgt_out = teacher_forcing([[2, 7, 8, 3], [2, 9]])  # one ended by EOS, one cut without it
    assert tgt_in.tolist() == [[2, 7, 8], [2, 0, 0]] and tgt_out.tolist() == [[7, 8, 3], [9, 0, 0]]


FEATURES = "captioner-base(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,feature_dim=8)"
PIXELS = ("captioner-small(d_model=32,ffn_dim=64,heads=2,encoder_layers=1,decoder_layers=1,trunk_width=4,channels={},"
          "image_size=32)")


def spoil(coco: dict[str, Path], case: str) -> tuple[list[str], Path, str]:
    """One bad input of a files run: (its options, the file named, what the line says)."""
    from PIL import Image

    trains = sorted(coco["images"].glob("COCO_train*"))
    if case == "features of mixed widths":
        bad = coco["feats"] / "4.npz"
        np.savez_compressed(bad, feat=np.zeros((3, 9), np.float32))
        return ["--model", FEATURES, "--feature-dir", str(coco["feats"])], bad, \
            "features of shape (3, 9), expected (*, 8)"
    if case == "features all of the wrong width":
        return ["--model", FEATURES.replace("feature_dim=8", "feature_dim=16"), "--feature-dir",
                str(coco["feats"])], coco["feats"] / "1.npz", "features of shape (3, 8), expected (*, 16)"
    if case == "integer features":
        bad = coco["feats"] / "2.npz"
        np.savez_compressed(bad, feat=np.ones((3, 8), np.int64))
        return ["--model", FEATURES, "--feature-dir", str(coco["feats"])], bad, \
            "features of type int64, expected floating-point values"
    if case == "an image of another size after the first":
        Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(trains[3])
        return ["--model", PIXELS.format(3), "--image-dir", str(coco["images"])], trains[3], \
            "image of 16x16 (height x width), expected 32x32"
    assert case == "an RGB image among grey ones"
    for path in coco["images"].glob("*.png"):
        Image.fromarray(np.zeros((32, 32), np.uint8)).save(path)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(trains[3])
    return ["--model", PIXELS.format(1), "--image-dir", str(coco["images"])], trains[3], \
        "an RGB image (3 channels), expected 1 channel (grey)"


@pytest.mark.parametrize("case", ["features of mixed widths", "features all of the wrong width", "integer features",
                                  "an image of another size after the first", "an RGB image among grey ones"])
def test_every_image_file_is_checked_before_a_run_writes(tmp_path, capsys, case):
    """Each image's (or its features') file header is read before the run directory is made: a bad one anywhere
    in the set is one line naming it, and nothing is written (config.json was, which then blocked the retry)."""
    coco = write_coco(tmp_path / "coco")
    options, bad, said = spoil(coco, case)
    out = tmp_path / "run"
    assert main(["train", "caption", "--dataset", "", "--min-count", "1", "--batch-size", "10", "--max-steps", "1",
                 "--warmup", "1", "--save-every", "1", "--device", "cpu", "--captions", str(coco["karpathy"]),
                 *options, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"skiplab: error: {bad}: {said}", err
    assert not out.exists()


def test_a_colour_model_reads_grey_images_widened(tmp_path):
    """COCO holds a few grey images: a model of 3 channels reads them as RGB (the grey value in each channel)."""
    from PIL import Image

    coco = write_coco(tmp_path / "coco")
    grey = np.arange(32 * 32, dtype=np.uint8).reshape(32, 32)
    Image.fromarray(grey).save(coco["images"] / "COCO_train_000000000002.png")
    cfg = CaptionTrainConfig(max_steps=1, dataset="", captions=str(coco["karpathy"]), image_dir=str(coco["images"]),
                             model=PIXELS.format(3))
    split = load_split(cfg, "train")
    split.check()
    image = split.load(split.ids.index(2))
    assert image.shape == (32, 32, 3) and all(np.array_equal(image[..., c], grey) for c in range(3))


def test_a_coco_file_without_annotations_is_told_so(tmp_path, capsys):
    """A COCO captions file (images with "file_name") that lacks "annotations" was read as Karpathy's, whose
    message asked for a "filename"; it is told as COCO's, in one line, nothing written."""
    coco = write_coco(tmp_path / "coco")
    data = json.loads(coco["train"].read_text())
    del data["annotations"]
    coco["train"].write_text(json.dumps(data))
    out = tmp_path / "run"
    assert main(["train", "caption", "--dataset", "", "--max-steps", "1", "--device", "cpu", "--model",
                 PIXELS.format(3), "--captions", str(coco["train"]), "--valid-captions", str(coco["val"]),
                 "--image-dir", str(coco["images"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"skiplab: error: {coco['train']}: no 'annotations' list at the top level", err
    assert not out.exists()
