"""Device-clean code, checked without a GPU: the model lives on the `meta` device, so any CPU
tensor that meets its tensors raises the same "Expected all tensors to be on the same device"
as CUDA does, and every output must land on the model's device.

This is the class of bug that stopped the first GPU run (the stop criterion of HF generate
returned a CPU tensor). HF models cannot run on `meta` (their mask code reads values), so the
model here is a small stand-in with the same call signature that also refuses inputs from
another device.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpo.algos import get_policy_loss, value_loss
from grpo.algos.registry import POLICY_LOSSES
from grpo.config import load_config
from grpo.core.batching import pack_pairs, pad_pairs
from grpo.core.episode import Episode, EpisodeBatch
from grpo.plan import plan_experience, plan_objective
from grpo.rollout.hf import _StopWhenSet
from grpo.scoring.forward import pairs_logprobs
from grpo.scoring.kernels import Truncation
from grpo.trainer.critic import completion_values
from grpo.trainer.step import micro_batch_loss
from tests.experience import build_experience

META = torch.device("meta")
V = 50


class StandInLM(torch.nn.Module):
    """Embedding + linear head on `device`, called like an HF causal LM."""

    def __init__(self, device: torch.device, vocab: int = V):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 16, device=device)
        self.head = torch.nn.Linear(16, vocab, device=device)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False,
                logits_to_keep=0):  # fmt: skip
        for name, t in (
            ("input_ids", input_ids),
            ("attention_mask", attention_mask),
            ("position_ids", position_ids),
            ("logits_to_keep", logits_to_keep),
        ):
            if isinstance(t, torch.Tensor) and t.device != self.device:
                raise RuntimeError(f"{name} on {t.device}, model on {self.device}")
        logits = self.head(self.embed(input_ids))  # (B, L, V)
        if isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)


PROMPTS = [np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32)]
COMPLETIONS = [np.array([6, 7], np.int32), np.array([8, 9, 10], np.int32)]


def test_stop_criterion_answers_on_the_ids_device():
    event = threading.Event()
    stop = _StopWhenSet(event)
    ids = torch.zeros(3, 5, dtype=torch.long, device=META)
    out = stop(ids, torch.zeros(3, V, device=META))
    assert out.device == META and out.dtype == torch.bool and out.shape == (3,)
    event.set()
    assert bool(stop(torch.zeros(2, 4, dtype=torch.long), None).all())  # and it stops


def test_mixing_devices_is_what_the_stand_in_catches():
    """The check itself: a CPU tensor meeting a meta one raises, as it would on CUDA."""
    model = StandInLM(META)
    with pytest.raises(RuntimeError, match="on cpu"):
        model(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.ones(2, 3, device=META) + torch.ones(2, 3)


def test_collation_unpacks_onto_the_values_device():
    packed = pack_pairs(PROMPTS, COMPLETIONS)  # built on the CPU, from numpy
    flat = torch.zeros(1, sum(len(c) for c in COMPLETIONS), device=META)
    assert packed.unpack(flat).device == META
    padded = pad_pairs(PROMPTS, COMPLETIONS, pad_id=0)
    assert padded.input_ids.device.type == "cpu"  # moved by the caller, once


@pytest.mark.parametrize("packed", [False, True])
def test_logprobs_land_on_the_model_device(packed):
    out = pairs_logprobs(
        StandInLM(META),
        PROMPTS,
        COMPLETIONS,
        packed=packed,
        pad_id=0,
        temperature=0.7,
        with_entropy=True,
        truncation=Truncation(0.9, 5),
    )
    for t in (out.logp, out.entropy, out.mask, out.log_kept_mass):
        assert t.device == META and t.shape == (2, 3)


def _episode(i: int) -> Episode:
    c = len(COMPLETIONS[i])
    return Episode(PROMPTS[i], COMPLETIONS[i], np.full(c, -1.0, np.float32),
                   np.full(c, -1.1, np.float32), 1.0, {}, "length" if i else "stop", 0)  # fmt: skip


@pytest.mark.parametrize("loss", ["grpo", "gspo"])  # what algo.loss accepts
@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["algo.agg=seq-mean-token-sum-norm", "algo.mask_truncated=true"],
        ["algo.entropy_coef=0.01", "train.packing=packed", "algo.clip_c=3"],
    ],
)
def test_micro_batch_loss_stays_on_the_model_device(loss, extra):
    """The step's experience is on the CPU (advantages, log-probs, rollout-correction
    weights); the loss, the mask and every metric must be on the model's device."""
    cfg = load_config(None, [f"algo.loss={loss}", "rollout.max_new_tokens=8", *extra])
    batch = EpisodeBatch((_episode(0), _episode(1)), group_size=2, policy_version=0, seq=0)
    exp, _ = build_experience(
        batch, plan_experience(cfg), kl_coef=0.0
    )  # CPU tensors, as a step builds them
    exp = replace(exp, is_weights=torch.ones_like(exp.mask))  # as with a rollout correction
    loss_t, mask, metrics = micro_batch_loss(
        StandInLM(META), exp.rows([1, 0]), plan_objective(cfg), 0
    )
    assert loss_t.device == META and loss_t.dim() == 0 and mask.device == META
    assert metrics and all(m.device == META and m.dim() == 0 for m in metrics.values())


def test_policy_and_value_losses_keep_metrics_on_the_device():
    """Metrics are tensors (no .item() per micro-batch: each one would wait for the GPU)."""
    x = torch.zeros(2, 3, device=META)
    # Clip-Cov and KL-Cov pick a number of tokens that depends on the mask: one host sync per
    # micro-batch, as in verl (their docstrings say so); their metrics are tensors all the same.
    counts_tokens = {"clip_cov", "kl_cov"}
    for name in sorted(POLICY_LOSSES):
        y = torch.zeros(2, 3) if name in counts_tokens else x
        loss, metrics = get_policy_loss(name)(y, y, y, y)
        assert loss.device == y.device and all(m.device == y.device for m in metrics.values())
        assert all(isinstance(m, torch.Tensor) and m.dim() == 0 for m in metrics.values())
    loss, metrics = value_loss(x, x, x, x)
    assert loss.device == META and all(m.device == META for m in metrics.values())


@pytest.mark.parametrize("packed", [False, True])
def test_critic_values_land_on_the_model_device(packed):
    values, mask = completion_values(StandInLM(META), PROMPTS, COMPLETIONS, packed, pad_id=0)
    assert values.device == META and mask.device == META and values.shape == (2, 3)
