"""Validation at the edge (issue 29, findings 1, 2, 4 and the stats half of 12): every batch is
checked before use; a refusal is one line naming the peer and the field, is counted, and leaves
no trace in the ledger, the pool or the spool; a sampler never builds a batch the trainer would
refuse, and a refused or never-taken batch cannot hang it."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import zmq

from grpo.config import TransportConfig, load_config
from grpo.core.columns import VALUE_LIMIT
from grpo.core.episode import Episode, EpisodeBatch
from grpo.delivery.admission import Expected, misfit
from grpo.delivery.ledger import Ledger
from grpo.delivery.sampler_endpoint import DELIVERING, SamplerEndpoint
from grpo.delivery.spool import Spool
from grpo.delivery.trainer_endpoint import TrainerEndpoint
from grpo.observe.metrics import per_sampler
from grpo.plan import plan_experience
from grpo.reward_service.protocol import parse_scores
from grpo.runtime.progress import ACTIVITY
from grpo.sampler.rewards import checked_rewards
from grpo.wire import messages
from grpo.wire.codec import FrameError, decode, encode_batch, seal
from tests.conftest import free_port
from tests.experience import build_experience
from tests.test_episode import make_batch

FITS = Expected(groups=3, group_size=4, arrays=frozenset({"old_logp", "ref_logp"}),
                vocab_size=50_000, max_prompt_tokens=64, max_new_tokens=16)  # fmt: skip


def _tampered(batch: EpisodeBatch, **header: Any) -> list[bytes]:
    """The frames of `batch` with header fields replaced and the checksum made right again:
    what a buggy or hostile peer can send, which only the checks after the checksum catch."""
    frames = [bytes(f) for f in encode_batch(batch)]
    fields = msgpack.unpackb(frames[0][8:], raw=False)
    fields.update(header)
    return seal(msgpack.packb(fields, use_bin_type=True), frames[1:])


def _with_array(batch: EpisodeBatch, name: str, index: int, value: float) -> list[bytes]:
    """The frames of `batch` with one value of array `name` replaced, checksum made right."""
    frames = [bytes(f) for f in encode_batch(batch)]
    names = [d["name"] for d in msgpack.unpackb(frames[0][8:], raw=False)["arrays"]]
    frame = 1 + names.index(name)
    dtype = np.int32 if name.endswith("_ids") else np.float32
    values = np.frombuffer(frames[frame], dtype).copy()
    values[index] = value
    frames[frame] = values.tobytes()
    return seal(frames[0][8:], frames[1:])


# --------------------------------------------------------------------------- finding 1


@pytest.mark.parametrize("name", ["prompt_ids", "completion_ids"])
def test_a_negative_token_id_is_refused(name):
    """finding 1: only `max(ids) >= vocab` was checked, so -5 passed decode and admission and
    reached the embedding inside step()."""
    with pytest.raises(FrameError, match=f"{name} holds -5, below 0"):
        decode(_with_array(make_batch(), name, 0, -5))
    batch = make_batch()
    ids = getattr(batch.columns, name).copy()
    ids[0] = -5
    with pytest.raises(ValueError, match=f"{name} holds -5, below 0"):
        EpisodeBatch.from_columns(replace(batch.columns, **{name: ids}), 4, 5, 17)


def test_an_empty_prompt_is_refused():
    """finding 1: a zero prompt length reached a ValueError in the log-prob forwards."""
    batch = make_batch()
    lens = batch.columns.prompt_len
    moved = [*lens.tolist()]
    moved[1] += moved[0]  # the same ids, all given to episode 1: episode 0 has none
    moved[0] = 0
    with pytest.raises(FrameError, match="prompt_len holds 0"):
        decode(_tampered(batch, prompt_len=moved))


def test_lengths_beyond_the_configured_maxima_do_not_fit():
    """finding 1: an unbounded completion length reached an out-of-memory."""
    batch = make_batch()
    longest = int(batch.columns.completion_len.max())
    assert misfit(batch, replace(FITS, max_new_tokens=longest)) is None
    why = misfit(batch, replace(FITS, max_new_tokens=longest - 1))
    assert why is not None and "rollout.max_new_tokens" in why and str(longest) in why
    prompt = int(batch.columns.prompt_len.max())
    why = misfit(batch, replace(FITS, max_prompt_tokens=prompt - 1))
    assert why is not None and "data.max_prompt_tokens" in why


def test_expected_comes_from_the_config():
    cfg = load_config(None, ["rollout.max_new_tokens=33", "data.max_prompt_tokens=44"])
    want = Expected.for_run(cfg, frozenset(), vocab_size=10)
    assert (want.max_new_tokens, want.max_prompt_tokens, want.vocab_size) == (33, 44, 10)
    assert (want.groups, want.group_size) == (
        cfg.rollout.questions_per_step,
        cfg.rollout.group_size,
    )


# --------------------------------------------------------------------------- finding 2


@pytest.mark.parametrize("reward", [1e39, -1e39, VALUE_LIMIT * 2])
def test_a_reward_beyond_the_float32_arithmetic_is_refused(reward):
    """finding 2: rewards were checked finite as float64, then cast to float32 in the
    experience: 1e39 became inf, the advantages NaN, and FloatingPointError ended training."""
    batch = make_batch()
    rewards = batch.columns.reward.tolist()
    rewards[2] = reward
    with pytest.raises(FrameError, match="reward holds"):
        decode(_tampered(batch, reward=rewards))


@pytest.mark.parametrize("name", ["old_logp", "ref_logp", "rollout_logp"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -3e38])
def test_a_log_prob_out_of_range_is_refused_at_decode(name, value):
    """finding 2: a log-prob finite in float32 but huge (-3e38) overflowed the KL terms."""
    batch = make_batch()
    with pytest.raises(FrameError, match=f"{name} holds"):
        decode(_with_array(batch, name, 0, value))


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_rewards_at_the_limit_keep_the_experience_finite(advantage):
    """finding 2: the bound is what keeps the trainer's float32 arithmetic finite, not only
    the cast: group sums, differences from the mean and their squares."""
    cfg = load_config(None, [f"algo.advantage={advantage}", "algo.kl_in_reward=true"])

    def experience(magnitude: float) -> Any:
        batch = make_batch()
        rewards = [magnitude * (1 if i % 3 else -1) for i in range(len(batch))]
        c = replace(batch.columns, reward=np.array(rewards, np.float64))
        c = replace(c, old_logp=np.full_like(c.old_logp, -VALUE_LIMIT))
        # Built as the trainer's own batch is: no check on the values (the limit is tested).
        batch = EpisodeBatch.__new__(EpisodeBatch)
        batch._init(c, 4, 5, 17, "s", {})
        batch._episodes = None
        return build_experience(batch, plan_experience(cfg), kl_coef=1.0)

    exp, metrics = experience(VALUE_LIMIT)
    assert torch.isfinite(exp.token_rewards).all() and torch.isfinite(exp.advantages).all()
    assert all(math.isfinite(v) for v in metrics.values())
    # Within float32's range is not enough: the sums and squares overflow.
    exp, _ = experience(3e38)
    assert not torch.isfinite(exp.advantages).all()


# --------------------------------------------------------------------------- finding 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e39])
def test_a_score_that_is_not_a_finite_float32_is_refused_where_it_enters(bad):
    """finding 4: the reward service's reply was taken as it came: NaN built a sampler-side
    batch that the trainer refused. The one score is refused (0 with a reward_error), the
    others of the reply kept, so a cached bad reply is not resent for ever."""
    scored = parse_scores({"rewards": [1.0, bad, 0.5], "infos": [{}, {}, {"a": 1}]}, 3)
    assert [r for r, _ in scored] == [1.0, 0.0, 0.5]
    assert "not a finite number" in scored[1][1]["reward_error"]
    assert scored[2][1] == {"a": 1} and "reward_error" not in scored[0][1]


def test_the_sampler_refuses_a_combined_reward_out_of_range(caplog):
    """finding 4: rule and service weighted and summed can still leave the range."""
    caplog.set_level(logging.WARNING)
    scored = checked_rewards([(1.0, {}), (1e300 * 1e10, {}), (2 * VALUE_LIMIT, {"k": 1})])
    assert [r for r, _ in scored] == [1.0, 0.0, 0.0]
    assert scored[2][1]["k"] == 1 and "reward_error" in scored[2][1]
    assert len([r for r in caplog.records if "answers 1, 2" in r.getMessage()]) == 1


@pytest.mark.parametrize("field", ["reward", "old_logp"])
def test_the_sampler_cannot_build_a_batch_the_trainer_would_refuse(field):
    """finding 4: EpisodeBatch had no finiteness check, unlike from_columns."""
    ep = make_batch().episodes[1]
    bad = (
        replace(ep, reward=math.nan)
        if field == "reward"
        else replace(
            ep,
            old_logp=np.full(max(1, len(ep.completion_ids)), np.nan, np.float32),
            completion_ids=np.zeros(max(1, len(ep.completion_ids)), np.int32),
            ref_logp=None,
            rollout_logp=None,
        )  # fmt: skip
    )
    with pytest.raises(ValueError, match=f"{field} holds"):
        EpisodeBatch([bad, bad], 2, 0, 0)


# --------------------------------------------------------------------------- stats (12)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_batch_stat_that_is_not_finite_is_refused(value):
    """finding 12: batch stats accepted NaN and inf (they went into every metrics row)."""
    batch = make_batch()
    with pytest.raises(FrameError, match="stats\\['gen_s'\\]"):
        decode(_tampered(batch, stats={"gen_s": value}))


def test_a_stat_or_info_the_trainer_reads_must_be_what_it_reads():
    """finding 12: a stat named `id` became the row's sampler_id; a tool count that is not a
    number raised inside the step's metrics."""
    batch = make_batch()
    assert misfit(batch, FITS) is None
    named_id = EpisodeBatch.from_columns(batch.columns, 4, 5, 17, "s", {"id": 1.0})
    assert "stats" in misfit(named_id, FITS)
    infos = list(batch.columns.reward_info)
    infos[0] = {**infos[0], "turns": "two"}
    wordy = EpisodeBatch.from_columns(replace(batch.columns, reward_info=tuple(infos)), 4, 5, 17)
    assert "reward_info['turns']" in misfit(wordy, FITS)


