import dataclasses
import re
import typing

import pytest

from grpo.config import Config, ConfigError, load_config, parse_override, save_config

DEMO = "configs/cpu_demo.yaml"


def test_defaults_are_valid_and_documented():
    cfg = load_config(None)  # the defaults alone, settled and checked
    assert cfg.rollout.group_size >= 2 and cfg.train.max_staleness == 1
    from grpo.config import describe

    lines = describe()
    assert any(line.strip().startswith("lr: 1e-06  # learning rate") for line in lines)
    assert all("#" in line for line in lines)  # every key carries its help


def test_yaml_then_overrides():
    cfg = load_config(
        DEMO,
        [
            "train.lr=1e-5",
            "rollout.group_size=8",
            "algo.loss=gspo",
            "model.lora.target_modules=[q_proj, v_proj]",
            "name=x",
        ],
    )
    assert cfg.train.lr == 1e-5 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.group_size == 8
    assert cfg.algo.loss == "gspo"
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.name == "x"
    assert cfg.train.total_steps == 8  # from the YAML


def test_int_is_accepted_for_float():
    assert load_config(None, ["rollout.temperature=1"]).rollout.temperature == 1.0


def test_exponent_without_dot_is_a_float_in_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-6\n")  # YAML 1.1 reads this as a string
    assert load_config(path).train.lr == 1e-6
    assert load_config(None, ["train.lr=3e-5"]).train.lr == 3e-5
    # ...but a string field keeps what was typed
    assert load_config(None, ["name=1e3"]).name == "1e3"
    assert load_config(None, ["algo.clip_low=null"]).algo.clip_low is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lrr=1", "unknown config key 'train.lrr'; did you mean 'train.lr'?"),
        ("rolout.group_size=4", "unknown config key 'rolout'; did you mean 'rollout'?"),
        ("rollout.group_size=four", "rollout.group_size must be int, got 'four'"),
        ("rollout.group_size=1", "rollout.group_size must be >= 2"),
        ("train.lr=0", "train.lr must be > 0"),
        ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1]"),
        ("model.gradient_checkpointing=3", "must be true or false"),
        (
            "train.num_ranks=3",
            "must be a multiple of the trainer's ranks, train.nnodes x train.num_ranks (3)",
        ),
        ("train.node_rank=1", "train.node_rank must be in [0, train.nnodes=1)"),
        ("train.gpus=[0, 0]", "train.gpus must list distinct GPU indices"),
        ("train.gpus=[0, 1]", "train.gpus lists 2 GPUs for train.num_ranks=1 ranks"),
        ("rollout.gpu_memory_fraction=1.5", "rollout.gpu_memory_fraction must be in [0, 1]"),
        ("train.nnodes=0", "train.nnodes must be > 0"),
        ("data.reward=nocolon", "data.reward must look like 'package.module:function'"),
        ("rollout=3", "rollout must be a mapping"),
        ("noequals", "must look like section.key=value"),
        ("algo.clip_low=1.5", "algo.clip_low must be in [0, 1) or null"),
        ("algo.clip_c=0.5", "algo.clip_c must be > 1 or null"),
        ("algo.kl_ctrl=adaptive", "needs algo.kl_in_reward=true"),
        ("train.max_grad_norm=0", "train.max_grad_norm must be > 0"),
        ("algo.overlong_factor=-1", "algo.overlong_factor must be >= 0"),
        ("transport.heartbeat_s=100", "must be at least twice transport.heartbeat_s"),
        ("transport.control_addr=tcp://127.0.0.1:5555", "must differ"),
        ("transport.max_frame_bytes=10", "must be in [1 MiB, 1 TiB]"),
        ("train.max_staleness=4", "train.keep_versions must be >= 6"),
        ("eval.max_new_tokens=0", "eval.max_new_tokens must be > 0"),
        ("algo.rollout_correction=token_truncate", "needs the rollout engine's log-probs"),
        ("rollout.top_k=-1", "rollout.top_k"),
        ("rollout.stop=['']", "rollout.stop holds an empty string"),
        ("rollout.vllm.gpu_memory_utilization=1.5", "gpu_memory_utilization in (0, 1]"),
        ("train.logprobs_on=both", "train.logprobs_on must be one of 'sampler' | 'trainer'"),
        ("rollout.max_turns=0", "rollout.max_turns must be >= 1"),
        ("rollout.max_turn_tokens=-1", "rollout.max_turn_tokens >= 0"),
        ("rollout.max_turns=4", "rollout.max_turns=4 needs a tool to call between turns"),
        ("rollout.tools=[calculator]", "set rollout.max_turns > 1"),
        ("rollout.sampler_id=../other", "rollout.sampler_id must be 1 to 64 letters"),
    ],
)
def test_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:  # on HF generate: it gives no engine log-probs
        load_config(DEMO, ["rollout.backend=hf", override])
    assert message in str(e.value)


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    # PyYAML's text is four or five lines; a config error is one, saying where (issue 64's
    # mistake table: a tab in the demo's config gave five lines)
    bad.write_text("train:\n\ttotal_steps: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert str(e.value) == (
        f"{bad} is not valid YAML: while scanning for the next token: found character '\\t' "
        "that cannot start any token (line 2, column 1)"
    )
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("train:\n  total_step: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'train.total_steps'"):
        load_config(unknown)


