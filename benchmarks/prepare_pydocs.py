"""``skiplab prepare lm`` on the pydocs corpus: its time and size per tokenizer, and what it saves at a run's start.

For each tokenizer: ``prepare`` into a fresh folder (wall time, bytes on disk, tokens per split), then the start of
a run, ``train lm`` from nothing to the first forward of its first update (gpt-mini, the first 4,096 validation
tokens), from the text and from the prepared folder, alternately, ``REPEATS`` times each; the medians and their
ratio. The text path tokenises the training split (and, for ``bpe``, trains the sentencepiece model) at every start;
the prepared one memory-maps the shards. Written as ``prepare.json`` and ``prepare.md`` in OUT.

Usage: python benchmarks/prepare_pydocs.py OUT [TOKENIZER ...]
       e.g. python benchmarks/prepare_pydocs.py runs/prepare bytes bpe tiktoken:gpt2:gpt2/gpt2.tiktoken
"""

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from skiplab import host
from skiplab.corpora.prepare import PrepareConfig, prepare
from skiplab.models import build_model
from skiplab.train import lm
from skiplab.train.lm import LMTrainConfig

PYDOCS = Path(__file__).resolve().parents[2] / "shared" / "data" / "pydocs"
REPEATS = 3


class Started(Exception):
    """Raised at the first forward of the model: the run has started."""


def start(tokenizer: str, data_dir: str, out: Path) -> float:
    """Seconds of a run from nothing to the first forward of its first update: the tokenizer, the data of the
    training and validation splits, the model and the run directory made (the update itself is not timed)."""
    shutil.rmtree(out, ignore_errors=True)
    cfg = LMTrainConfig(model="gpt-mini", corpus="pydocs", data_dir=data_dir, tokenizer=tokenizer, batch_size=8,
                        max_steps=1, eval_every=1, warmup=0, valid_tokens=4096, device="cpu", out=str(out))

    def built(mcfg):
        model = build_model(mcfg)
        model.register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(Started()))
        return model

    lm.build_model = built
    t0 = time.perf_counter()
    try:
        lm.train(cfg, progress=False)
    except Started:
        return time.perf_counter() - t0
    finally:
        lm.build_model = build_model
    raise RuntimeError("the run ended without a forward")


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    out = Path(sys.argv[1])
    tokenizers = sys.argv[2:] or ["bytes", "bpe"]
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rows = []
    for tok in tokenizers:
        name = tok.split(":")[0] + (f"-{tok.split(':')[1]}" if tok.startswith("tiktoken:") else "")
        folder = out / f"prepared-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        meta = prepare(PrepareConfig(corpus="pydocs", data_dir=str(PYDOCS), tokenizer=tok, out=str(folder)),
                       progress=False)
        seconds = time.perf_counter() - t0
        text, shards = [], []
        for _ in range(REPEATS):  # alternately, so that both see the same machine
            text.append(start(tok, str(PYDOCS), out / "run"))
            shards.append(start(tok, str(folder), out / "run"))
        row = {"tokenizer": tok, "prepare_s": round(seconds, 2), "bytes_on_disk": size(folder),
               "dtype": meta["dtype"], "vocab_size": meta["vocab_size"],
               "tokens": {s: v["tokens"] for s, v in meta["splits"].items()},
               "start_text_s": [round(t, 3) for t in text], "start_prepared_s": [round(t, 3) for t in shards],
               "ratio": round(statistics.median(text) / statistics.median(shards), 2)}
        rows.append(row)
        print(json.dumps(row))
    shutil.rmtree(out / "run", ignore_errors=True)
    result = {"command": "python benchmarks/prepare_pydocs.py " + " ".join(sys.argv[1:]), "threads": 1,
              "repeats": REPEATS, "rows": rows, "environment": host.environment()}
    (out / "prepare.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"pydocs ({PYDOCS.name}), one thread, {host.machine_name(result['environment'])}; start = train lm "
             "from nothing to its first update's forward (gpt-mini, 4,096 validation tokens), median of "
             f"{REPEATS}, text and prepared alternately", "",
             "| tokenizer | prepare (s) | on disk (MB) | dtype | train / valid / test tokens | start from text (s) "
             "| start from shards (s) | text / shards |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["tokens"]
        lines.append(f"| {r['tokenizer']} | {r['prepare_s']:.1f} | {r['bytes_on_disk'] / 1e6:.1f} | {r['dtype']} | "
                     f"{t['train']:,} / {t['valid']:,} / {t['test']:,} | {statistics.median(r['start_text_s']):.2f} "
                     f"| {statistics.median(r['start_prepared_s']):.2f} | {r['ratio']:.1f}x |")
    (out / "prepare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
