"""``skiplab import hf`` and ``skiplab export hf``: a Hugging Face model folder <-> a language-model run directory.

The weights and configs map as :mod:`skiplab.interop.hf` says; this module reads and writes the two folders::

    HF folder (save_pretrained)                      skiplab run directory (skiplab.run_dir)
    config.json  GPT2LMHeadModel / LlamaForCausalLM  config.json  the LM config (model: interop.hf.model_spec),
    model.safetensors, or shards and                              the model's config, data facts, ``imported``
      model.safetensors.index.json                   last.pt      an ``lm`` checkpoint: model (float32),
    tokenizer.json, or GPT-2's vocab.json                         tokenizer (stored form), step 0, a fresh
      and merges.txt (if any)                                     optimizer and RNG state
                                                     tokenizer.json  the tokenizer's copy (if any)

An imported run is what ``eval lm``, ``generate`` and every ``analyze`` take, and what ``train lm --resume``
fine-tunes: the LM config's other fields are given as ``train lm`` takes them, its data
(``--corpus``/``--data-dir`` or ``--train-file``/``--valid-file``/``--test-file``; ``eval lm --data-dir`` can
point elsewhere later) and its recipe. Its tokenizer is the folder's ``tokenizer.json``, read as
``--tokenizer hf:FILE`` reads it (GPT-2's ``vocab.json`` and ``merges.txt`` are first made into one); end of
text is the file's (``hf_tokenizer.EOT_NAMES``), or, where the file names none or several, the token of the
config's ``eos_token_id``. A folder without a tokenizer gives a run that reads pre-tokenised ``.bin`` files
alone (its checkpoint's tokenizer None). Weights are read with safetensors alone (no pickle is loaded), and the
whole folder is checked (the config, every tensor: floating-point and fitting the model, the tokenizer) before
anything is written; the run is written into a temporary folder beside ``--out`` and renamed into place.

Export is the reverse: a run's ``last.pt`` (or the mean of its last ``--average`` step checkpoints) through
:func:`skiplab.interop.hf.hf_model` and ``save_pretrained``, with the run's tokenizer as ``tokenizer.json``
where it is a Hugging Face one, or a tiktoken encoding's conversion, with tiktoken's ids, and a
tokenizer_config.json (:func:`tokenizer_files`); a design the two classes cannot express is the mapping's one-line
error.
An existing ``--out`` is refused unless ``--overwrite``, and even then only where it holds a ``config.json``
(a run, or a model folder): nothing else is ever replaced.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from .. import host, run_dir
from ..connections import iter_connections
from ..corpora.shards import is_prepared, read_prepared
from ..interop import hf
from ..tokenization.lm import ByteTokenizer, load_lm_tokenizer
from ..tokenization.pretrained import read_pretrained
from ..tokenization.pretrained.base import require
from ..tokenization.pretrained.hf_tokenizer import EOT_NAMES, INSTALL, HFTokenizer
from ..tokenization.pretrained.tiktoken_encoding import ENCODINGS, TiktokenEncoding
from ..train import lm
from ..train.lm_data import same_tokenizer

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# the LM config's fields an import decides; the others (the data, the recipe) are given as train lm takes them
FROM_FOLDER = ("model", "tokenizer", "vocab_size", "out")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def check_out(out: Path, overwrite: bool, run: bool = True) -> None:
    """``out`` may be written: absent or empty, or (``overwrite``) a folder holding a config.json; where what is
    written is not a run (``run`` False: an export), not a run's folder (its last.pt), whose checkpoints would go."""
    if out.exists() and not out.is_dir():
        raise run_dir.RunDirError(f"{out} is a file, not a folder; give another --out")
    if not (out.exists() and any(out.iterdir())):
        return
    if not overwrite:
        raise run_dir.RunDirError(f"{out} already exists; use --overwrite to replace it")
    if not (out / "config.json").is_file():
        raise run_dir.RunDirError(f"{out} holds no config.json (neither a run nor a model folder); refusing to "
                                  "overwrite it")
    if not run and (out / "last.pt").is_file():
        raise run_dir.RunDirError(f"{out} holds a run (its last.pt); an export does not replace a run's "
                                  "checkpoints: give another --out")
    inside = next((p.parent for p in sorted(out.rglob("*")) if p.name in ("last.pt", "config.json") and p.parent != out),
                  None)
    if inside is not None:  # replacing out removes all of it: a run or a model kept inside would go with it
        what = "a run" if (inside / "last.pt").is_file() else "a model folder"
        raise run_dir.RunDirError(f"{out} holds {what} in {inside}, which replacing {out} would delete; give "
                                  "another --out")


