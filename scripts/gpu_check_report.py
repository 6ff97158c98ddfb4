"""Prints what scripts/gpu_check.py measured, one section per check; the
figures themselves go to gpu_check.json. Reads the result dict only."""


def report(res):
    print("\nNVML call latency (GPU 0), microseconds:")
    for name, r in res["call_latency"].items():
        if r["median_us"] is None:
            print(f"  {name:46s} failed: {r['error']}")
        else:
            print(
                f"  {name:46s} median {r['median_us']:8.1f}  p99 {r['p99_us']:8.1f}  "
                f"max {r['max_us']:8.1f}  errors {r['errors']}  not_found {r['not_found']}"
            )
    print("\ndriver sample buffers (GPU 0):")
    for label, b in res["buffers"].items():
        print(f"  {label:16s} {b}")
    print(f"\nfield-value timestamps: {res['field_timestamp_clock']}")
    c = res["calibration"]
    print(f"\nbuffer clock calibration: {c['sync']}")
    print(
        f"  buffer SM clock median {c['buffer_sm_clock_median_mhz']} MHz vs polled "
        f"{c['poll_sm_clock_mhz']} MHz; buffer read every {c['buffer_poll_s_chosen']:.3f} s"
    )
    p = res["poll_rate"]
    print(
        f"\nsampler: flat out {p['flat_out']['polls_per_s']:.0f} polls/s of {p['flat_out']['gpus']} "
        f"GPU(s) (median {p['flat_out']['poll_all_gpus_median_us']:.0f} us/poll); default "
        f"{p['default']['target_hz']:g} Hz achieved {p['default']['achieved_hz']:.2f} Hz, "
        f"late ticks {p['default']['late_ticks']}"
    )
    m = res["matmul"]
    if not m["run"]:
        print(f"\nmatmul: {m['why']}")
        return
    print(f"\nmatmul on {m['device']}, sampler in {m['sampler']}, {m['block_s']:g} s blocks:")
    for loop in ("big", "small"):
        print(f"  {m[loop]['step']}:")
        for cond, r in m[loop].items():
            if isinstance(r, dict):
                print(
                    f"    {cond:10s} steps {r['steps']:6d}  median {r['median_ms']:8.3f} ms  "
                    f"p99 {r['p99_ms']:8.3f} ms  max {r['max_ms']:8.3f}  "
                    f"median x{r['median_vs_off']:.4f}  p99 x{r['p99_vs_off']:.4f} of off"
                )
