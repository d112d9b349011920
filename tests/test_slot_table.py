"""The slot table every engine written to slots keeps (grpo.rollout.slots.SlotTable) and the
saved answers a resumed sampler puts back (Answer.to_state / from_state)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo.rollout.slots import Answer, SlotRequest, SlotTable


def answer(slot: int, uid: int = 0) -> Answer:
    return Answer(SlotRequest(uid, np.zeros(2, np.int32), 7, 4), slot)


def test_new_answers_take_the_lowest_free_slots_up_to_a_full_engine() -> None:
    table = SlotTable(3)
    table.seat([SlotRequest(0, np.zeros(2, np.int32), 0, 4)])
    seated = table.seat([SlotRequest(k, np.zeros(2, np.int32), 0, 4) for k in (1, 2)])
    assert [a.slot for a in seated] == [1, 2] and table.free_slots() == []
    with pytest.raises(ValueError, match="1 answers admitted, 0 slots free"):
        table.seat([SlotRequest(3, np.zeros(2, np.int32), 0, 4)])


def test_saved_answers_go_back_into_their_own_slots_and_nowhere_else() -> None:
    table = SlotTable(3)
    table.reseat([answer(2, 1), answer(0, 2)])
    assert table.free_slots() == [1] and [a.slot for a in table.in_flight()] == [0, 2]
    with pytest.raises(ValueError, match="no answers in flight"):
        table.reseat([answer(1)])
    for slots in ([1, 1], [3], [-1]):  # an occupied slot, one past the table, a negative one
        with pytest.raises(ValueError, match="cannot restore an answer into slot"):
            SlotTable(3).reseat([answer(s, k) for k, s in enumerate(slots)])


def test_an_answer_saved_before_multi_turn_restores_as_one_turn_without_tools() -> None:
    state = answer(1).to_state()
    for key in ("turns", "tool_calls", "tool_errors", "mask"):
        del state[key]
    back = Answer.from_state(state)
    assert (back.turns, back.tool_calls, back.tool_errors, back.mask) == (1, 0, 0, None)
    assert back.to_state() == answer(1).to_state()
