"""A real serving loop that knows nothing of stallscope: HF transformers' continuous batching.

Run as a script (never imported by stallscope, and it imports nothing of
ours): a tiny Llama built from a config (random weights, nothing
downloaded), requests given as token ids (no tokenizer), served by
transformers' own continuous-batching manager: its generation thread,
scheduler, paged KV cache and sampling. Two ways to send requests:
`generate_batch` with all of them at once (default), or `--serve-seconds S
--rate R` arrivals at R requests/s through the manager's add_request, as a
server would (the loop idles between them). `--gc-pressure` builds a heap of
reference cycles on the main thread meanwhile, so gen-2 passes run during
steps, on another thread than the step's. Prints one JSON line: requests,
finished, tokens, the collections per generation between the script's start
and end, that window's CLOCK_MONOTONIC edges and, with arrivals, each request's
own times (arrival, first and last token: CLOCK_MONOTONIC) and tokens. Exit status 0 when every
request finished (else 1); --exit-status N replaces a success (to check
that it passes through a wrapper). Needs the `engines` extra.
"""

import argparse
import gc
import json
import random
import sys
import threading
import time

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

MAX_PER_BATCH = 16


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def batching_config():
    # Sized by hand: on a CPU the manager cannot measure free device memory.
    return ContinuousBatchingConfig(
        page_size=32, num_blocks=128, max_batch_tokens=256, max_requests_per_batch=MAX_PER_BATCH
    )


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(4, 40))] for _ in range(n)]


def pressure(stop):
    """Tracked objects kept alive in cycles: collections of every generation
    run on this thread while the generation thread steps."""
    keep = []
    while not stop.is_set():
        node = {"x": []}
        node["x"].append(node)
        keep.append(node)
        if len(keep) > 150_000:
            del keep[:75_000]
        if len(keep) % 1000 == 0:
            time.sleep(0.001)  # leave the GIL to the generation thread


def gc_window_edge():
    """(monotonic ns, gc.get_stats()) read with the collector paused, so no
    pass can fall between the two reads."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return time.monotonic_ns(), gc.get_stats()
    finally:
        if enabled:
            gc.enable()


def serve(model, config, requests, rate, new_tokens):
    """Requests arriving at `rate`/s (exponential gaps), as a server sees them."""
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=batching_config()
    )
    manager.start()
    rng = random.Random(1)
    outputs = {}
    arrivals = {}  # request id -> CLOCK_MONOTONIC ns just before add_request
    try:
        for prompt in requests:
            t = time.monotonic_ns()
            rid = manager.add_request(prompt, max_new_tokens=new_tokens, record_timestamps=True)
            arrivals[rid] = t
            time.sleep(rng.expovariate(rate))
        while len(outputs) < len(requests):
            out = manager.get_result(timeout=60)
            if out is None:
                break
            outputs[out.request_id] = out
    finally:
        manager.stop(block=True, timeout=10)
    for rid, out in outputs.items():
        out.arrival_ns = arrivals.get(rid)
    return outputs


def request_times(outputs):
    """Per request, the engine's own clock (CLOCK_MONOTONIC ns: time.perf_counter
    is that clock on Linux): arrival, first and last token, tokens."""
    out = {}
    for rid, o in outputs.items():
        stamps = getattr(o, "timestamps", None) or []
        out[rid] = {
            "arrival_ns": getattr(o, "arrival_ns", None),
            "first_token_ns": round(stamps[0] * 1e9) if stamps else None,
            "last_token_ns": round(stamps[-1] * 1e9) if stamps else None,
            "tokens": len(o.generated_tokens),
        }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=24, help="generate_batch mode")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--serve-seconds", type=float, default=0.0, help="arrivals mode")
    parser.add_argument("--rate", type=float, default=8.0, help="arrivals per second")
    parser.add_argument("--gc-pressure", action="store_true")
    parser.add_argument("--exit-status", type=int, default=None)
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="intra-op threads (2+: an OpenMP pool)"
    )
    args = parser.parse_args(argv)
    window_start_ns, stats_before = gc_window_edge()
    torch.set_num_threads(args.torch_threads)
    model = tiny_llama()
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    n = round(args.rate * args.serve_seconds) if args.serve_seconds > 0 else args.requests
    requests = prompts(n)
    stop = threading.Event()
    helper = threading.Thread(target=pressure, args=(stop,), daemon=True)
    if args.gc_pressure:
        helper.start()
    try:
        if args.serve_seconds > 0:
            outputs = serve(model, config, requests, args.rate, args.max_new_tokens)
        else:
            outputs = model.generate_batch(
                inputs=requests,
                generation_config=config,
                continuous_batching_config=batching_config(),
                progress_bar=False,
            )
    finally:
        stop.set()
        if helper.is_alive():
            helper.join()
    window_end_ns, stats_after = gc_window_edge()
    finished = [o for o in outputs.values() if len(o.generated_tokens) == args.max_new_tokens]
    summary = {
        "requests": n,
        "finished": len(finished),
        "tokens": sum(len(o.generated_tokens) for o in outputs.values()),
        # What a tracer must have seen between the two edges, exactly.
        "gc_collections": [
            b["collections"] - a["collections"]
            for a, b in zip(stats_before, stats_after, strict=True)
        ],
        "window_ns": [window_start_ns, window_end_ns],
    }
    if args.serve_seconds > 0:
        summary["per_request"] = request_times(outputs)
    print(json.dumps(summary), flush=True)
    if len(finished) != n:
        return 1
    return args.exit_status if args.exit_status is not None else 0


if __name__ == "__main__":
    sys.exit(main())
