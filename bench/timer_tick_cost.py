"""What one more timer interrupt per CPU costs a torch engine: the CPU sampler's clock alone.

HF transformers' continuous batching on a tiny random-weight Llama (torch
CPU, 1 thread: the engine of bench/transformers_overhead.py), each busy
step's CPU time (`thread_time`) taken in rounds of 48 requests x 24 tokens,
alternating, round by round, between no perf event and a software cpu-clock
perf event on every CPU at HZ with an empty BPF program attached (what the
CPU sampler attaches, without its work: `cpu_sample_hz`). Prints the median
of round medians of each arm. Root (bcc). It measures; it asserts nothing.

    .venv/bin/python bench/timer_tick_cost.py [ROUNDS] [HZ]
"""

import statistics
import sys
import time

import torch
from bcc import BPF, PerfSWConfig, PerfType
from transformers import GenerationConfig
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

from stallscope.demo import transformers_engine as eng


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    hz = float(sys.argv[2]) if len(sys.argv) > 2 else 1000.0
    torch.set_num_threads(1)
    model = eng.tiny_llama()
    config = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=-1, pad_token_id=0)
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=eng.batching_config()
    )
    prompts = eng.prompts(48)
    times = []
    orig = ContinuousBatchingManager._generation_loop_body

    def timed(self, bp, bootstrapping):
        before = self.current_batch
        c0 = time.thread_time_ns()
        r = orig(self, bp, bootstrapping)
        c1 = time.thread_time_ns()
        if self.current_batch != before:  # a forward ran: a busy step
            times.append(c1 - c0)
        return r

    ContinuousBatchingManager._generation_loop_body = timed
    manager.start()

    def one_round():
        ids = [manager.add_request(p, max_new_tokens=24) for p in prompts]
        for _ in ids:
            manager.get_result(timeout=60)

    one_round()  # warm-up
    prog = BPF(text="int on_sample(void *ctx) { return 0; }")
    res = {"no timer": [], f"cpu-clock at {hz:g} Hz": []}
    for r in range(rounds):
        for on in (False, True) if r % 2 else (True, False):
            if on:
                prog.attach_perf_event(
                    ev_type=PerfType.SOFTWARE,
                    ev_config=PerfSWConfig.CPU_CLOCK,
                    fn_name=b"on_sample",
                    sample_period=int(1e9 / hz),
                    cpu=-1,
                )
            del times[:]
            one_round()
            res[list(res)[on]].append(statistics.median(times) / 1e3)
            if on:
                prog.detach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK)
    manager.stop(block=True)
    base = statistics.median(res["no timer"])
    for name, v in res.items():
        m = statistics.median(v)
        print(
            f"{name:24s} busy step CPU {m:7.1f} us ({100 * (m / base - 1):+.1f} %), rounds {[round(x) for x in v]}"
        )


if __name__ == "__main__":
    main()