def _usual_modes(folder: Path) -> None:
    """``folder`` and everything in it given the modes ``mkdir`` and ``open`` would have given them here."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def write_atomically(out: Path, overwrite: bool, fill: Callable[[Path], None], run: bool = True) -> None:
    """``fill`` a temporary folder beside ``out``, then put it in ``out``'s place (:func:`check_out` with ``run``):
    a failure leaves ``out`` as it was, and nothing else behind. The folder and its files get the modes a new
    folder and file get here (the process's umask), not the temporary folder's owner-only one."""
    check_out(out, overwrite, run)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(stage)
        _usual_modes(stage)
        check_out(out, overwrite, run)  # again: another process may have written there meanwhile
        if not out.exists():
            os.replace(stage, out)
            return
        run_dir.hold(out)  # a run another process is training is refused, in its one line
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        try:
            os.replace(out, old / out.name)
            try:
                os.replace(stage, out)
            except BaseException:
                os.replace(old / out.name, out)
                old.rmdir()
                raise
        finally:
            run_dir.release(out)
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


# -- reading a Hugging Face folder --------------------------------------------------------------------------
def read_hf_config(folder: Path) -> Any:
    """The ``GPT2Config`` / ``LlamaConfig`` of ``folder/config.json``; another architecture, or another head on
    a supported one, is a one-line ValueError."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json (not a Hugging Face model folder)")
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a {type(raw).__name__}, not an object")
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable config ({_one_line(err)})") from None
    kind = raw.get("model_type")
    if kind not in hf.CLASSES:
        hf.config_from_hf(SimpleNamespace(model_type=kind))  # the mapping's one-line error
    base = {"gpt2": "GPT2Model", "llama": "LlamaModel"}[kind]
    wrong = [a for a in raw.get("architectures") or [] if a not in (hf.CLASSES[kind], base)]
    if wrong:
        raise ValueError(f"{path}: architectures {wrong}; skiplab imports {hf.CLASSES[kind]} (or its bare {base})")
    transformers = hf._transformers()
    try:
        return getattr(transformers, {"gpt2": "GPT2Config", "llama": "LlamaConfig"}[kind]).from_dict(raw)
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"{path}: not a valid {kind} config ({_one_line(err)})") from None


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a shard the index names, or the weights)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path}: not a readable safetensors file ({_one_line(err)})") from None
    for name, tensor in tensors.items():  # the buffers some checkpoints hold (a bool mask) are not weights
        if not tensor.is_floating_point() and not name.endswith(hf.NOT_WEIGHTS):
            raise ValueError(f"{path}: {name} holds {str(tensor.dtype).removeprefix('torch.')} values, not "
                             "floating-point weights")
    return tensors


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of ``folder``: model.safetensors, or the shards model.safetensors.index.json names (each
    tensor where the index says). Pickled weights (pytorch_model.bin) are never loaded."""
    index = folder / INDEX
    if (folder / WEIGHTS).is_file():
        return _load_safetensors(folder / WEIGHTS)
    if not index.is_file():
        pickled = [p.name for p in folder.glob("*.bin")]
        hint = f" ({', '.join(pickled)} is a pickle, which skiplab does not load: save it with safetensors)" \
            if pickled else ""
        raise FileNotFoundError(f"{folder}: no {WEIGHTS} or {INDEX}{hint}")
    try:
        where = json.loads(index.read_text())["weight_map"]
        if not isinstance(where, dict):
            raise ValueError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{index}: unreadable index ({_one_line(err)})") from None
    state: dict[str, Tensor] = {}
    for shard in sorted(set(where.values())):
        tensors = _load_safetensors(folder / shard)
        for name, file in where.items():
            if file == shard:
                if name not in tensors:
                    raise ValueError(f"{index}: {name} is not in {shard}, where the index puts it")
                state[name] = tensors[name]
    return state


def gpt2_tokenizer_json(folder: Path) -> bytes | None:
    """GPT-2's own tokenizer files, ``vocab.json`` and ``merges.txt``, as the ``tokenizer.json`` transformers
    converts them to (byte-level BPE with GPT-2's pattern, no prefix space; ``<|endoftext|>`` a special token);
    None where the folder lacks either."""
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        return None
    tokenizers = require("tokenizers", INSTALL, "Hugging Face")
    from tokenizers import decoders, models, pre_tokenizers

    try:
        tok = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
        specials = [t for t in json.loads(vocab.read_text()) if t in EOT_NAMES]
    except Exception as err:  # noqa: BLE001 - the library raises a bare Exception for a bad file
        raise ValueError(f"{folder}: vocab.json and merges.txt are not a BPE tokenizer ({_one_line(err)})") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok.to_str().encode("utf-8")


def read_hf_tokenizer(folder: Path, config: Any, copy: Path) -> tuple[str, HFTokenizer] | None:
    """(the ``--tokenizer`` it is, the tokenizer) of ``folder/tokenizer.json``, or of GPT-2's vocab.json and
    merges.txt (``copy``, the run's tokenizer.json, is then the file the spec names); None where there is none."""
    path = (folder / "tokenizer.json").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if not path.is_file():
            converted = gpt2_tokenizer_json(folder)
            if converted is None:
                return None
            path = Path(tmp) / "tokenizer.json"
            path.write_bytes(converted)
        named = str(copy.resolve()) if path.parent == Path(tmp) else str(path)
        try:
            return f"hf:{named}", read_pretrained(f"hf:{path}")
        except ValueError as err:  # no end-of-text token of its own, or several: the model's eos_token_id names it
            eos = getattr(config, "eos_token_id", None)
            probe = HFTokenizer(path.read_bytes(), {"eot": 0}, str(path))
            token = probe._tok.id_to_token(eos) if isinstance(eos, int) else None
            if token is None or ")" in token:
                why = str(err).split("; name it")[0]
                raise ValueError(f"{why}, and config.json's eos_token_id ({eos}) names no token of it: set "
                                 f"eos_token_id in {folder / 'config.json'} to the end-of-text id") from None
            return f"hf(eot={token}):{named}", read_pretrained(f"hf(eot={token}):{path}")


# -- import ---------------------------------------------------------------------------------------------------
def import_hf(source: str | Path, out: str | Path, overwrite: bool = False, **options: Any) -> Path:
    """Make the run directory ``out`` of the Hugging Face folder ``source``; ``options``: the run's other
    :class:`~skiplab.train.lm_config.LMTrainConfig` fields (its data: corpus, data_dir, train_file, ...; the recipe a
    ``train lm --resume`` fine-tunes with), but :data:`FROM_FOLDER`."""
    source, out = Path(source), Path(out)
    if out.resolve() == source.resolve():
        raise run_dir.RunDirError(f"--out {out} is the folder imported from; give the run another folder")
    check_out(out, overwrite)
    if source.is_file():
        raise ValueError(f"{source} is a file; give the Hugging Face model's folder (its config.json and weights)")
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: no such folder")
    config = read_hf_config(source)
    model = hf.from_hf(config, read_hf_weights(source))
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    model, mcfg = model.float(), model.cfg
    found = read_hf_tokenizer(source, config, out / HFTokenizer.file_name)
    spec, tok = found if found else ("bytes", None)
    if tok is not None and tok.vocab_size > mcfg.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tok.vocab_size} ids, the model {mcfg.vocab_size}")
    cfg = lm.LMTrainConfig(**{**options, "model": hf.model_spec(mcfg), "tokenizer": spec,
                              "vocab_size": mcfg.vocab_size, "out": str(out)})
    if tok is None and not cfg.binary:
        raise ValueError(f"{source}: no tokenizer (tokenizer.json, or GPT-2's vocab.json and merges.txt), so its run "
                         "reads token files alone: give --corpus '' --train-file X.bin --valid-file Y.bin")
    if cfg.data_dir and is_prepared(cfg.data_dir):  # a prepared folder serves only a run of its own tokenizer
        prep = read_prepared(cfg.data_dir)
        if tok is None or not same_tokenizer(tok, load_lm_tokenizer(prep.tokenizer_bytes())):
            raise ValueError(f"--data-dir {cfg.data_dir} holds tokens of --tokenizer {prep.tokenizer_spec}, not of "
                             f"{source}'s tokenizer: give the corpus's text folder (the run tokenises it) or a folder "
                             f"prepared with --tokenizer hf:{out}/{HFTokenizer.file_name}")
    imported = {"from": str(source.resolve()), "class": hf.CLASSES[config.model_type], "dtype": dtype}
    # a run at step 0, as train lm would resume it: ``train lm --resume --out RUN`` fine-tunes the model
    optimizer = torch.optim.AdamW(lm.parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.adam_betas,
                                  eps=cfg.adam_eps)
    rng = {"windows": torch.Generator().manual_seed(cfg.seed).get_state(), **run_dir.rng_state()}
    state = {"kind": "lm", "config": dataclasses.asdict(cfg), "model_config": dataclasses.asdict(mcfg),
             "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0,
             "best_valid_loss": math.inf, "tokenizer": tok.to_bytes() if tok else None, "rng": rng, "world_size": 1,
             "imported": imported}
    specs = sorted({c.spec for _, c in iter_connections(model)})

    def fill(stage: Path) -> None:
        run_dir.write_json(stage / "config.json", {
            "config": state["config"], "model": {"class": type(model).__name__, **state["model_config"]},
            "parameters": sum(p.numel() for p in model.parameters()), "connections": specs,
            "data": {"vocab_size": mcfg.vocab_size, "tokenizer": spec, "eot": tok.eot if tok else None},
            "imported": imported, "environment": host.environment()})
        run_dir.save_checkpoint(stage / "last.pt", state)
        if tok is not None:
            tok.write(stage)

    write_atomically(out, overwrite, fill)
    return out


# -- export ---------------------------------------------------------------------------------------------------
def tokenizer_files(tok: Any) -> dict[str, bytes]:
    """The run's tokenizer as Hugging Face files (name -> bytes): a Hugging Face tokenizer's own tokenizer.json;
    a tiktoken encoding's conversion (:meth:`TiktokenEncoding.tokenizer_json`, tiktoken's ids); each with a
    tokenizer_config.json that has transformers take that file as it is (``PreTrainedTokenizerFast``: from a
    GPT-2 config alone AutoTokenizer builds a ``GPT2Tokenizer``, which puts GPT-2's pattern in place of
    cl100k's or o200k's, or a GPT-NeoX file's), end of text its ``eos_token``, and for tiktoken a special token's
    text in a document read as text (``split_special_tokens``), as the run reads it (``encode_ordinary``); bytes as
    a byte-level file whose ids are the bytes (:meth:`ByteTokenizer.tokenizer_json`); nothing for the others
    (sentencepiece) or a run without a tokenizer."""
    def config(eot: str, **more: Any) -> bytes:
        fields = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eot, **more,
                  "clean_up_tokenization_spaces": False}
        return (json.dumps(fields, indent=2) + "\n").encode("utf-8")

    if isinstance(tok, HFTokenizer):  # its file as it is; special tokens' text read as those tokens, as the run does
        return {HFTokenizer.file_name: tok.payload, "tokenizer_config.json": config(tok.token(tok.eot))}
    if isinstance(tok, ByteTokenizer):  # bytes as ids (ByteTokenizer.tokenizer_json); a special token's text is text
        return {HFTokenizer.file_name: tok.tokenizer_json(),
                "tokenizer_config.json": config(tok.EOT_TEXT, split_special_tokens=True)}
    if not isinstance(tok, TiktokenEncoding):
        return {}
    eot = {i: t for t, i in ENCODINGS[tok.name][1].items()}[tok.eot]
    return {HFTokenizer.file_name: tok.tokenizer_json(), "tokenizer_config.json": config(eot, split_special_tokens=True)}


def export_hf(run: str | Path, out: str | Path, average: int = 0, overwrite: bool = False) -> Path:
    """Write the run ``run`` (its last.pt, or the mean of its last ``average`` step checkpoints) as a Hugging
    Face folder ``out`` that ``from_pretrained`` loads, with its tokenizer as a tokenizer.json where it can be
    one (:func:`tokenizer_files`)."""
    out = Path(out)
    check_out(out, overwrite, run=False)
    _, model, tok = lm.load_run(run, average)
    extra = {"eos_token_id": tok.eot} if tok is not None else {}
    model = hf.hf_model(model, **extra)  # a design the classes cannot express fails here, before any write
    files = tokenizer_files(tok)  # so does a conversion (tokenizers missing)

    def fill(stage: Path) -> None:
        model.save_pretrained(stage)
        for name, data in files.items():
            (stage / name).write_bytes(data)

    write_atomically(out, overwrite, fill, run=False)
    if tok is not None and not files:
        print(f"{out}: the run's tokenizer ({type(tok).__name__}) is not a Hugging Face tokenizer.json; none written")
    return out
