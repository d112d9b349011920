"""What TRL's and verl's users write, and what it is here: a user coming from a peer types its
key (`learning_rate`, `num_generations`, `actor_rollout_ref.rollout.n`) or its algorithm's name
(`algo.loss=dapo`), and an "unknown key" or a close match (`sapo` for `dapo`) says nothing
useful. The config's errors look these tables up (issue 64, item 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A peer's key -> (the peer, this project's key). TRL's (GRPOConfig) are matched by their last
# part wherever they are written (`learning_rate`, `train.learning_rate`); verl's by the whole
# dotted path, as its Hydra overrides spell them.
PEER_KEYS: dict[str, tuple[str, str]] = {
    "learning_rate": ("TRL", "train.lr"),
    "num_generations": ("TRL", "rollout.group_size"),
    "beta": ("TRL", "algo.kl_loss_coef"),
    "max_completion_length": ("TRL", "rollout.max_new_tokens"),
    "max_prompt_length": ("TRL", "data.max_prompt_tokens"),
    "per_device_train_batch_size": ("TRL", "train.micro_batch_size"),
    "max_steps": ("TRL", "train.total_steps"),
    "num_iterations": ("TRL", "train.ppo_epochs"),
    "epsilon": ("TRL", "algo.clip_low"),
    "epsilon_high": ("TRL", "algo.clip_high"),
    "loss_type": ("TRL", "algo.agg (token-mean for bnpo/dapo, seq-mean-token-mean for grpo)"),
    "model_name_or_path": ("TRL", "model.path"),
    "use_vllm": ("TRL", "rollout.backend=vllm"),
    "warmup_steps": ("TRL", "train.lr_warmup_steps"),
    "lr_scheduler_type": ("TRL", "train.lr_schedule"),
    "actor_rollout_ref.model.path": ("verl", "model.path"),
    "actor_rollout_ref.actor.optim.lr": ("verl", "train.lr"),
    "actor_rollout_ref.actor.kl_loss_coef": ("verl", "algo.kl_loss_coef"),
    "actor_rollout_ref.actor.kl_loss_type": ("verl", "algo.kl_kind"),
    "actor_rollout_ref.actor.clip_ratio_low": ("verl", "algo.clip_low"),
    "actor_rollout_ref.actor.clip_ratio_high": ("verl", "algo.clip_high"),
    "actor_rollout_ref.actor.loss_agg_mode": ("verl", "algo.agg"),
    "actor_rollout_ref.actor.entropy_coeff": ("verl", "algo.entropy_coef"),
    "actor_rollout_ref.actor.ppo_epochs": ("verl", "train.ppo_epochs"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("verl", "train.mini_batch_size"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("verl", "train.micro_batch_size"),
    "actor_rollout_ref.rollout.n": ("verl", "rollout.group_size"),
    "actor_rollout_ref.rollout.name": ("verl", "rollout.backend"),
    "actor_rollout_ref.rollout.temperature": ("verl", "rollout.temperature"),
    "algorithm.adv_estimator": ("verl", "algo.advantage"),
    "algorithm.gamma": ("verl", "algo.gamma"),
    "algorithm.lam": ("verl", "algo.lam"),
    "algorithm.use_kl_in_reward": ("verl", "algo.kl_in_reward"),
    "data.train_files": ("verl", "data.train"),
    "data.val_files": ("verl", "data.test"),
    "data.train_batch_size": ("verl", "rollout.questions_per_step"),
    "data.max_prompt_length": ("verl", "data.max_prompt_tokens"),
    "data.max_response_length": ("verl", "rollout.max_new_tokens"),
    "trainer.total_training_steps": ("verl", "train.total_steps"),
    "trainer.n_gpus_per_node": ("verl", "train.num_ranks"),
    "trainer.nnodes": ("verl", "train.nnodes"),
    "custom_reward_function.path": ("verl", "data.reward=verl:module:compute_score"),
}

# (the key, a name peers give an algorithm this project has no entry for) -> what it is here.
PEER_ALGORITHMS: dict[tuple[str, str], str] = {
    ("algo.loss", "dapo"): "DAPO is settings, not a loss: loss grpo, agg token-mean, clip_high "
    "0.28, rollout.dynamic_sampling, algo.overlong_buffer (configs/gsm8k_dapo.yaml)",
    ("algo.loss", "dr_grpo"): "Dr. GRPO is an advantage and an aggregation: algo.advantage="
    "dr_grpo, agg seq-mean-token-sum-norm (configs/gsm8k_dr_grpo.yaml)",
    ("algo.loss", "bnpo"): "TRL's bnpo is loss grpo with agg token-mean",
    ("algo.loss", "vanilla"): "verl's vanilla policy loss is loss ppo",
    ("algo.advantage", "reinforce_plus_plus"): "algo.advantage=reinforce_pp",
    ("algo.advantage", "reinforce_plus_plus_baseline"): "algo.advantage=reinforce_pp_baseline",
    ("algo.advantage", "remax"): "not offered; nearest: rloo (a baseline from the group, where "
    "ReMax's is a greedy answer's reward)",
    ("algo.advantage", "opo"): "not offered; nearest: grpo",
}


def peer_key(dotted: str, value: Any = None) -> str | None:
    """What to tell a user whose config has the unknown key `dotted` (with `value` under it):
    the first peer key found there or under it, and this project's key; None when it is none."""
    if isinstance(value, Mapping):
        for child, below in value.items():
            if (found := peer_key(f"{dotted}.{child}", below)) is not None:
                return found
        return None
    peer = PEER_KEYS.get(dotted)
    if peer is None and (trl := PEER_KEYS.get(dotted.rsplit(".", 1)[-1])) and trl[0] == "TRL":
        peer = trl
    return None if peer is None else f"{dotted} is {peer[0]}'s name; here it is {peer[1]}"


def peer_algorithm(key: str, name: str) -> str | None:
    """What the peers' algorithm `name`, given as `key` and not registered here, is here."""
    said = PEER_ALGORITHMS.get((key, name))
    return None if said is None else f"{name!r} is a peer's name: {said}"
