"""bf16 honesty: an optimizer step DeepSpeed skips for non-finite gradients is counted, its
gradient norm is not reported as a number, and the weights do not move."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, free_port

# One real ZeRO-2 rank on gloo; a hook turns one parameter's gradient into inf for the first
# step only (what a bf16 overflow does to it).
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import deepspeed
    from grpo.config import load_config
    from grpo.core.episode import Episode, EpisodeBatch
    from grpo.models import load_causal_lm
    from grpo.trainer.engines import deepspeed_config
    from grpo.trainer.experience import build_experience
    from grpo.trainer.loop import without_deepspeed_shm_op
    from grpo.trainer.update import train_on_batch

    without_deepspeed_shm_op()  # as the trainer does on CPU: no C++ op built at start-up
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = load_config(None, ["train.num_ranks=1", "rollout.questions_per_step=1",
                             "rollout.group_size=2", "train.micro_batch_size=2"])
    model = load_causal_lm(sys.argv[1])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=deepspeed_config(cfg, 1, 2))
    poisoned = {"on": True}
    head = next(p for p in engine.module.parameters() if p.requires_grad)
    head.register_hook(lambda g: g * float("inf") if poisoned["on"] else g)
    eps = tuple(Episode(np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32),
                        np.full(2, -1.0, np.float32), np.full(2, -1.0, np.float32),
                        float(i), {}, "stop", 0) for i in range(2))
    batch = EpisodeBatch(eps, 2, policy_version=0, seq=0)
    exp, _ = build_experience(batch, cfg, 0.0)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    first = train_on_batch(engine, exp, cfg, pad_id=0)
    unchanged = all(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    skipped_first = engine.skipped_steps
    poisoned["on"] = False
    second = train_on_batch(engine, exp, cfg, pad_id=0)
    print("RESULT " + json.dumps({"skipped_first": skipped_first, "unchanged": unchanged,
                                  "first": first, "second": second,
                                  "skipped_after": engine.skipped_steps}))
    """
)


@pytest.mark.slow
def test_a_non_finite_gradient_skips_the_step_and_is_counted(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_model_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    assert r["skipped_first"] == 1 and r["unchanged"]
    assert "grad_norm" not in r["first"]  # not a number this step: left out, not NaN
    assert r["skipped_after"] == 1 and r["second"]["grad_norm"] > 0  # the next step applies
