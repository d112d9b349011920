"""ZeRO-3 and CPU offload: published versions hold whole tensors, the same weights as ZeRO-2,
resume, LoRA, the critic, the partitioned reference, the trainer's evaluation in lockstep, and
the DeepSpeed settings the trainer refuses.

The DeepSpeed files under test are the shipped ones with two changes, each said where it is
made: every parameter partitioned (DeepSpeed keeps parameters under 100k elements, most of the
tiny model's, whole on every rank by default, which would leave the partitioned path
untested), and torch's AdamW in place of DeepSpeedCPUAdam (a C++ op whose first build takes
about 75 s of CPU here; both run the same offload code around the optimizer step)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from grpo.config import ConfigError, load_config
from tests.conftest import PYTHON, REPO, free_port, run_launch, transport_overrides

SHIPPED = REPO / "configs" / "deepspeed"


def shipped_deepspeed_files() -> list[Path]:
    """configs/deepspeed/*.json, at least the four the docs describe (an empty glob would make
    the tests over them pass on nothing)."""
    found = sorted(SHIPPED.glob("*.json"))
    assert {p.name for p in found} >= {"zero2.json", "zero3.json", "zero2_offload.json",
                                       "zero3_offload.json"}, found  # fmt: skip
    return found


def test_the_shipped_deepspeed_files_pass_the_checks() -> None:
    for path in shipped_deepspeed_files():
        load_config(None, [f"train.deepspeed_config={path}"])


@pytest.mark.parametrize(
    ("zero", "message"),
    [
        ({"stage": 2, "offload_param": {"device": "cpu"}},
         "zero_optimization.offload_param needs stage 3 (stage 2 keeps the whole parameters"),
        ({"stage": 1, "offload_param": {"device": "cpu"}}, "offload_param needs stage 3"),
        ({"stage": 0, "offload_optimizer": {"device": "cpu"}},
         "zero_optimization.offload_optimizer needs stage 1, 2 or 3"),
        ({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}},
         "zero_optimization.offload_param.device 'nvme' is not supported"),
        ({"stage": 4}, "zero_optimization.stage must be 0, 1, 2 or 3, got 4"),
    ],
)  # fmt: skip
def test_unsupported_deepspeed_settings_are_refused(tmp_path: Path, zero, message) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": zero}))
    with pytest.raises(ConfigError) as refused:
        load_config(None, [f"train.deepspeed_config={path}"])
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"train.deepspeed_config {path}: "), line
    assert message in line, line


def test_a_deepspeed_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text("{'stage': 3}")
    with pytest.raises(ConfigError, match=r"train.deepspeed_config: .* is not valid JSON"):
        load_config(None, [f"train.deepspeed_config={path}"])


def test_a_missing_deepspeed_file_is_left_to_the_trainer() -> None:
    # the sampler's node need not have it; the trainer says "no file" (test_integration.py)
    load_config(None, ["train.deepspeed_config=nope.json"])


def _as_tested(tmp_path: Path) -> dict[str, str]:
    """The shipped files as the tests run them (the module docstring says why); name -> path."""
    out = {}
    for name in ("zero2", "zero3", "zero2_offload", "zero3_offload"):
        ds = json.loads((SHIPPED / f"{name}.json").read_text())
        if ds["zero_optimization"]["stage"] == 3:
            ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        ds["optimizer"]["params"]["torch_adam"] = True
        out[name] = str(tmp_path / f"{name}.json")
        Path(out[name]).write_text(json.dumps(ds))
    return out


# Two gloo ranks. Each run starts from the tiny model and trains on the same two batches, as
# the trainer does: every rank scores its own group (old and reference log-probs), builds the
# whole batch's experience and trains on its rows. Rank 0 prints what the test asserts.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import deepspeed
    import numpy as np
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    from grpo.config import load_config
    from grpo.core.batching import length_order, micro_batch_ranges
    from grpo.core.episode import Episode, EpisodeBatch
    from grpo.weights.dirs import load_state_dict, publish_version, version_dir
    from grpo.models.loading import load_causal_lm, load_tokenizer
    from grpo.trainer import state as train_state
    from grpo.trainer.critic import Critic
    from grpo.trainer.engines import deepspeed_config, policy_engine, reference_model
    from grpo.eval.in_training import VersionEvaluator
    from tests.experience import build_experience
    from grpo.trainer.process import without_deepspeed_shm_op
    from grpo.weights.publisher import weights_to_publish
    from grpo.trainer.scoring import score_on_ranks
    from grpo.plan import plan_experience, plan_scoring, plan_update
    from grpo.trainer.ranks import gather_rows
    from grpo.trainer.step import update

    tiny, tmp, files = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    without_deepspeed_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    pad = load_tokenizer(tiny).pad_token_id
    initial = load_file(tiny / "model.safetensors")
    out = {}

    def config(name, *more):
        return load_config(None, [
            f"model.path={tiny}", f"output_dir={tmp}", f"train.deepspeed_config={files[name]}",
            "train.num_ranks=2", "rollout.questions_per_step=2", "rollout.group_size=2",
            "train.micro_batch_size=2", "train.lr=1e-3", "algo.kl_loss_coef=0.1",
            "train.logprobs_on=trainer", "eval.num_questions=3", "eval.max_new_tokens=8",
            "eval.samples=2", "eval.interval=1", "data.max_prompt_tokens=256",
            "data.reward=tests.rewards_for_tests:even_length_is_correct", *more])

    def batch(seq):
        rng = np.random.default_rng(seq)
        eps = tuple(Episode(rng.integers(10, 1000, 5 + i).astype(np.int32),
                            rng.integers(10, 1000, 3 + 2 * i).astype(np.int32), None, None,
                            float(i % 2), {}, "stop", i // 2) for i in range(4))
        return EpisodeBatch(eps, 2, policy_version=0, seq=seq)

    BATCHES = [batch(0), batch(1)]

    class Run:
        def __init__(self, name, *more):
            self.cfg = config(name, *more)
            torch.manual_seed(0)
            self.engine, _ = policy_engine(self.cfg, tiny, 2)
            self.ds = deepspeed_config(self.cfg, 2, self.cfg.mini_batch_seqs(2))
            self.reference = reference_model(self.cfg, tiny, self.ds, self.engine.device)
            self.scored, self.metrics = [], []

        def mine(self, seq):
            scored = score_on_ranks(self.engine.module, self.reference, BATCHES[seq],
                                    plan_scoring(self.cfg), 1, pad)
            self.scored.append(scored)
            exp, _ = build_experience(scored, plan_experience(self.cfg), 0.0)
            return exp.rows(range(2 * rank, 2 * rank + 2))

        def step(self, seq):
            plan = plan_update(self.cfg, 2)
            self.metrics.append(update(self.engine, None, self.mine(seq), plan, pad))

        def publish(self, name):  # what Trainer.publish does, every rank entering
            with weights_to_publish(self.engine, self.cfg.model.lora.enabled) as write:
                if rank == 0:
                    publish_version(tmp / name, 2, lambda d: write.write(d, "5GB"), 1, 2)
            dist.barrier()
            return version_dir(tmp / name, 2)

        def gathered(self, trainable_only=False):
            named = [(n, p) for n, p in self.engine.module.named_parameters()
                     if p.requires_grad or not trainable_only]
            with deepspeed.zero.GatheredParameters([p for _, p in named]):
                return {n: p.detach().clone() for n, p in named}

    def diffs(a, b):  # the 1024 largest |a - b| over all weights (NaN first), and how many
        assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
        d = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
        return {"top": d.sort(descending=True).values[:1024].tolist(), "n": d.numel()}

    def logp_diff(runs, key):  # per batch: the largest difference of any token's log-prob
        return [max(float(np.abs(getattr(x, key) - getattr(y, key)).max())
                    for x, y in zip(*(r.scored[seq].episodes for r in runs), strict=True))
                for seq in (0, 1)]

    # ZeRO-2, the reference.
    zero2 = Run("zero2")
    for seq in (0, 1):
        zero2.step(seq)
    v2 = load_state_dict(zero2.publish("zero2"))
    out["moved"] = diffs(v2, initial)["top"][0]
    first = {"zero2": zero2.metrics[0]}

    # ZeRO-3: every parameter a partition; the state saved after the first batch.
    zero3 = Run("zero3")
    embed = zero3.engine.module.get_input_embeddings().weight
    out["partitioned"] = embed.numel() == 0 and embed.ds_numel == initial[
        "model.embed_tokens.weight"].numel()
    fingerprint = {"world": 2}
    zero3.step(0)
    client = {"step": 1, "version": 1, "kl_reward_coef": 0.0, "ledger": {}}
    train_state.save(tmp / "state3", 1, {"policy": zero3.engine}, client, fingerprint)
    zero3.step(1)
    vdir = zero3.publish("zero3")
    v3 = load_state_dict(vdir)
    whole = zero3.gathered()
    out["files"] = sorted(p.name for p in vdir.iterdir())
    out["full_shapes"] = all(v3[k].shape == initial[k].shape for k in initial)
    out["equals_gathered"] = all(torch.equal(v3[k], whole[k]) for k in v3)
    out["diff"] = {"zero3": diffs(v3, v2)}
    first["zero3"] = zero3.metrics[0]
    out["old_logp_diff"] = logp_diff((zero2, zero3), "old_logp")
    out["ref_logp_diff"] = logp_diff((zero2, zero3), "ref_logp")

    # Resumed from the state of the first batch, it trains the second to the same weights.
    resumed = Run("zero3")
    train_state.load(tmp / "state3", {"policy": resumed.engine}, fingerprint)
    resumed.step(1)
    out["resumed_diff"] = diffs(load_state_dict(resumed.publish("resumed")), v3)["top"][0]
    try:
        train_state.load(tmp / "state3", {"policy": zero2.engine}, fingerprint)
    except ValueError as e:
        out["stage_refused"] = str(e)

    # The trainer's evaluation: 3 questions over 2 ranks, generating in lockstep, gives what
    # the published weights give unpartitioned (each rank on its own questions).
    evaluator = VersionEvaluator(zero3.cfg, load_tokenizer(tiny), rank, 2)
    rows = [evaluator.evaluate(zero3.engine.module, 2),
            evaluator.evaluate(load_causal_lm(vdir), 2)]
    if rank == 0:
        out["eval"] = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    # ZeRO-3 with offload also recomputes activations in the backward pass (which gathers the
    # parameters again) and plans micro-batches by tokens: 1 on rank 0 and 2 on rank 1, which
    # the trainer evens out to 2 each, or rank 0 would leave rank 1 waiting in a gather.
    budget = ("model.gradient_checkpointing=true", "train.max_tokens_per_micro_batch=24")
    for name, more in (("zero2_offload", ()), ("zero3_offload", budget)):
        run = Run(name, *more)
        for seq in (0, 1):
            run.step(seq)
        out["diff"][name] = diffs(load_state_dict(run.publish(name)), v2)
        first[name] = run.metrics[0]
        out.setdefault("offloaded", {})[name] = [run.engine.zero_offload_optimizer() is not None,
                                                  run.engine.zero_offload_param() is not None]
        del run
    sizes = [(len(e.prompt_ids), len(e.completion_ids)) for e in BATCHES[0].episodes]
    sizes = sizes[2 * rank : 2 * rank + 2]
    own = len(micro_batch_ranges([sizes[i] for i in length_order(sizes)], 2, 24, False))
    out["own_micro_batches"] = [None, None]
    dist.all_gather_object(out["own_micro_batches"], own)

    out["first_step"] = {k: [m["loss"], m["grad_norm"]] for k, m in first.items()}

    # LoRA: the adapter, gathered, written as ZeRO-2 writes it.
    lora = Run("zero3", "model.lora.enabled=true")
    lora.step(0)
    adapter = load_state_dict(lora.publish("lora"))
    trained = {k.replace(".default", ""): v for k, v in lora.gathered(True).items()}
    out["lora"] = {
        "same_keys": adapter.keys() == trained.keys(),
        "equal": all(torch.equal(adapter[k], trained[k]) for k in adapter),
        "b_trained": all(bool(adapter[k].abs().sum() > 0) for k in adapter if "lora_B" in k),
        "shapes": sorted({tuple(v.shape) for v in adapter.values()}),
    }

    # PPO's critic, partitioned like the policy: values, GAE, an update of the critic alone.
    gae = config("zero3", "algo.advantage=gae")
    critic = Critic(gae, zero3.ds)
    scored = score_on_ranks(zero3.engine.module, zero3.reference, BATCHES[0], plan_scoring(gae), 1,
                            pad)
    exp, _ = build_experience(scored, plan_experience(gae), 0.0)
    rows, width = range(2 * rank, 2 * rank + 2), exp.mask.shape[1]
    before = critic.values(exp.rows(rows), width, pad)
    exp, _ = build_experience(scored, plan_experience(gae), 0.0, values=gather_rows(before))
    metrics = update(zero3.engine, critic, exp.rows(rows), plan_update(gae, 2), pad,
                     train_policy=False)
    after = critic.values(exp.rows(rows), width, pad)
    out["critic"] = {"vf_loss": metrics["vf_loss"],
                     "moved": float((after - before).abs().max())}
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    """
)


# How far the runs may differ, from the arithmetic. Each run trains the same tiny model on the
# same two batches: only the order and grouping of float32 sums differ (ZeRO-2 all-reduces
# gradient buckets, ZeRO-3 reduce-scatters partitions, the offloaded runs step on CPU
# partitions, and zero3_offload's token budget splits rank 0's rows into two micro-batches
# with activation recomputation). eps = 2^-23 (float32 spacing at 1); a sum of n terms
# taken in another order moves by about sqrt(n) * eps of its terms' scale (rounding errors
# add up as a random walk; n * eps is the worst case).
#
# Log-probs: logp = z_y - logsumexp(z), with logits |z| < 1.3 for this random model and the
# logsumexp ~ log V = 10.8. The forward has ~10 stages of sums of <= 128 products (embedding,
# 2 layers of attention and MLP, norms, the 64-wide logits), ~sqrt(128) eps = 11 eps each,
# ~11 sqrt(10) eps = 36 eps through them, relative to magnitudes ~1; the logsumexp's sum of
# V = 49152 exponentials is cascade-summed (~log2(V) = 16 roundings of eps / 2: 8 eps) and
# its value rounds to half the spacing at 10.8 (4 eps). Two forwards of the same weights then
# differ by <= 2 * (36 + 8 + 4) eps ~ 100 eps = 1.2e-5 < LOGP_TOL = 2^-15 = 3.1e-5. Measured
# 0.0 (the same forward) and 9.5e-7 (one spacing at 10.8, the second batch).
LOGP_TOL = 2.0**-15
# The second batch is scored after one step, by weights that differ by up to ~lr at the few
# outlier weights below: each moves a log-prob by about its difference times |d logp / dw|,
# while the step itself moved these log-probs by up to 0.043 (measured). 2^-10 = 9.8e-4
# keeps 40x between them: stale or wrongly gathered weights fail. Measured 9.5e-7.
STEPPED_LOGP_TOL = 2.0**-10
# First-step loss: the same weights and data, so logp = old logp (ratio 1) and logp = ref
# logp (KL 0) up to rounding; loss = -(1/N) sum_t A_t r_t over rank 0's N = 8 tokens, with
# |A_t| = 1/sqrt(2) (rewards 0 and 1 in groups of two) and r_t = exp(logp_t - old_t). The
# signs of A cancel (|loss| = 0.177 = mean|A| / 4), so the bound is absolute, not relative:
# |d loss| <= mean|A| * (2 LOGP_TOL + (N + 2) eps) = 4.4e-5 <= LOSS_TOL = 2^-14 = 6.1e-5.
# Measured 0.0, and 3.0e-8 for zero3_offload (its micro-batches). A 1% wrong loss: 1.8e-3.
LOSS_TOL = 2.0**-14
# First-step gradient norm: sqrt of a sum of n = 3.2 M squares. The entries that carry the
# norm (no cancellation) differ by the backward's rounding, ~36 eps as in the forward; the
# squares are summed per bucket or partition, then over tensors and ranks, in each run in
# another order: <= (log2(n) + 8 levels) eps = 30 eps per run, halved by the sqrt. Relative
# difference <= ~36 eps + 30 eps = 66 eps = 7.9e-6 < NORM_RTOL = 2^-15 = 3.1e-5 (256 eps).
# Measured 7.8e-8 (zero3), 0.0 (the others). A gradient 1% off differs by 1e-2.
NORM_RTOL = 2.0**-15
# Weights after 2 AdamW steps at lr = 1e-3 (eps_adam = 1e-8, no weight decay): the update is
# lr * m / (sqrt(v) + eps_adam), +-lr at the first step wherever |g| >> eps_adam, at most
# 1.00136 lr at the second (bias-corrected betas 0.9, 0.999), whatever the gradient. So:
# - CEILING: no weight moves more than 2.0014 lr in a run (measured 2.00135 lr), so no two
#   runs differ by more than 2 * 2.0014 * lr = 4.0e-3, even where rounding flips a sign.
# - TIGHT = 2^-20 = 9.5e-7: the update's slope in g, lr * eps_adam / (|g| + eps_adam)^2,
#   times a relative difference d * |g| peaks at |g| = eps_adam, at lr * d / 4; so where the
#   two runs' gradients differ by d <= 2^-10 (~8000 eps), 2 steps differ by <= lr * d / 2
#   <= 2^-21, and rounding w - lr * u adds a few float32 spacings (4 at |w| ~ 1, the norms'
#   weights, the largest: 2^-21).
# - OUTLIERS: the weights whose gradient is a nearly cancelling sum, within rounding of
#   |g| ~ eps_adam, where Adam's update is ~linear in g with slope lr / eps_adam = 1e5: a
#   rounding difference of ~eps * (their terms' scale, ~1e-3) ~ 1e-10 moves them by ~1e-5
#   per step, and nothing bounds them below CEILING. They are rare: measured 1 (2.6e-6,
#   zero3) and 0 (zero3_offload; 1.2e-5 on another machine of this kind) of 3.2 M beyond
#   TIGHT, 7 and 11 beyond 1e-7. At most 1 in 2^14 of the weights (196) may be beyond TIGHT.
TIGHT, OUTLIERS, CEILING = 2.0**-20, 2.0**-14, 2 * 2.0014 * 1e-3


def beyond(diff: dict, bound: float) -> int:
    """How many weights differ by more than `bound` (NaN counts), from the largest 1024."""
    return sum(not x <= bound for x in diff["top"])


@pytest.mark.slow
def test_zero3_and_offload_on_two_ranks(tmp_path: Path, tiny_model_dir: Path) -> None:
    files = _as_tested(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = tmp_path / "zero3.py"
    script.write_text(_SCRIPT)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           f"--master_port={free_port()}", str(script), str(tiny_model_dir), str(tmp_path),
           json.dumps(files)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    diff = r["diff"]
    print(f"\nzero3: weights moved {r['moved']:.2e} from the start; differences from ZeRO-2: "
          + ", ".join(f"{k} max {d['top'][0]:.2e}, {beyond(d, TIGHT)} beyond {TIGHT:.1e}"
                      for k, d in diff.items())
          + f"; first step {r['first_step']}; log-probs {r['old_logp_diff']} (old, by batch), "
          f"{r['ref_logp_diff']} (reference)")  # fmt: skip

    # The ZeRO-3 version: the files ZeRO-2 writes, whole tensors, the gathered values.
    assert r["partitioned"], "the ZeRO-3 run's parameters were not partitioned"
    assert r["files"] == ["config.json", "generation_config.json", "model.safetensors",
                          "version.json"]  # fmt: skip
    assert r["full_shapes"] and r["equals_gathered"]
    # The first step's loss and gradient norm (bounds derived above): Adam would hide a
    # gradient off by a constant factor from the weights, not from the norm.
    want_loss, want_norm = r["first_step"]["zero2"]
    for name, (loss, norm) in r["first_step"].items():
        assert abs(loss - want_loss) <= LOSS_TOL, (name, loss, want_loss)
        assert abs(norm - want_norm) <= NORM_RTOL * want_norm, (name, norm, want_norm)
    # The weights after 2 steps (bounds derived above): all but a few within TIGHT, none
    # beyond CEILING; a wrong update moves far more by about lr (a micro-batch dropped from
    # the second step: the 1024 largest differences all ~1.7e-3).
    assert r["moved"] > 1e-3
    for name, d in diff.items():
        assert beyond(d, TIGHT) <= d["n"] * OUTLIERS, (name, d["top"][:20])
        assert beyond(d, CEILING) == 0, (name, d["top"][:20])
    # Scoring with the partitioned policy and reference: the same forward, the same numbers
    # (bounds derived above). The reference and the first batch's old log-probs come from the
    # initial weights in both runs; the second batch's from weights one step apart.
    assert all(x <= LOGP_TOL for x in r["ref_logp_diff"]), r["ref_logp_diff"]
    first_batch, second_batch = r["old_logp_diff"]
    assert first_batch <= LOGP_TOL and second_batch <= STEPPED_LOGP_TOL, r["old_logp_diff"]
    assert r["offloaded"] == {"zero2_offload": [True, False], "zero3_offload": [True, True]}
    assert r["own_micro_batches"] == [1, 2]

    # Resume: the second batch trained again from the saved state, bit for bit.
    assert r["resumed_diff"] == 0.0
    assert "saved with zero_stage=3, this run has zero_stage=2" in r["stage_refused"]

    # Lockstep evaluation: every question once, greedy answers as the unpartitioned weights
    # give them. (Sampled answers depend on the rows generated together, and a rank that
    # repeats a question to keep step generates more.)
    partitioned, plain = r["eval"]
    greedy = ("n", "accuracy", "format_rate")
    assert partitioned["n"] == 3 and "pass@2" in partitioned, partitioned
    assert {k: partitioned[k] for k in greedy} == {k: plain[k] for k in greedy}, r["eval"]

    lora = r["lora"]
    assert lora["same_keys"] and lora["equal"] and lora["b_trained"], lora
    assert [16, 64] in lora["shapes"] and [64, 16] in lora["shapes"], lora  # whole, r = 16
    assert r["critic"]["vf_loss"] > 0 and r["critic"]["moved"] > 0, r["critic"]


@pytest.mark.extended  # CI leaves it out; ZeRO-3 and offload on two ranks: the test above
@pytest.mark.slow
def test_a_zero3_offload_run_publishes_evaluates_and_resumes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The whole pipeline with ZeRO-3 and CPU offload, PPO's critic, the reference on the
    trainer and its evaluation (3 questions over 2 ranks); then the finished run resumed, both
    roles: nothing left to do, but the trainer republishes its last version from the saved
    state (every rank gathering)."""
    from safetensors.torch import load_file

    from tests.test_integration import tiny_config

    files = _as_tested(tmp_path)
    config = tiny_config(
        tmp_path, tiny_model_dir,
        data={"reward": "tests.rewards_for_tests:even_length_is_correct"},
        train={"total_steps": 2, "state_interval": 1, "logprobs_on": "trainer",
               "deepspeed_config": files["zero3_offload"]},
        algo={"advantage": "gae", "lam": 0.9, "kl_loss_coef": 0.01},
        eval={"interval": 1, "num_questions": 3, "max_new_tokens": 8, "samples": 2},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    run_dir = tmp_path / "runs" / "tiny"
    reloads = re.findall(r"reloaded weights: version (\d+) -> (\d+)", log)
    assert ("0", "1") in reloads, log[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["published_version"] for r in rows] == [1, 2]
    assert all(r["vf_loss"] > 0 for r in rows) and rows[1]["kl"] > 0  # critic, reference
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["version"], e["n"]) for e in evals] == [(0, 3), (1, 3), (2, 3)]
    final = run_dir / "versions" / "v000002" / "model.safetensors"
    weights, initial = load_file(final), load_file(tiny_model_dir / "model.safetensors")
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in initial.items()}
    marker = json.loads((run_dir / "train_state" / "COMPLETE").read_text())
    assert marker["zero_stage"] == 3 and marker["step"] == 2

    # Both roles resumed as they were: nothing left to do, and they say so.
    shutil.copy(final, tmp_path / "v2.safetensors")
    again = run_launch(config, [*transport_overrides(), "--resume"], timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "resumed from" in again.stdout + again.stderr
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == len(rows)  # no step more
    republished = json.loads((final.parent / "version.json").read_text())["time"]
    assert republished > rows[-1]["time"]  # written again, by the resumed trainer
    assert (tmp_path / "v2.safetensors").read_bytes() == final.read_bytes()


def test_the_docs_name_every_shipped_deepspeed_file() -> None:
    text = (REPO / "docs" / "gpus.md").read_text()
    for path in shipped_deepspeed_files():
        assert f"configs/deepspeed/{path.name}" in text, path.name
