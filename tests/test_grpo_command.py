"""`grpo TOOL ...` (grpo/__main__.py): every tool's --help is help, and a mistyped tool is named
with the nearest one (issue 64, item 5)."""

from __future__ import annotations

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
