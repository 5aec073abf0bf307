"""A run exported by ``skiplab export hf`` against the run itself: ``GPT2LMHeadModel.from_pretrained(FOLDER)``'s
logits and skiplab's on the first test documents (the model's context of tokens each, float32), and, where the
folder has a tokenizer, its ids against the run's tokenizer's on the whole test split; with IMPORTED (the folder
brought back by ``skiplab import hf``), its ``eval lm`` and ``analyze redundancy`` results against the run's
(files beside the runs: OUT/eval_test.json, OUT/eval_imported.json, RUN/analysis/redundancy.json). Prints JSON.

Usage: python experiments/gpt2_check.py RUN FOLDER [IMPORTED]
"""

import json
import sys
from pathlib import Path

import torch
import transformers

from skiplab import host, run_dir
from skiplab.corpora.documents import load_documents
from skiplab.train.lm import load_run

run, folder = sys.argv[1], Path(sys.argv[2])
ckpt, model, tok = load_run(run)
cfg = run_dir.read_json(Path(run) / "config.json")["config"]
hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
test = load_documents(cfg["corpus"], cfg["data_dir"] if not Path(cfg["data_dir"], "prepared.json").is_file()
                      else json.loads(Path(cfg["data_dir"], "prepared.json").read_text())["data_dir"], "test").texts
context = model.cfg.context
windows = [ids[:context] for ids in (tok.encode(t) for t in test) if len(ids) >= context][:8]
x = torch.tensor(windows)
with torch.no_grad():
    ours, theirs = model.eval()(x), hf(input_ids=x).logits
result = {"class": type(hf).__name__, "windows": list(x.shape), "max_abs_logit_diff": float((ours - theirs).abs().max()),
          "max_abs_logit": float(ours.abs().max()), "same_argmax": bool((ours.argmax(-1) == theirs.argmax(-1)).all())}
if (folder / "tokenizer.json").is_file():
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    same = sum(fast.encode(t) == tok.encode(t) for t in test)
    result.update(tokenizer="tokenizer.json", test_documents=len(test), same_ids=same,
                  test_bytes=sum(len(t.encode()) for t in test))
else:
    result["tokenizer"] = "none in the folder"
if len(sys.argv) > 3:
    imported = Path(sys.argv[3])
    evals = [json.loads((Path(run).parent / f).read_text()) for f in ("eval_test.json", "eval_imported.json")]
    keys = ("loss", "bpb", "token_ppl", "word_ppl", "tokens", "bytes", "words")
    result["eval_imported_minus_run"] = {k: evals[1][k] - evals[0][k] for k in keys}
    analyses = [json.loads((Path(r) / "analysis" / "redundancy.json").read_text()) for r in (run, imported)]
    result["redundancy_identical"] = analyses[0].get("blocks") == analyses[1].get("blocks")
result["environment"] = host.environment()
print(json.dumps(result, indent=2))