def test_parse_override_types():
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=2.5e-6") == ("a.b", 2.5e-6)
    assert parse_override("a.b=hello") == ("a.b", "hello")
    assert parse_override("a.b=") == ("a.b", "")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(DEMO, ["train.lr=3e-6"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert not list(tmp_path.glob("*.tmp"))


def test_critic_warmup_must_leave_policy_steps():
    with pytest.raises(ConfigError, match="the policy would never train"):
        load_config(DEMO, ["algo.advantage=gae", "critic.warmup_steps=12"])


@pytest.mark.parametrize(
    ("packing", "attn", "packed"),
    [
        ("auto", "sdpa", False),  # sdpa computes a packed row's whole square mask
        ("auto", "flash_attention_2", True),  # varlen kernels attend within each sequence
        ("packed", "sdpa", True),
        ("padded", "flash_attention_2", False),
    ],
)
def test_packing_follows_the_attention_kernel(packing, attn, packed):
    cfg = load_config(None, [f"train.packing={packing}", f"model.attn_implementation={attn}"])
    assert cfg.packed is packed


def test_packing_and_token_budget_values_are_checked():
    with pytest.raises(ConfigError, match="train.packing"):
        load_config(None, ["train.packing=yes"])
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        load_config(None, ["train.max_tokens_per_micro_batch=-1"])


def test_rollout_correction_threshold_is_checked_with_vllm():
    base = ["rollout.backend=vllm", "algo.rollout_correction=sequence_mask"]
    assert load_config(DEMO, base).algo.rollout_correction == "sequence_mask"
    with pytest.raises(ConfigError, match="rollout_correction_threshold must be > 1"):
        load_config(DEMO, [*base, "algo.rollout_correction_threshold=1"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "algo.loss=gspoo",
            "algo.loss: unknown policy loss 'gspoo'; valid: cispo, clip_cov, "
            "dppo_kl, dppo_tv, geo_mean, gmpo, grpo, gspo, kl_cov, ppo, sapo",
        ),
        ("rollout.backend=sglang", "rollout.backend: unknown rollout engine 'sglang'; valid: hf"),
        ("algo.advantage=nope", "algo.advantage: unknown advantage estimator 'nope'"),
        ("data.task=gsm9k", "did you mean 'gsm8k'?"),
        ("data.task=no_such_pkg_xyz:TASK", "could not import task module 'no_such_pkg_xyz'"),
        ("algo.loss=tests.rewards_for_tests:NOPE", "has no attribute 'NOPE'"),
        (
            "rollout.tools=[calculator, calculater]",
            "rollout.tools: unknown tool 'calculater'; valid: calculator, or your own as "
            "'package.module:name'; did you mean 'calculator'?",
        ),
        ("rollout.tools=[calculator, tests.test_tools:CALC]", "two tools share a name"),
    ],
)
def test_names_are_checked_against_the_registries(override, message):
    from grpo.plan import check_names

    overrides = [override, "rollout.max_turns=2"] if "tools" in override else [override]
    with pytest.raises(ConfigError) as e:
        check_names(load_config(DEMO, overrides))
    assert message in str(e.value)


def test_the_calculator_config_checks():
    from grpo.plan import check_names

    cfg = load_config("configs/gsm8k_calculator.yaml")
    check_names(cfg)
    assert cfg.rollout.max_turns > 1 and cfg.rollout.tools == ["calculator"]
    assert "<calc>" in cfg.data.system_prompt  # the model is told the syntax


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.loss=sapo", "algo.clip_low=0.1"], "algo.clip_low: the policy loss 'sapo' takes no"),
        (["algo.loss=cispo", "algo.clip_c=3"], "algo.clip_c: the policy loss 'cispo' takes no"),
    ],
)
def test_an_option_the_loss_does_not_take_is_refused_before_the_run(overrides, message):
    from grpo.plan import check_names

    with pytest.raises(ConfigError) as e:
        check_names(load_config(DEMO, overrides))
    assert message in str(e.value)
    check_names(load_config(DEMO, overrides[:1]))  # the loss alone is fine


