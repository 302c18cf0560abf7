"""Native llama.cpp on the same GGUF and prompts (optional extra rows in the benchmark): run with a
Python that has `llama-cpp-python` installed, e.g.
    $PYSHIM_LLAMA_CPP_PYTHON bench_llamacpp.py MODEL WORKLOAD.json --threads 2
WORKLOAD.json is bench.py's list of prompts ({name, text, max_tokens, decode}). Prints one JSON object
with the same figure names as bench_engines.py. Greedy, CPU only; prefill is one eval of the prompt,
decode is timed token by token after the first (which the prefill's logits give)."""

from __future__ import annotations

import argparse
import json
import time

N_CTX = 1024


def measure(model: str, workload: list[dict], threads: int) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                n_batch=512, verbose=False)
    sample: dict = {"load_ms": 1e3 * (time.perf_counter() - t0), "threads": threads}
    for prompt in workload:
        llm.reset()
        ids = llm.tokenize(prompt["text"].encode("utf-8"), add_bos=True, special=False)
        t0 = time.perf_counter()
        llm.eval(ids)
        token = llm.sample(temp=0.0)
        prefill_s = time.perf_counter() - t0
        sample[f"prompt_{prompt['name']}_tokens"] = len(ids)
        sample[f"prefill_{prompt['tokens']}_tok_s"] = len(ids) / prefill_s
        if not prompt.get("decode"):
            continue
        sample["ttft_ms"] = 1e3 * prefill_s
        out = [token]
        t0 = time.perf_counter()
        for _ in range(prompt["max_tokens"] - 1):
            llm.eval([token])
            token = llm.sample(temp=0.0)
            out.append(token)
        decode_s = time.perf_counter() - t0
        sample["decode_tokens"] = len(out)
        sample["decode_tok_s"] = (len(out) - 1) / decode_s if decode_s > 0 else None
        sample["text"] = llm.detokenize(out).decode("utf-8", errors="replace")
    return sample


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("workload")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with open(args.workload, encoding="utf-8") as f:
        print(json.dumps(measure(args.model, json.load(f), args.threads)))
