"""All CPU benchmarks: `python -m bench.run_all` (`--quick` for a fast smoke run)."""

import sys

from bench import e2e, logprobs, overlap, padding, transport, weight_sync

if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(f"{'benchmark':<34} {'baseline':>12} {'ours':>12} unit")
    results = []
    for bench in (transport, logprobs, padding, weight_sync, overlap, e2e):
        results += bench.run(quick)
    print(f"{sum(r.met for r in results)} of {len(results)} targets met")
