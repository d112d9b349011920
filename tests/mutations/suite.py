"""The suite's own machinery: a skip CI must not have, the mutation runner's copy."""

from __future__ import annotations

from tests.mutations import Mutation

MUTATIONS = (
    Mutation(
        name="ci_skips_never_fail",
        item="skips CI can see: a must-run skip under CI=true fails the run",
        path="tests/ci_skips.py",
        old='os.environ.get("CI") == "true"',
        new='os.environ.get("CI") == "never"',
        tests=(
            "tests/test_suite_setup.py::"
            "test_a_skip_ci_must_not_have_fails_under_ci_and_every_skip_is_printed",
        ),
    ),
    Mutation(
        name="wandb_not_installed",
        item="13: the W&B test needs wandb, a dev requirement: missing, it fails, not skips",
        path="grpo/observe/run_log.py",
        old="""    def __init__(self, cfg: Config, mode: str, resumed_step: int = 0):
        import wandb
""",
        new="""    def __init__(self, cfg: Config, mode: str, resumed_step: int = 0):
        import wandb_is_not_installed as wandb  # noqa: F401
""",
        tests=("tests/test_evaluation.py::test_wandb_offline_run_records_the_scalars",),
    ),
    Mutation(
        name="runner_links_all_checkpoints",
        item="63.1: the mutation runner's copy links the checkout's whole checkpoints/ again",
        path="tests/mutations/__main__.py",
        old='LINKED = ("checkpoints/base",)\n',
        new='LINKED = ("checkpoints",)\n',
        tests=("tests/test_mutations.py::test_a_copy_s_run_dirs_resolve_inside_the_copy",),
    ),
)
