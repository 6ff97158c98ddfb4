"""A real vLLM V1 engine on CPU for the tests and `make demo DEMO_ENGINE=vllm`: no stallscope import.

Run it under `stallscope run --preset vllm -- python vllm_engine.py ...`:
vLLM's CPU build (the `vllm` extra) with random weights from a small
LlamaConfig saved to a temporary folder (`load_format="dummy"`, nothing
downloaded, no tokenizer), generating `--requests` x `--max-tokens` tokens
through the real scheduler, engine-core process and multiprocess worker.
It prints one JSON line: requests, tokens, wall time and the worker's forced
GC passes.

`--gc-at-execute N,M` forces a full collection inside the worker's N-th,
M-th, ... `execute_model` RPC (the model's execute path: the engine core
waits for it); `--gc-while-idle N,...` forces one in the worker right after
its N-th `sample_tokens` RPC returned, before it reads the next RPC (the
worker idle). Both go through `worker_extension_cls` (this module's
`WorkerHooks`, imported by the worker from this file's folder) and a heap
of live container objects built after vLLM's gc.freeze(), sized so that a
pass takes at least `--gc-min-ms`. The script is importable (the worker
imports it): everything runs under `if __name__ == "__main__":`.
"""

import argparse
import gc
import json
import os
import tempfile
import time


class WorkerHooks:
    """Methods vLLM adds to its worker (worker_extension_cls); set up by
    `collective_rpc("stallscope_demo_hooks", ...)` from the caller."""

    def stallscope_demo_hooks(self, at_execute, while_idle, min_ms):
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        state = {"execute": 0, "sample": 0, "idle_due": False, "passes": []}
        keep = []  # a heap of live cycles, built once, that every full pass walks
        while True:
            t0 = time.perf_counter()
            gc.collect()
            ms = (time.perf_counter() - t0) * 1e3
            if ms >= min_ms or len(keep) > 4_000_000:
                break
            for _ in range(100_000):
                node = []
                node.append(node)
                keep.append(node)
        state["keep"] = keep

        def collect(where):
            t0 = time.perf_counter()
            gc.collect()
            state["passes"].append((where, round((time.perf_counter() - t0) * 1e3, 1)))

        execute_model, sample_tokens = self.execute_model, self.sample_tokens

        def execute(scheduler_output, *args, **kwargs):
            state["execute"] += 1
            if state["execute"] in at_execute:
                collect("execute")
            return execute_model(scheduler_output, *args, **kwargs)

        def sample(*args, **kwargs):
            out = sample_tokens(*args, **kwargs)
            state["sample"] += 1
            if state["sample"] in while_idle:
                state["idle_due"] = True  # after this RPC's output is sent
            return out

        dequeue = MessageQueue.dequeue

        def dequeue_then(queue, *args, **kwargs):
            if state["idle_due"]:
                state["idle_due"] = False
                collect("idle")
            return dequeue(queue, *args, **kwargs)

        # Instance attributes: WorkerProc looks the RPC's method up on the worker.
        self.execute_model, self.sample_tokens = execute, sample
        MessageQueue.dequeue = dequeue_then
        self._stallscope_demo = state
        return {"heap_objects": len(keep), "probe_ms": round(ms, 1)}

    def stallscope_demo_passes(self):
        return self._stallscope_demo["passes"]


def _counts(text):
    return {int(x) for x in text.split(",") if x.strip()} if text else set()


def _engine_times(output):
    """[caller's id, queued, first token, last token] in ns, from vLLM's
    RequestStateStats (None where it kept none)."""
    m = getattr(output, "metrics", None)
    keys = ("queued_ts", "first_token_ts", "last_token_ts")
    if m is None or not all(getattr(m, k, 0) for k in keys):
        return [output.request_id, None, None, None]
    return [output.request_id, *(int(getattr(m, k) * 1e9) for k in keys)]


def _abort_mid_way(llm, prompts, max_tokens):
    """Requests added to the engine and aborted once each has a few tokens,
    as an API server aborts when its client goes (vLLM's own abort path)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=4 * max_tokens, ignore_eos=True, detokenize=False)
    ids = [f"abort-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    got = dict.fromkeys(ids, 0)
    while engine.has_unfinished_requests() and min(got.values()) < 3:
        for out in engine.step():
            got[out.request_id] = len(out.outputs[0].token_ids)
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return [[rid, n] for rid, n in got.items()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1, help="generate() calls, one after another")
    parser.add_argument("--gc-at-execute", default="", help="execute_model RPC numbers (1-based)")
    parser.add_argument("--gc-while-idle", default="", help="sample_tokens RPC numbers (1-based)")
    parser.add_argument("--gc-min-ms", type=float, default=25.0)
    parser.add_argument(
        "--abort", type=int, default=0, help="then this many more requests, aborted mid-way"
    )
    args = parser.parse_args()

    here = os.path.dirname(os.path.abspath(__file__))
    # The worker (a spawned process) imports WorkerHooks from this folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), here) if p)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers import LlamaConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    hooks = bool(args.gc_at_execute or args.gc_while_idle)
    with tempfile.TemporaryDirectory(prefix="stallscope-vllm-") as model_dir:
        LlamaConfig(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ).save_pretrained(model_dir)
        llm = LLM(
            model=model_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=512,
            seed=0,
            # vLLM's own per-request timestamps (RequestOutput.metrics: the
            # engine core's monotonic clock), which the tests hold ours to
            disable_log_stats=False,
            worker_extension_cls=f"{os.path.splitext(os.path.basename(__file__))[0]}.WorkerHooks"
            if hooks
            else None,
        )
        setup = None
        if hooks:
            setup = llm.collective_rpc(
                "stallscope_demo_hooks",
                args=(_counts(args.gc_at_execute), _counts(args.gc_while_idle), args.gc_min_ms),
            )[0]
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
        prompts = [
            TokensPrompt(
                prompt_token_ids=[(7 * r + i) % 500 + 1 for i in range(args.prompt_tokens)]
            )
            for r in range(args.requests)
        ]
        t0 = time.monotonic_ns()
        outputs = []
        for _ in range(args.rounds):
            outputs += llm.generate(prompts, params, use_tqdm=False)
        t1 = time.monotonic_ns()
        aborted = _abort_mid_way(llm, prompts[: args.abort], args.max_tokens) if args.abort else []
        passes = llm.collective_rpc("stallscope_demo_passes")[0] if hooks else []
        del llm  # shuts the engine-core and worker processes down
    summary = {
        "requests": len(outputs),
        "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        # the caller's request ids and each one's tokens (the engine core
        # keys a request by the caller's id plus a suffix of its own)
        "per_request": [[o.request_id, len(o.outputs[0].token_ids)] for o in outputs],
        # vLLM's own clock per request (CLOCK_MONOTONIC ns, the engine
        # core's): queued at the scheduler, first and last token output
        "engine_times": [_engine_times(o) for o in outputs],
        "window_ns": [t0, t1],
        "generate_s": round((t1 - t0) / 1e9, 3),
        "worker_gc": passes,
        "aborted": aborted,  # [[caller's id, tokens it had got]]
        "hooks": setup,
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
