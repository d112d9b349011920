"""bf16 honesty: an optimizer step DeepSpeed skips for non-finite gradients is counted, its
gradient norm is not reported as a number, and the weights do not move; in fp32 and in bf16.

The two dtypes reach the skip by different code in DeepSpeed's ZeRO-1/2 optimizer
(DeepSpeedZeroOptimizer.step, DeepSpeed 0.19), and the test records which one fired:

- fp32: no overflow check runs (check_grad_overflow is False without fp16/bf16); the global
  gradient norm comes out inf or NaN and `is_invalid_grad_norm` marks the step overflowed.
- bf16: that norm test is switched off for bf16 (`self.dtype != torch.bfloat16 or
  self.check_grad_overflow`); the step is skipped only by `check_overflow` ->
  `has_overflow`, which scans the gradient partitions for inf/NaN before any norm is taken,
  and only while the engine's bf16 section keeps `check_grad_overflow` (its default, True).
  With it off, bf16 applies the non-finite step (the weights turn NaN).

Either way the optimizer sets `overflow`, zeroes the gradients and returns; the engine's
`_take_model_step` counts it in `engine.skipped_steps` and `get_global_grad_norm()` is inf.
The trainer reads both: `update` (grpo/trainer/step.py) leaves the norm out of the
step's metrics, and the trainer's step reads `skipped_steps` of each engine before and after
the update and turns the difference into a warning and the `policy_steps_skipped` metric.

bf16 runs on CPU here: DeepSpeed's CPU accelerator supports it, the model's parameters and
gradients are bf16 and the optimizer keeps fp32 master partitions. A bf16 "overflow" is an
inf or NaN in a bf16 gradient (bf16 has fp32's exponent range, so what overflows one
overflows the other); a hook puts one into the gradient of the embedding, in the dtype the
backward produced, for the first step only. The loss itself stays finite, as it does when
only the backward overflows (a non-finite loss is refused earlier, by grpo.trainer.step).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# The trainer's own start-up and engine: join_trainer_world (a world of one over an
# in-process store, gloo) and policy_engine with the configured dtype, then update;
# the skipped count is the engine's, which the trainer's step reads.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    from pathlib import Path
    import numpy as np
    import torch
    from grpo.config import load_config
    from grpo.core.episode import Episode, EpisodeBatch
    from grpo.trainer.engines import policy_engine
    from tests.experience import build_experience
    from grpo.trainer.process import join_trainer_world, without_deepspeed_shm_op
    from grpo.plan import plan_experience, plan_update
    from grpo.trainer.step import update

    without_deepspeed_shm_op()  # as run_trainer does on CPU
    join_trainer_world("gloo", timedelta(seconds=60))
    tiny = Path(sys.argv[1])
    eps = tuple(Episode(np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32),
                        np.full(2, -1.0, np.float32), np.full(2, -1.0, np.float32),
                        float(i), {}, "stop", 0) for i in range(2))
    out = {}
    for dtype in ("float32", "bfloat16"):
        cfg = load_config(None, [f"model.path={tiny}", f"model.dtype={dtype}", "train.lr=1e-3",
                                 "train.num_ranks=1", "rollout.questions_per_step=1",
                                 "rollout.group_size=2", "train.micro_batch_size=2"])
        engine, _ = policy_engine(cfg, tiny, 1)
        opt, fired = engine.optimizer, []

        def spy(name, check):  # which of DeepSpeed's two checks ran, and what it found
            original = getattr(opt, name)
            def wrapped(*args, **kwargs):
                value = original(*args, **kwargs)
                fired.append([name, check(value)])
                return value
            setattr(opt, name, wrapped)

        spy("has_overflow", bool)
        spy("scaled_global_norm", lambda norm: bool(torch.isfinite(torch.as_tensor(norm))))
        poisoned = {"on": True}
        embed = engine.module.get_input_embeddings().weight
        grad_dtypes = []

        def overflow(g):  # the first step's gradient: inf where it was non-zero, NaN elsewhere
            grad_dtypes.append(str(g.dtype))
            return g * float("inf") if poisoned["on"] else g

        embed.register_hook(overflow)
        batch = EpisodeBatch(eps, 2, policy_version=0, seq=0)
        exp, _ = build_experience(batch, plan_experience(cfg), 0.0)
        before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        first = update(engine, None, exp, plan_update(cfg, 1), pad_id=0)
        unchanged = all(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
        fired_first, fired[:] = list(fired), []
        skipped_first = engine.skipped_steps
        poisoned["on"] = False
        try:
            second = update(engine, None, exp, plan_update(cfg, 1), pad_id=0)
        except FloatingPointError as e:  # the first step was applied and left NaN weights
            second = {"error": str(e)}
        params = list(engine.module.named_parameters())
        out[dtype] = {
            "param_dtype": str(embed.dtype), "grad_dtypes": sorted(set(grad_dtypes)),
            "first": first, "unchanged": unchanged, "fired_first": fired_first,
            "skipped_first": skipped_first, "second": second, "fired_second": fired,
            "skipped_after": engine.skipped_steps,
            "moved": max(float((p.float() - before[n].float()).abs().max()) for n, p in params),
            "finite": all(bool(torch.isfinite(p).all()) for _, p in params),
        }
        del engine, opt
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slow
def test_a_non_finite_gradient_skips_the_step_and_is_counted(tiny_model_dir):
    # what torchrun sets for a world of one (no rendezvous: join_trainer_world needs none)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_model_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    runs = json.loads(line.removeprefix("RESULT "))
    # What DeepSpeed ran (module docstring): on the poisoned step, fp32 through the norm and
    # bf16 through the inf/NaN scan of the partitions, which skips before any norm is taken;
    # on the next step the same checks, passing.
    poisoned = {"float32": [["scaled_global_norm", False]], "bfloat16": [["has_overflow", True]]}
    clean = {"float32": [["scaled_global_norm", True]],
             "bfloat16": [["has_overflow", False], ["scaled_global_norm", True]]}  # fmt: skip
    for dtype, r in runs.items():
        want = "torch.float32" if dtype == "float32" else "torch.bfloat16"
        assert r["param_dtype"] == want and r["grad_dtypes"] == [want], (dtype, r)
        assert r["fired_first"] == poisoned[dtype], (dtype, r["fired_first"])
        assert r["skipped_first"] == 1 and r["unchanged"], (dtype, r)
        assert "grad_norm" not in r["first"], dtype  # not a number this step: left out, not NaN
        # The next, finite step applies, is not counted, and moves the weights.
        assert r["fired_second"] == clean[dtype], (dtype, r["fired_second"], r["second"])
        assert r["skipped_after"] == 1, (dtype, r)
        assert r["second"]["grad_norm"] > 0 and r["moved"] > 0 and r["finite"], (dtype, r)
