"""All CPU benchmarks: `python -m bench.run_all` (`--quick` for a fast smoke run).

The vLLM rows need vLLM installed (scripts/setup.sh --dev or --vllm)."""

import sys

from bench import e2e, logprobs, overlap, padding, recovery, transport, vllm, weight_sync

if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(f"{'benchmark':<34} {'baseline':>12} {'ours':>12} unit")
    results = []
    for bench in (transport, logprobs, padding, weight_sync, overlap, e2e, recovery, vllm):
        results += bench.run(quick)
    print(f"{sum(r.met for r in results)} of {len(results)} targets met")