def test_the_run_summary_does_without_a_stat():
    """finding 12: a batch without gen_tokens_per_s raised KeyError at the run's end."""
    rows = [
        {"sampler_id": "a", "reward_mean": 1.0, "accuracy": 0.5, "staleness": 0},
        {
            "sampler_id": "a",
            "reward_mean": 0.0,
            "accuracy": 0.5,
            "staleness": 1,
            "sampler_gen_tokens_per_s": 10.0,
        },  # fmt: skip
    ]
    summary = per_sampler(rows)
    assert summary["a"]["batches"] == 2 and summary["a"]["gen_tokens_per_s"] == 10.0
    assert math.isnan(per_sampler(rows[:1])["a"]["gen_tokens_per_s"])


# --------------------------------------------------------------------------- live endpoints


def _episode(i: int, tokens: int = 2) -> Episode:
    return Episode(
        np.arange(3, dtype=np.int32),
        np.arange(tokens, dtype=np.int32),
        None,
        None,
        float(i),
        {},
        "stop",
        7,
    )


def _batch(seq: int, sampler_id: str = "sampler-0", groups: int = 1) -> EpisodeBatch:
    """A batch of `groups` groups of 2 (the endpoints below expect 1)."""
    eps = [_episode(i) for i in range(2 * groups)]
    return EpisodeBatch(eps, 2, policy_version=0, seq=seq, sampler_id=sampler_id)


