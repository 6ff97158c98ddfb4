"""A real serving loop that knows nothing of stallscope: HF transformers' continuous batching.

A tiny Llama built from a config (random weights, nothing downloaded),
requests given as token ids (no tokenizer), served by transformers' own
continuous-batching manager: its generation thread, scheduler, paged cache
and sampling. Arguments: --requests N, --max-new-tokens N, --gc-pressure
(build a heap of tracked objects in the main thread while requests run, so
gen-2 passes happen during steps). Prints one JSON line: requests asked,
finished, tokens generated,
the collections per generation between the script's start and its end and
that window's CLOCK_MONOTONIC edges. Exits 0 when every request finished, else 1;
--exit-status overrides a success (to check that it passes through).
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
    model = LlamaForCausalLM(config).eval()
    return model


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(4, 40))] for _ in range(n)]


def pressure(stop):
    """Tracked objects kept alive in cycles: collections of every generation run
    on this thread while the generation thread steps."""
    keep = []
    while not stop.is_set():
        node = {"x": []}
        node["x"].append(node)
        keep.append(node)
        if len(keep) > 200_000:
            del keep[:100_000]
        if len(keep) % 5000 == 0:
            time.sleep(0.001)


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


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--gc-pressure", action="store_true")
    parser.add_argument("--exit-status", type=int, default=None)
    args = parser.parse_args(argv)
    window_start_ns, stats_before = gc_window_edge()
    torch.set_num_threads(1)
    model = tiny_llama()
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=0,
    )
    stop = threading.Event()
    helper = threading.Thread(target=pressure, args=(stop,), daemon=True)
    if args.gc_pressure:
        helper.start()
    try:
        outputs = model.generate_batch(
            inputs=prompts(args.requests),
            generation_config=config,
            # Sized by hand: on a CPU the manager cannot measure free memory.
            continuous_batching_config=ContinuousBatchingConfig(
                page_size=32, num_blocks=64, max_batch_tokens=256, max_requests_per_batch=16
            ),
            progress_bar=False,
        )
    finally:
        stop.set()
        if helper.is_alive():
            helper.join()
    window_end_ns, stats_after = gc_window_edge()
    finished = [o for o in outputs.values() if len(o.generated_tokens) == args.max_new_tokens]
    summary = {
        "requests": args.requests,
        "finished": len(finished),
        "tokens": sum(len(o.generated_tokens) for o in outputs.values()),
        # Collections per generation between the two edges, and the edges
        # (CLOCK_MONOTONIC ns): what a tracer must have seen, exactly.
        "gc_collections": [
            b["collections"] - a["collections"]
            for a, b in zip(stats_before, stats_after, strict=True)
        ],
        "window_ns": [window_start_ns, window_end_ns],
    }
    print(json.dumps(summary), flush=True)
    if len(finished) != args.requests:
        return 1
    return args.exit_status if args.exit_status is not None else 0


if __name__ == "__main__":
    sys.exit(main())
