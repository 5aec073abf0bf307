"""Seconds per training update of translation models, measured side by side on the same batches.

    python benchmarks/mt_step_time.py --models "transformer-small(connection=PostLN),dwlstm-small" \
        --data-dir ../shared/data/multi30k --updates 20

Every model trains on the same real batches (Multi30k en-de, about ``--max-tokens`` tokens each, the
recipe's label-smoothed loss and Adam); the models take turns update by update, so a change in the
machine's load touches all of them alike. Prints s/update (median over the timed updates, after
``--warmup`` untimed ones), tokens/s and the ratio to the first model, with the thread count.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from skiplab.config import parse_list
from skiplab.models import build_model, model_config
from skiplab.corpora import encode_parallel, filter_long, load_corpus, make_batches
from skiplab.tokenization import Tokenizer
from skiplab.train.recipe_mt import label_smoothed_loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=parse_list, default=("transformer-small(connection=PostLN)",
                                                         "transformer-small(connection=PreLN)", "dwlstm-small"))
    p.add_argument("--data-dir", default="../shared/data/multi30k")
    p.add_argument("--pairs", type=int, default=4000, help="training pairs to cut batches from")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--updates", type=int, default=20, help="timed updates per model")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates per model first")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    data = load_corpus("multi30k", args.data_dir, "en", "de", "train", download=False)
    src, tgt = data.src[: args.pairs], data.tgt[: args.pairs]
    with tempfile.TemporaryDirectory() as tmp:
        tok = Tokenizer.train(src + tgt, f"{tmp}/spm", 8000)
    s_ids, t_ids = encode_parallel(tok, type(data)(src, tgt, data.name))
    kept, _ = filter_long(s_ids, t_ids, 256)
    batches = make_batches(s_ids, t_ids, args.max_tokens, kept, shuffle=True, generator=torch.Generator().manual_seed(0))
    need = args.warmup + args.updates
    batches = (batches * (need // len(batches) + 1))[:need]

    runs = []
    for spec in args.models:
        torch.manual_seed(0)
        model = build_model(model_config(spec, vocab_size=tok.vocab_size, pad_id=Tokenizer.PAD)).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        runs.append({"spec": spec, "model": model, "opt": opt, "times": [],
                     "params": sum(q.numel() for q in model.parameters())})
    for i, b in enumerate(batches):
        for r in runs:  # one update each, in turn
            t0 = time.perf_counter()
            r["opt"].zero_grad(set_to_none=True)
            loss, _ = label_smoothed_loss(r["model"](b.src, b.tgt_in), b.tgt_out, 0.1, Tokenizer.PAD)
            (loss / b.ntokens).backward()
            r["opt"].step()
            if i >= args.warmup:
                r["times"].append(time.perf_counter() - t0)
    tokens = statistics.mean(b.ntokens for b in batches[args.warmup:])
    print(f"{args.updates} timed updates per model, {tokens:.0f} target tokens each on average, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}")
    first = statistics.median(runs[0]["times"])
    print("| model | parameters | s/update (median) | target tokens/s | ratio |")
    print("|---|---|---|---|---|")
    for r in runs:
        med = statistics.median(r["times"])
        print(f"| {r['spec']} | {r['params']:,} | {med:.2f} | {tokens / med:,.0f} | {med / first:.2f} |")


if __name__ == "__main__":
    main()
