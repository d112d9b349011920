"""No orphans (grpo/runtime/lifetime.py): the death signal set only for a launcher's own
child, and in place when die_with_parent() returns; a child whose launcher is already gone exits."""

from __future__ import annotations

from tests.mutations import Mutation

_LIFETIME_TESTS = "tests/test_lifetime.py::"

MUTATIONS = (
    Mutation(
        name="lifetime_foreign_value_sets_the_death_signal",
        item="4: die_with_parent leaves a process it was not started for alone (asserted)",
        path="grpo/runtime/lifetime.py",
        old="        return  # not started by the launcher that set it",
        # The inherited variable obeyed: the death signal set, tying us to whatever our parent is.
        new="        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)\n"
        "        return  # not started by the launcher that set it",
        tests=(_LIFETIME_TESTS + "test_die_with_parent_ignores_an_inherited_or_foreign_value",),
    ),
    Mutation(
        name="lifetime_no_death_signal",
        item="12: a child started by its launcher dies with it (a handshake, not a sleep)",
        path="grpo/runtime/lifetime.py",
        old="libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)",
        new="libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)",  # signal 0: none
        tests=(
            _LIFETIME_TESTS + "test_a_child_dies_with_its_sigkilled_parent_only_when_named[set]",
        ),
    ),
    Mutation(
        name="lifetime_ancestor_watch_spares_the_engine",
        item="12: vLLM's engine and worker die with the sampler (a handshake, not a sleep)",
        path="grpo/runtime/lifetime.py",
        old="        for pid in between:",
        new="        for pid in between[1:]:",  # between = [the engine]: nothing is killed
        tests=(_LIFETIME_TESTS + "test_the_engine_and_its_worker_die_with_the_sampler",),
    ),
    Mutation(
        name="lifetime_parent_gone_before_the_check",
        item="12: a child whose launcher died before it called die_with_parent exits",
        path="grpo/runtime/lifetime.py",
        old="    if os.getppid() != wanted and alive(wanted):",
        new="    if os.getppid() != wanted:",  # as before: a launcher already gone reads as foreign
        tests=(
            _LIFETIME_TESTS
            + "test_a_child_whose_parent_died_before_it_called_die_with_parent_exits_at_once",
        ),
    ),
)