def _endpoints(tmp_path: Path, max_batches: int = 8, **kw):
    """A trainer's endpoint for batches of 1 group of 2, and sampler-0's, on loopback."""
    cfg = TransportConfig(
        episodes_addr=f"tcp://127.0.0.1:{free_port()}",
        control_addr=f"tcp://127.0.0.1:{free_port()}",
        **({"heartbeat_s": 0.1, "peer_timeout_s": 10, "startup_timeout_s": 10} | kw),
    )
    want = Expected(groups=1, group_size=2, arrays=frozenset(), vocab_size=1000)
    trainer = TrainerEndpoint(cfg, Ledger(), want, 0, max_held=4)
    sampler = SamplerEndpoint(cfg, "sampler-0", Spool(tmp_path, max_batches=max_batches))
    return trainer, sampler


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_a_refused_batch_leaves_no_trace_and_the_real_one_is_taken(tmp_path, caplog):
    """findings 1, 2, 4: a peer sends, under the real sampler's id and seq, a batch that fails
    decoding (a reward of 1e39) and one that decodes but does not fit (2 groups), and one under
    a made-up id. Each is one line naming the peer and the field, is counted, and marks nothing:
    the ledger, the held batches and the pool are as before, the real sampler is not stopped by
    the rejection meant for the other peer's batch, and its batch 0 is then trained."""
    caplog.set_level(logging.INFO)
    trainer, sampler = _endpoints(tmp_path)
    rogue = zmq.Context.instance().socket(zmq.PUSH)
    rogue.setsockopt(zmq.LINGER, 0)
    got: list[EpisodeBatch] = []
    try:
        sampler.wait_for_trainer()
        rogue.connect(trainer.transport.episodes_addr)
        rogue.send_multipart(_tampered(_batch(0), reward=[1e39, 0.0]))
        rogue.send_multipart(encode_batch(_batch(0, groups=2)))
        rogue.send_multipart(encode_batch(_batch(0, "ghost", groups=2)))
        # Issue 62, finding 5: well-formed, but numbered past any spool (it was held, then
        # trained out of order, its gap once listed whole in a log line): refused on arrival.
        rogue.send_multipart(encode_batch(_batch(2**40)))
        taker = threading.Thread(target=lambda: got.append(trainer.next_batch(lambda: None)))
        taker.start()
        assert _wait(lambda: trainer.rejected_batches == 3 and trainer.channel.rejected_frames)
        assert trainer.ledger.consumed == {} and trainer.order.held == {}
        assert "ghost" not in trainer.pool.members
        assert trainer.counters()["rejected_batches"] == 3
        assert trainer.counters()["rejected_frames"] == 1
        ignored = "ignored a rejection of batch 0"
        assert _wait(lambda: any(ignored in r.getMessage() for r in caplog.records))
        assert not sampler.stopped.is_set(), sampler.status.stop_reason
        sampler.send(_batch(0), {"next_seq": 1})
        taker.join(10)
        assert [b.seq for b in got] == [0] and got[0].sampler_id == "sampler-0"
    finally:
        rogue.close()
        sampler.close()
        trainer.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("'sampler-0'" in m and "reward holds" in m for m in lines), lines
    assert any("from sampler-0" in m and "2 groups" in m for m in lines), lines


