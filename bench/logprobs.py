"""Log-probs and entropy from logits: chunked (ours) against log_softmax over the whole logits.

B=8, T=1,024, V=49,152 (the embedded model's vocabulary), float32, forward only. Peak extra
memory is each variant's growth of the process's peak RSS over the logits alone, measured in a
fresh subprocess per variant so one cannot hide the other's peak. REPS subprocesses per
variant, alternating; each reports its peak and its best time of 3 calls, and the rows give the
median and spread over the subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import Result, machine, report

CHILD = r"""
import json, resource, sys, time, torch
from grpo.scoring.kernels import token_logprobs_and_entropy
variant, B, T, V = sys.argv[1], *map(int, sys.argv[2:5])
torch.manual_seed(0)
logits = torch.randn(B, T, V)
labels = torch.randint(0, V, (B, T))
def naive():
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, labels[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
def ours():
    return token_logprobs_and_entropy(logits, labels)
fn = naive if variant == "naive" else ours
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    t0 = time.perf_counter(); logp, ent = fn(); first = time.perf_counter() - t0
    times = []
    for _ in range(2):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
torch.save({"logp": logp, "ent": ent}, sys.argv[5])
print(json.dumps({"seconds": min(times + [first]), "extra_mb": (peak - base) / 1024,
                  "logits_mb": logits.numel() * 4 / 2**20}))
"""


def _child(variant: str, shape: tuple[int, int, int], out: str) -> dict:
    cmd = [sys.executable, "-c", CHILD, variant, *map(str, shape), out]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


REPS = 3
SCENARIO = (
    "log-prob of the labels plus entropy from float32 logits, forward only, one fresh "
    "subprocess per measurement; baseline: torch.log_softmax over the whole logits, "
    "gather and entropy from the same log-softmax, what a user writes by default"
)


def run(quick: bool = False) -> list[Result]:
    import tempfile

    import torch

    shape = (2, 128, 4096) if quick else (8, 1024, 49152)
    runs: dict[str, list[dict]] = {"naive": [], "ours": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(REPS):  # alternating: drift in the machine's state favours neither
            for variant in runs:
                runs[variant].append(_child(variant, shape, f"{tmp}/{variant}.pt"))
        a, b = torch.load(f"{tmp}/naive.pt"), torch.load(f"{tmp}/ours.pt")
    naive, ours = runs["naive"], runs["ours"]
    # 1e-5 absolute for the log-probs; relative for the entropy, whose values are ~log V
    # (~10.8), where one float32 ulp is already ~1e-6
    logp_diff = float((a["logp"] - b["logp"]).abs().max())
    ent_diff = float(((a["ent"] - b["ent"]).abs() / a["ent"].abs().clamp(min=1.0)).max())
    if logp_diff > 1e-5 or ent_diff > 1e-5:  # a faster wrong answer is no result
        raise RuntimeError(f"ours differs from log_softmax + gather: logp {logp_diff:.2e}, "
                           f"entropy (relative) {ent_diff:.2e}")  # fmt: skip
    note = (f"B,T,V={shape}; logits {naive[0]['logits_mb']:.0f} MB; max |diff| logp "
            f"{logp_diff:.2e}, entropy (relative) {ent_diff:.2e}; "
            f"{REPS} subprocesses each")  # fmt: skip
    m = machine()
    scenario = f"B,T,V={shape}: {SCENARIO}"
    return [
        # at least 1 MB: an extra peak below the allocator's granularity reads as 1 MB
        report(Result.of("logprobs_peak_extra_memory", "MB", [r["extra_mb"] for r in naive],
                         [max(r["extra_mb"], 1.0) for r in ours], "baseline/ours", 2.0, m,
                         f"{scenario}; peak resident growth over the logits", note, quick)),
        report(Result.of("logprobs_time", "s", [r["seconds"] for r in naive],
                         [r["seconds"] for r in ours], "baseline/ours", 1.0, m,
                         f"{scenario}; best of 3 calls per subprocess", note, quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
