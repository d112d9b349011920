"""All CPU benchmarks: `python -m bench.run_all` (`--quick` for a fast smoke run, `--only NAME`
for one of them).

The vLLM rows need vLLM installed (scripts/setup.sh --dev or --vllm)."""

import argparse

from bench import (
    continuous,
    e2e,
    e2e_vs_trl,
    hostile,
    logprobs,
    overlap,
    padding,
    recovery,
    transport,
    vllm,
    weight_delta,
    weight_fanout,
    weight_stream,
    weight_sync,
)
from grpo.runtime.host_memory import keep_freed_memory

# name -> module, in the order of the table; each module's run(quick) returns its rows
BENCHMARKS = {
    "transport": transport,
    "logprobs": logprobs,
    "padding": padding,
    "weight_sync": weight_sync,
    "weight_stream": weight_stream,
    "weight_delta": weight_delta,
    "weight_fanout": weight_fanout,
    "overlap": overlap,
    "e2e": e2e,
    "e2e_vs_trl": e2e_vs_trl,
    "continuous": continuous,
    "recovery": recovery,
    "hostile": hostile,
    "vllm": vllm,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.run_all")
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's)")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append",
                        help="run this benchmark only (repeatable)")  # fmt: skip
    args = parser.parse_args()
    keep_freed_memory()  # as the workers do: the in-process benchmarks time the same kernels
    print(f"{'benchmark':<34} {'baseline':>12} {'ours':>12} unit")
    results = []
    for name in args.only or BENCHMARKS:
        results += BENCHMARKS[name].run(args.quick)
    print(f"{sum(r.met for r in results)} of {len(results)} targets met")