def test_rejections_of_batches_others_sent_in_its_name_cost_the_sampler_a_few_lines(
    tmp_path, caplog
):
    """Issue 62, item 5: each rejection of a batch a peer sent in the sampler's name was a
    warning line in the sampler's log, as many as the peer sent batches (379 in 8 s of the
    flood in bench/hostile.py). They are counted, and logged at the refusals' rate."""
    from grpo.wire.codec import Message

    trainer, sampler = _endpoints(tmp_path)
    try:
        for seq in range(1000):
            body = {"sampler_id": "sampler-0", "seq": seq, "tag": bytes(16), "sealed": b"r"}
            sampler._heard(Message(messages.REJECTED, body))
        assert sampler.others_rejected == 1000 and not sampler.stopped.is_set()
    finally:
        sampler.close()
        trainer.close()
    lines = [r for r in caplog.records if "ignored a rejection of batch" in r.getMessage()]
    assert 10 < len(lines) <= 20, len(lines)


def test_a_rejected_batch_of_its_own_stops_the_sampler_and_stays_spooled(tmp_path):
    """finding 4: the sampler's own batch refused: it stops with the trainer's reason (every
    later batch would be refused too), instead of resending it; the batch stays in the spool
    for a trainer restarted with the matching config. Issue 62, finding 2: another subscriber
    of the control channel hears that batch 0 was rejected, not why (the reason taught a
    forger the batch shape the trainer expects)."""
    trainer, sampler = _endpoints(tmp_path)
    listener = zmq.Context.instance().socket(zmq.SUB)
    listener.setsockopt(zmq.LINGER, 0)
    listener.setsockopt(zmq.SUBSCRIBE, b"")
    listener.connect(trainer.transport.control_addr)
    try:
        sampler.wait_for_trainer()
        time.sleep(0.3)  # the listener's subscription reaches the trainer's PUB
        sampler.send(_batch(0, groups=2), {"next_seq": 1})
        taker = threading.Thread(target=trainer.next_batch, args=(lambda: None,))
        taker.start()
        assert sampler.stopped.wait(10)
        assert sampler.status.stop_reason.startswith("the trainer rejected batch 0: it has 2")
        assert sampler.spool.pending() == [0]
        heard = []
        deadline = time.monotonic() + 2  # the control channel also carries heartbeats
        while time.monotonic() < deadline:
            if not listener.poll(100):
                continue
            frames = listener.recv_multipart()
            if (msg := decode(frames)).kind == messages.REJECTED:
                heard.append((msg.body, b"".join(frames)))
        assert len(heard) == 1
        body, raw = heard[0]
        assert body["seq"] == 0 and "reason" not in body
        assert b"groups" not in raw and b"it has" not in raw
        other = zmq.Context.instance().socket(zmq.PUSH)  # a batch that fits ends the wait
        other.setsockopt(zmq.LINGER, 0)
        other.connect(trainer.transport.episodes_addr)
        other.send_multipart(encode_batch(_batch(0, "sampler-1")))
        taker.join(10)
        other.close()
    finally:
        listener.close()
        sampler.close()
        trainer.close()


