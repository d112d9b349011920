"""vLLM backend: new weights loaded into the running engine vs a fresh engine, and generation
tokens/s of vLLM vs HF generate on the same GSM8K prompts (n answers each, same sampling).

Both use the embedded SmolLM2-135M in float32 (--quick, the suite's smoke run: the tiny random
model). HF generates all sequences in one batch (its best case here); vLLM schedules them
itself. Engine start-up is excluded from tokens/s and reported in the notes. Skipped (no rows)
where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path

from bench.common import REPO, Result, machine, quiet_hf, report


def _perturbed_copy(model, tokenizer, dest: Path, seed: int) -> Path:
    """A version dir as the trainer publishes it, with different weights."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3 * p.std())
    model.save_pretrained(dest, save_original_format=False)
    tokenizer.save_pretrained(dest)
    return dest


def run(quick: bool = False) -> list[Result]:
    if importlib.util.find_spec("vllm") is None:
        print("vllm: not installed (bash scripts/setup.sh --vllm), skipped")
        return []
    from grpo.config import load_config
    from grpo.models.convert import ensure_embedded_base
    from grpo.models.loading import load_causal_lm, load_tokenizer
    from grpo.rollout.base import Sampling
    from grpo.rollout.hf import HFRollout
    from grpo.rollout.vllm import VllmRollout
    from grpo.tasks import get_task
    from grpo.tasks.encoding import encode_prompts
    from grpo.weights.version import Version
    from tests.tiny_model import build_tiny_model

    quiet_hf()
    questions, n, new_tokens = (2, 2, 16) if quick else (16, 4, 128)
    cfg = load_config(
        REPO / "configs" / "cpu_demo.yaml",
        [f"rollout.max_new_tokens={new_tokens}", "rollout.backend=vllm", "eval.interval=0"]
        # quick (the test suite): no compilation, so the two engine starts take ~30 s, not ~80
        + ["rollout.vllm.enforce_eager=true"] * quick,
    )
    scratch = tempfile.TemporaryDirectory()
    base = ensure_embedded_base()
    if quick:
        base = build_tiny_model(Path(scratch.name) / "tiny", base, heads=2)
    tokenizer = load_tokenizer(base)
    task = get_task("gsm8k")
    rows = task.load(str(REPO / task.default_test))[:questions]
    prompts = [p.ids for p in encode_prompts(task, rows, tokenizer, cfg.data.system_prompt, 512)]
    # HF in one batch of every sequence (its best case); vLLM schedules its own
    sampling = Sampling(n=n, max_new_tokens=new_tokens, temperature=cfg.rollout.temperature,
                        batch_size=len(prompts) * n)  # fmt: skip

    hf = HFRollout(load_causal_lm(base).eval(), tokenizer)
    t0 = time.perf_counter()
    engine = VllmRollout(cfg, base)
    start_s = time.perf_counter() - t0
    try:
        rates: dict[str, float] = {"hf": 0.0, "vllm": 0.0}
        for _ in range(1 if quick else 2):  # alternate, best of each
            for name, rollout in (("hf", hf), ("vllm", engine)):
                t0 = time.perf_counter()
                gens = rollout.generate(prompts, sampling)
                tokens = sum(len(g.completion_ids) for g in gens)
                rates[name] = max(rates[name], tokens / (time.perf_counter() - t0))

        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp, policy = Path(tmp_dir), load_causal_lm(base)
            in_place = float("inf")
            for version in range(1, 3 if quick else 4):
                vdir = _perturbed_copy(policy, tokenizer, tmp / f"v{version:06d}", version)
                t0 = time.perf_counter()
                assert engine.load(Version.from_dir(vdir, version)) == "in place"
                in_place = min(in_place, time.perf_counter() - t0)
            if quick:  # the suite's smoke run: the first start stands in for a restart
                restart = start_s  # (tests/test_vllm.py restarts an engine on a hung reload)
            else:
                engine.cfg.rollout.vllm.reload = "restart"
                vdir = _perturbed_copy(policy, tokenizer, tmp / "v000009", 9)
                t0 = time.perf_counter()
                assert engine.load(Version.from_dir(vdir, 9)) == "restart"
                restart = time.perf_counter() - t0
    finally:
        engine.close()
        scratch.cleanup()
    mb = sum(p.numel() * p.element_size() for p in policy.parameters()) / 1e6
    restart_is = "the first start (--quick)" if quick else "shut down + start from the version dir"
    sizes = f"{len(prompts)} GSM8K prompts x {n} answers, {new_tokens} new tokens"
    # targets (our choice; the issue sets none): a reload at least 10x cheaper than a
    # restart, and vLLM at least 2x HF generate's best batch on the same prompts
    return [
        report(
            Result.of(
                "vllm_reload_in_place_vs_restart",
                "s",
                [restart],
                [in_place],
                "baseline/ours",
                10.0,
                machine(),
                f"{mb:.0f} MB float32 weights of the embedded model loaded into a running vLLM "
                "engine in place (best of 3), one measurement; baseline: shutting the engine "
                "down and starting a new one from the version dir, what a user without "
                "in-place reload does",
                f"{mb:.0f} MB float32 weights; restart = {restart_is}",
                quick,
            )
        ),  # fmt: skip
        report(
            Result.of(
                "vllm_vs_hf_generation_tokens_per_s",
                "tokens/s",
                [rates["hf"]],
                [rates["vllm"]],
                "ours/baseline",
                2.0,
                machine(),
                f"{sizes}, temperature 0.8, one measurement each; ours: vLLM (engine start "
                "excluded); baseline: HF generate given every sequence in one batch, what a "
                "user runs without vLLM",
                f"{sizes}; HF in one batch of {len(prompts) * n}; vLLM engine start "
                f"{start_s:.0f} s, excluded",
                quick,
            )
        ),  # fmt: skip
    ]


if __name__ == "__main__":
    run("--quick" in __import__("sys").argv)