def _float_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, bool]]:
    """Every float key of the config tree, found from the annotations (a new float key is
    covered without editing this test): (dotted key, whether it holds a list of floats)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            keys += _float_keys(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is list and typing.get_args(tp) == (float,):
            keys.append((f"{prefix}{f.name}", True))
        elif tp is float or float in typing.get_args(tp):  # float, float | None
            keys.append((f"{prefix}{f.name}", False))
    return keys


FLOAT_KEYS = _float_keys()


def test_the_float_keys_are_found():
    found = dict(FLOAT_KEYS)
    assert found["transport.stall_timeout_s"] is False and found["algo.clip_c"] is False
    assert found["reward_server.score_range"] is True
    assert len(found) > 20


@pytest.mark.parametrize("key, is_list", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf", "nan", "inf", "1e999"])
def test_every_float_key_refuses_nan_and_inf(key, is_list, bad):
    """finding 12: NaN passes every sign check (`nan <= 0` is False) and inf every upper one;
    one check where values are typed refuses both for every float key, naming it."""
    value = f"[{bad}, 1.0]" if is_list else bad
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    named = f"{key}[0]" if is_list else key
    assert str(e.value).startswith(f"{named} must be a finite number, got "), str(e.value)


def test_nan_and_inf_in_a_yaml_file_are_refused_by_key(tmp_path):
    """finding 12: the same check for values read from a file (YAML's .nan and .inf)."""
    path = tmp_path / "c.yaml"
    path.write_text("transport:\n  stall_timeout_s: .nan\n")
    with pytest.raises(ConfigError, match=r"^transport.stall_timeout_s must be a finite number"):
        load_config(path)
    path.write_text("transport:\n  peer_timeout_s: .inf\n")
    with pytest.raises(ConfigError, match=r"^transport.peer_timeout_s must be a finite number"):
        load_config(path)


def test_an_int_too_large_for_a_float_key_is_refused_by_key():
    """finding 12: float(10**400) raises OverflowError; the key is named instead."""
    with pytest.raises(ConfigError, match=r"^train.lr must be a finite number"):
        load_config(None, [f"train.lr={10**400}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("transport.stall_timeout_s=nan", "transport.stall_timeout_s must be a finite number"),
        ("transport.peer_timeout_s=inf", "transport.peer_timeout_s must be a finite number"),
        ("transport.heartbeat_s=0", "transport.heartbeat_s must be >= 0.01"),
        ("transport.heartbeat_s=0.0001", "transport.heartbeat_s must be >= 0.01"),
        ("transport.heartbeat_s=-1", "transport.heartbeat_s must be >= 0,"),
        ("transport.stall_timeout_s=-5", "transport.stall_timeout_s must be >= 0"),
        ("transport.peer_timeout_s=1e10", "transport.peer_timeout_s must be at most 2147483 s"),
        ("transport.startup_timeout_s=1e10", "transport.startup_timeout_s must be at most"),
        ("transport.stall_timeout_s=1e10", "transport.stall_timeout_s must be at most"),
        ("rollout.vllm.reload_timeout_s=0", "rollout.vllm.reload_timeout_s must be > 0"),
        ("reward.timeout_s=1e10", "reward.timeout_s must be at most 2147483 s"),
    ],
)
def test_waits_that_would_spin_or_overflow_are_refused(override, message):
    """finding 12: a heartbeat of 0 (or a hair above it) makes both roles' heartbeat threads
    spin; a timeout beyond ZeroMQ's 32-bit milliseconds overflows when the socket is set up."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(message), str(e.value)


def test_usable_waits_still_load():
    """0 still means "never" for the stall check; the smallest usable heartbeat loads."""
    cfg = load_config(None, ["transport.stall_timeout_s=0", "transport.heartbeat_s=0.01"])
    assert cfg.transport.stall_timeout_s == 0 and cfg.transport.heartbeat_s == 0.01
    assert load_config(None, ["algo.clip_c=null"]).algo.clip_c is None


@pytest.mark.parametrize("path", ["", "/"])
def test_an_unreadable_deepspeed_config_is_refused_by_key(path):
    """A deepspeed_config naming a directory ('' is the current
    one) raised IsADirectoryError out of load_config instead of a line naming the key."""
    with pytest.raises(ConfigError, match=r"^train.deepspeed_config: cannot read "):
        load_config(None, [f"train.deepspeed_config={path}"])


def test_an_override_nested_too_deeply_is_refused_by_key():
    """Found with the config fuzz test's inputs: PyYAML recurses per level of nesting, and
    its RecursionError left load_config instead of a line naming the key."""
    with pytest.raises(ConfigError, match=r"^rollout.stop must be a list, got "):
        load_config(None, ["rollout.stop=" + "[" * 3000])


def test_continuous_mode_is_checked():
    base = ["rollout.mode=continuous", "train.max_staleness=1"]
    with pytest.raises(ConfigError, match="set algo.rollout_correction=decoupled"):
        load_config(DEMO, base)
    cfg = load_config(DEMO, [*base, "algo.rollout_correction=decoupled"])
    assert cfg.rollout.mode == "continuous"
    assert load_config(DEMO, ["rollout.mode=continuous", "train.max_staleness=0"])
    with pytest.raises(ConfigError, match="rollout.slots=6 must be a multiple of group_size"):
        load_config(DEMO, ["rollout.mode=continuous", "train.max_staleness=0", "rollout.slots=6"])
    # Tools under either pacing (grpo.rollout.tool_slots); DAPO's rounds lock-step only.
    load_config(DEMO, ["rollout.mode=continuous", "train.max_staleness=0",
                       "rollout.max_turns=2", "rollout.tools=[calculator]"])  # fmt: skip
    with pytest.raises(ConfigError, match="without dynamic_sampling"):
        load_config(DEMO, ["rollout.mode=continuous", "train.max_staleness=0",
                           "rollout.dynamic_sampling=true"])  # fmt: skip


@pytest.mark.parametrize("name, says", [
    ("base", "reserved"), ("spool", "reserved"), ("base.lock", "reserved"),
    ("../x", "one path component"), ("a/b", "one path component"), (".", "one path component"),
    ("", "one path component"), ("x" * 201, "one path component"),
])  # fmt: skip
def test_a_run_name_that_is_not_one_fresh_path_component_is_refused(name, says):
    """Issue 62: the name is the run's dir, which a new run moves aside: name=base moved the
    embedded model, name=spool every run's spools, name=../x any directory."""
    with pytest.raises(ConfigError, match=says):
        load_config(None, [f"name={name}"])
    assert load_config(None, ["name=a b's run (2)"]).name == "a b's run (2)"


@pytest.mark.parametrize("override, says", [
    ("train.master_port=99999", "train.master_port must be a TCP port"),
    (f"transport.max_frame_bytes={2**70}", "transport.max_frame_bytes must be in"),
    (f"rollout.slots={10**12}", "rollout.slots must be at most"),
])  # fmt: skip
def test_absurd_integers_are_refused_before_the_run(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ("fpu sse avx2 fma", "float32"),  # AMD EPYC of the CI machine: bfloat16 emulated
        ("avx2 avx512f avx512_bf16", "bfloat16"),  # AVX-512 BF16
        ("avx2 amx_tile amx_bf16", "bfloat16"),  # AMX
    ],
)
def test_auto_dtype_is_bfloat16_only_where_the_cpu_computes_it(tmp_path, monkeypatch, flags, dtype):
    import torch

    from grpo.core import precision

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.native_dtype(cpuinfo) == dtype
    monkeypatch.setattr("grpo.config.loading.native_dtype", lambda: dtype)
    assert load_config("configs/cpu_demo.yaml").model.dtype == dtype
    assert load_config(None, ["model.dtype=float32"]).model.dtype == "float32"  # as said


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("learning_rate=1e-5", "learning_rate is TRL's name; here it is train.lr"),
        (
            "train.num_generations=8",
            "train.num_generations is TRL's name; here it is rollout.group_size",
        ),
        (
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.rollout.n is verl's name; here it is rollout.group_size",
        ),
        (
            "data.max_response_length=64",
            "data.max_response_length is verl's name; here it is rollout.max_new_tokens",
        ),
    ],
)
def test_a_peer_s_key_is_named_with_this_project_s(override, said):
    """Issue 64, item 5: TRL's and verl's keys get this project's key, not a close match."""
    with pytest.raises(ConfigError, match=f": {re.escape(said)}$"):
        load_config(None, [override])
    with pytest.raises(ConfigError, match="unknown config key 'trainer'; did you mean 'train'"):
        load_config(None, ["trainer.nothing=1"])  # a verl section with no key of the table


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("algo.loss=dapo", "'dapo' is a peer's name: DAPO is settings, not a loss"),
        ("algo.advantage=reinforce_plus_plus", "algo.advantage=reinforce_pp"),
        ("algo.advantage=remax", "not offered; nearest: rloo"),
    ],
)
def test_a_peer_s_algorithm_is_named_with_what_it_is_here(override, said):
    from grpo.plan import check_names

    with pytest.raises(ConfigError, match=re.escape(said)):
        check_names(load_config(None, [override]))
