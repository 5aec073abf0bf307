"""What ``train lm --log-layers 10`` costs: the bench's row ``per-layer telemetry at N = 10 / without`` (``skiplab
bench --groups lm``, :mod:`skiplab.bench.suite`) at a size of one's choosing, alone. Ten updates of ``train lm``'s
step (AdamW, the loss read back, clipping at 1.0) with the tenth watched, against the same ten unwatched, called in
turn (:func:`skiplab.bench.timing.interleaved`: the median of ``--rounds`` after one untimed round); prints and
writes (--out, JSON) both times and their ratio (the goal: at most 1.03x).

    OMP_NUM_THREADS=1 python experiments/layer_telemetry_cost.py --model gpt-mini --rows 16 --rounds 5 --out cost.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from skiplab import host
from skiplab.bench.steps import build, loop_step
from skiplab.bench.timing import interleaved
from skiplab.models import model_config
from skiplab.train.layer_telemetry import LayerWatch

EVERY = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--rows", type=int, default=16, help="windows a step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    context = model_config(a.model).context
    tokens = torch.randint(0, 257, (a.rows, context + 1), generator=torch.Generator().manual_seed(0))
    batch = (tokens[:, :-1], tokens[:, 1:])
    model = build(f"{a.model}(connection=PreLN)", vocab_size=257)
    t = interleaved({"plain": loop_step(model, batch, updates=EVERY),
                     "layers": loop_step(model, batch, layers=LayerWatch(model, EVERY), updates=EVERY)}, a.rounds, 1)
    result = {"model": a.model, "rows": a.rows, "context": context, "every": EVERY, "rounds": a.rounds,
              "threads": a.threads, "plain_s": t["plain"], "layers_s": t["layers"], "ratio": t["layers"] / t["plain"],
              "environment": host.environment()}
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
