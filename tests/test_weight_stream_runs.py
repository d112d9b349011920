"""A whole run with weights.mode: stream and several samplers relaying versions to each other.
(A stream run whose trainer and sampler are SIGKILLed and resumed, ending with the shared-dir
run's weights bit for bit: tests/test_chaos.py.)"""

from __future__ import annotations

import re

import pytest

from tests.conftest import free_port, transport_overrides


@pytest.mark.extended  # CI leaves it out; relays: test_weight_fanout.py
@pytest.mark.slow
def test_three_samplers_relay_versions_down_a_chain_and_route_around_a_killed_one(
    tmp_path, tiny_model_dir
):
    """weights.fanout 1: the trainer sends each version to sampler-0, which passes it to
    sampler-1, which passes it to sampler-2. sampler-1 is SIGKILLed once sampler-2 has a
    version from it: sampler-2 goes up to sampler-0, and the run ends with the two left. A
    sampler relays only once vouched for (a batch of its own admitted: grpo/delivery/pool.py),
    so the first versions may come from the trainer to all three, or skip a link: the chain
    is asserted on the versions relayed."""
    from bench.common import kill_tree
    from tests.test_chaos import finish, rows_of, start, wait_for
    from tests.test_integration import tiny_config

    config = tiny_config(tmp_path, tiny_model_dir, train={"total_steps": 12, "num_ranks": 1})
    weights_addr = f"tcp://127.0.0.1:{free_port()}"
    overrides = [*transport_overrides(timeout_s=4), "rollout.num_samplers=3",
                 "weights.mode=stream", f"transport.weights_addr={weights_addr}",
                 "weights.fanout=1", "weights.transfer_timeout_s=1.5",
                 "weights.delta=true",  # no CURVE: the relays are the listed ids
                 "transport.relay_samplers=[sampler-0,sampler-1,sampler-2]"]  # fmt: skip
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "s0", "s1", "s2")}
    trainer = start("trainer", config, overrides, logs["trainer"])
    samplers = [
        start(
            "sampler",
            config,
            [*overrides, f"rollout.sampler_index={i}", f"rollout.sampler_id=sampler-{i}"],
            logs[f"s{i}"],
        )  # fmt: skip
        for i in range(3)
    ]

    def received(role: str) -> list[tuple[int, str, int]]:
        found = RECEIVED.findall(logs[role].read_text())
        return [(int(v), addr, int(n)) for v, addr, n in found]

    def relayed(role: str) -> list[tuple[int, str, int]]:
        return [got for got in received(role) if got[1] != weights_addr]

    def chained() -> list[int]:
        """Versions that went trainer -> sampler-0 -> sampler-1 -> sampler-2. sampler-1 takes
        relayed versions from sampler-0's relay only (the one before it in the chain), so
        sampler-2 took from sampler-1's any it got from another relay than that."""
        via_s0 = {addr for _, addr, _ in relayed("s1")}
        s1_versions = {v for v, _, _ in relayed("s1")}
        return sorted(v for v, addr, _ in relayed("s2") if addr not in via_s0 and v in s1_versions)

    wait_for(chained, "a version down the whole chain", [trainer, *samplers])
    down_the_chain = chained()
    kill_tree(samplers[1])
    finish([trainer, samplers[0], samplers[2]], timeout=400)
    text = {r: p.read_text() for r, p in logs.items()}
    for proc, role in ((trainer, "trainer"), (samplers[0], "s0"), (samplers[2], "s2")):
        assert proc.returncode == 0, text[role][-3000:]
    got = {role: received(role) for role in ("s0", "s1", "s2")}
    assert {addr for _, addr, _ in got["s0"]} == {weights_addr}  # the root of the chain
    relay_of_s0 = {addr for _, addr, _ in relayed("s1")}  # sampler-1's relayed versions: one
    assert len(relay_of_s0) == 1, got["s1"]  # parent, sampler-0
    from_s1 = [(v, a) for v, a, _ in relayed("s2") if a not in relay_of_s0]
    assert len({a for _, a in from_s1}) == 1, got["s2"]  # sampler-2's parent: sampler-1,
    after_kill = [a for v, a, _ in got["s2"] if v > max(v for v, _ in from_s1)]
    assert after_kill and set(after_kill) == relay_of_s0, got["s2"]  # then sampler-0
    # A version down the whole chain the trainer sent once (to sampler-0), not once a sampler.
    served = dict(re.findall(r"version (\d+): (\d+) bytes", text["trainer"]))
    first = down_the_chain[0]
    s0_bytes = next(n for v, _, n in got["s0"] if v == first)
    assert int(served[str(first)]) <= 1.2 * s0_bytes, (served, got["s0"])
    assert rows_of(tmp_path / "runs" / "tiny")[-1]["step"] == 12


RECEIVED = re.compile(r"weights: version (\d+) from (\S+) \((\d+) bytes\)")