def test_waiting_for_room_that_never_comes_is_a_stall(tmp_path):
    """finding 4: a full spool of batches the trainer never takes left the sampler waiting in
    a phase the stall check did not count, while the trainer waited for a batch: a silent
    hang. Waiting for room is now working on delivery; with nothing moving it is a stall."""
    trainer, sampler = _endpoints(tmp_path, max_batches=1, stall_timeout_s=0.5)
    trainer.channel.watchdog.limit_s = 0  # one process here: only the sampler's watches
    try:
        sampler.wait_for_trainer()
        sampler.spool.put(0, encode_batch(_batch(0)))  # spooled, never reaches the trainer
        waiter = threading.Thread(target=sampler.wait_for_room, daemon=True)
        waiter.start()
        assert sampler.stopped.wait(10), "the full spool was not counted as a stall"
        assert "no progress in delivering" in sampler.status.stop_reason
        assert ACTIVITY.snapshot().phase == DELIVERING
    finally:
        sampler.close()
        trainer.close()


def test_a_batch_the_trainer_keeps_passing_over_stops_the_sampler(tmp_path):
    """finding 4: a batch refused on arrival with no rejection the sampler can see (it fails
    decoding at the trainer) was resent every 10 heartbeats for ever, holding a spool slot."""
    trainer, sampler = _endpoints(tmp_path, heartbeat_s=0.05)
    try:
        sampler.wait_for_trainer()
        sampler.spool.put(0, _tampered(_batch(0), reward=[1e39, 0.0]))
        sampler.send(_batch(1), {"next_seq": 2})
        assert trainer.receive_batch(wait_s=5).seq == 1
        trainer.ledger.consume("sampler-0", 1)
        trainer.consumed()
        deadline = time.monotonic() + 20
        sampler.wait_until(lambda: time.monotonic() > deadline, "the test")
        assert sampler.stopped.is_set()
        assert "batch 0" in sampler.status.stop_reason
        assert "passed over" in sampler.status.stop_reason
    finally:
        sampler.close()
        trainer.close()
