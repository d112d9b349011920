"""Mutations of what a new user meets first (issue 45): the preflight's checks of ports, keys
and what the node can run."""

from __future__ import annotations

from tests.mutations import Mutation

TESTS = "tests/test_preflight.py::"
PORT = TESTS + "test_a_port_another_process_holds_is_named_with_the_process"
OPEN = TESTS + "test_listening_beyond_loopback_needs_keys_or_a_word"
KEYS = TESTS + "test_each_role_s_keys_are_read_before_it_starts"
ROWS = TESTS + "test_a_dataset_s_rows_are_read_as_the_sampler_will_read_them"
NODE = TESTS + "test_the_attention_kernel_and_the_ranks_must_fit_the_node"

MUTATIONS = (
    Mutation(
        name="ports_not_probed",
        item="45.1: a port in use is named before any model loads",
        path="grpo/preflight.py",
        old="        _port_free(key, addr)\n",
        new="        pass\n",
        tests=(PORT,),
    ),
    Mutation(
        name="every_trainer_rank_probes_the_ports",
        item="45.1: only trainer rank 0 (which listens) probes its ports",
        path="grpo/preflight.py",
        old='    return cfg.train.node_rank == 0 and os.environ.get("RANK", "0") == "0"\n',
        new="    return True\n",
        tests=(PORT,),
    ),
    Mutation(
        name="open_addresses_left_to_the_channel",
        item="45.1: listening beyond loopback without keys is refused before any model loads",
        path="grpo/preflight.py",
        old="            check_listening(listening, bool(t.curve_dir), allow_insecure=False)\n",
        new="            pass\n",
        tests=(OPEN,),
    ),
    Mutation(
        name="keys_not_read_before_the_start",
        item="45.1: a missing or unsafe key is named before any model loads",
        path="grpo/preflight.py",
        old="            ClientKeys.load(directory, cfg.rollout.sampler_id)\n",
        new="            pass\n",
        tests=(KEYS,),
    ),
    Mutation(
        name="varlen_attention_allowed_without_a_gpu",
        item="45.1: flex_attention without a GPU is refused before any model loads",
        path="grpo/preflight.py",
        old='    if not visible_gpus():\n        raise ConfigError(\n            f"model.attn',
        new='    if False:\n        raise ConfigError(\n            f"model.attn',
        tests=(NODE,),
    ),
    Mutation(
        name="cpu_ranks_unbounded",
        item="45.1: more trainer ranks than cores is refused",
        path="grpo/preflight.py",
        old="    if num_ranks > (cores or 1):\n",
        new="    if num_ranks > 64 * (cores or 1):\n",
        tests=(NODE,),
    ),
    Mutation(
        name="dataset_rows_left_to_the_sampler",
        item="45.1: a dataset without the task's columns is refused before any model loads",
        path="grpo/preflight.py",
        old="        task.load(source)\n",
        new="        pass\n",
        tests=(ROWS,),
    ),
)
