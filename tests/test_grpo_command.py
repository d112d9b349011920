"""`grpo TOOL ...` (grpo/__main__.py): every tool's --help is help, and a mistyped tool is named
with the nearest one (issue 64, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo.__main__ import TOOLS, main


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_s_help_exits_0_with_its_usage(tool, capsys):
    try:
        code = main([tool, "--help"])
    except SystemExit as done:  # argparse's --help
        code = done.code
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("usage:") and tool in out.out.splitlines()[0], out.out
    assert "config file not found" not in out.out + out.err
    # what it does, in whole sentences (merge-lora's was its docstring's first line, cut off)
    said = [p for p in out.out.split("\n\n")[1:2] if not p.startswith(("positional", "options"))]
    assert all(p.rstrip().endswith((".", ")")) for p in said), said


def test_a_mistyped_tool_gets_the_nearest_one(capsys):
    assert main(["chek", "configs/cpu_demo.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tool 'chek' (did you mean check?)" in err[0], err
    assert main(["zzz"]) == 2
    err = capsys.readouterr().err
    assert "no tool 'zzz'; usage: grpo {launch," in err and "did you mean" not in err
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("usage: grpo {launch,")


def test_grpo_check_from_the_user_s_dir_opens_the_run_dir_launch_sh_writes(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """launch.sh runs the roles from the repository, where a relative output_dir is; `grpo
    check` run from the user's own dir opened that dir's `checkpoints/` instead, so a file of
    that name there failed a config whose run would work (and a writable dir there passed one
    whose run would not)."""
    from tests.conftest import free_port

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").write_text("my notes, not the runs\n")
    ports = [f"transport.{k}_addr=tcp://127.0.0.1:{free_port()}"
             for k in ("episodes", "control", "weights")]  # fmt: skip
    demo = Path(__file__).resolve().parents[1] / "configs" / "cpu_demo.yaml"
    args = ["check", str(demo), f"model.path={tiny_model_dir}",
            "rollout.backend=hf", "output_dir=checkpoints", *ports]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == "config ok"


@pytest.mark.parametrize("args", [["launch", "--help"], ["launch"]], ids=["help", "no-config"])
def test_grpo_launch_says_its_usage_as_every_tool_does(args):
    """`grpo launch --help` (launch.sh's) printed launch.sh's header with no usage line, where
    every other tool's --help opens with `usage:` (issue 64's mistake table)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "grpo", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == (0 if "--help" in args else 2), done.stderr
    assert done.stdout.startswith("usage: bash launch.sh CONFIG.yaml"), done.stdout
