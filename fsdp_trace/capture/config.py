"""The knobs of one capture run: parsed once, recorded in run.json, and replayed to every rank."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsdp_trace.errors import UserError

DTYPES = ("bf16", "fp16", "fp32")
# The built-in presets (models.PRESETS has their shapes; a test keeps the two in step). Named
# here so a bad --model fails before any process starts, without importing torch.
PRESET_NAMES = ("tiny", "gpt-small", "gpt-1.3b")
AC_MODES = ("non-reentrant", "reentrant")
# Boolean knobs: the option that turns each on, and the one that turns it off.
SWITCHES = {
    "overwrite": ("--overwrite", "--no-overwrite"),
    "keep_last_unsharded": ("--keep-last-unsharded", "--reshard-last"),
    "shard_embeddings": ("--shard-embeddings", "--no-shard-embeddings"),
    "compile": ("--compile", "--no-compile"),
    "accum_no_sync": ("--accum-no-sync", "--accum-sync"),
}


def option_text(value: object) -> str:
    """A knob's value as the CLI takes it: `true`, `0.5`, `1` (not `1.0`), exact floats."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def is_factory(model: str) -> bool:
    """`package.module:factory` rather than a preset name."""
    return ":" in model


def parse_reshard(value: str | bool | int) -> bool | int:
    """`--reshard-after-forward` takes true / false / an int (reshard to a smaller group)."""
    if isinstance(value, bool | int):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on"):
        return True
    if text in ("false", "no", "off"):
        return False
    try:
        size = int(text)
    except ValueError:
        raise UserError(
            f"--reshard-after-forward must be true, false or an integer group size, not {value!r}"
        ) from None
    if size < 2:
        raise UserError("--reshard-after-forward as an integer must be a group size of at least 2")
    return size


def parse_root_reshard(value: str | bool) -> str | bool:
    """`--root-reshard-after-forward` takes default (FSDP2's own: the root is not resharded
    after forward), true or false; "default" stays a string, the others become booleans."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "default":
        return "default"
    if text in ("true", "yes", "on"):
        return True
    if text in ("false", "no", "off"):
        return False
    raise UserError(f"--root-reshard-after-forward must be default, true or false, not {value!r}")


def hsdp_shape(hsdp: int, world_size: int) -> tuple[int, int]:
    """(replicas, shards) of `--hsdp R` on `world_size` ranks: R must divide the world size."""
    if hsdp < 1:
        raise UserError(f"--hsdp must be a replica count of at least 1, not {hsdp}")
    if world_size % hsdp:
        divisors = [str(d) for d in range(1, world_size + 1) if world_size % d == 0]
        choices = f"{', '.join(divisors[:-1])} or {divisors[-1]}" if len(divisors) > 1 else "1"
        raise UserError(
            f"--hsdp {hsdp} does not divide the world size {world_size}: pass --hsdp {choices} "
            "(a divisor of the world size; 1 is plain FSDP)"
        )
    return hsdp, world_size // hsdp


@dataclass
class CaptureConfig:
    """Everything that shapes the measured step. Field names are the run.json keys."""

    model: str = "tiny"
    out: str = "fsdp-trace-run"
    overwrite: bool = False
    device: str = "auto"  # auto | cuda | cpu
    batch_size: int | None = None  # None: the preset's
    seq_len: int | None = None  # None: the preset's
    dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    hsdp: int = 1  # replicas of the HSDP mesh (replicate x shard); 1: a 1-D FSDP mesh
    reshard_after_forward: bool | int = True
    root_reshard_after_forward: bool | str = "default"  # "default": FSDP2's own for the root
    keep_last_unsharded: bool = False
    shard_embeddings: bool = False
    prefetch_forward: int = 0
    prefetch_backward: int = 0
    ac_coverage: float = 0.0
    ac_mode: str = "non-reentrant"
    compile: bool = False
    grad_accum: int = 1
    accum_no_sync: bool = False
    warmup_steps: int = 3
    timing_steps: int = 5
    timed_steps: int = 10
    seed: int = 0
    lr: float = 1e-4
    timeout_s: int = 300
    baseline: str | None = None
    straggler_rank: int | None = None
    straggler_delay_ms: float = 0.0

    def validate(self) -> CaptureConfig:
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.reduce_dtype not in DTYPES:
            raise UserError(
                f"--reduce-dtype must be one of {', '.join(DTYPES)}, not {self.reduce_dtype!r}"
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise UserError(f"--device must be auto, cuda or cpu, not {self.device!r}")
        if not 0.0 <= self.ac_coverage <= 1.0:
            raise UserError(f"--ac-coverage must be a fraction in [0, 1], not {self.ac_coverage}")
        if self.ac_mode not in AC_MODES:
            raise UserError(f"--ac-mode must be one of {', '.join(AC_MODES)}, not {self.ac_mode!r}")
        for name in ("prefetch_forward", "prefetch_backward", "warmup_steps", "timed_steps"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name.replace('_', '-')} must be >= 0")
        if self.hsdp < 1:
            raise UserError(
                f"--hsdp must be a replica count of at least 1, not {self.hsdp} "
                "(1: plain FSDP; R: R replicas of world/R shards)"
            )
        if self.grad_accum < 1:
            raise UserError("--grad-accum must be >= 1")
        if self.timing_steps < 1:
            raise UserError("--timing-steps must be >= 1")
        for name in ("batch_size", "seq_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1")
        if self.straggler_delay_ms < 0:
            raise UserError("--straggler-delay-ms must be >= 0")
        if self.timeout_s < 1:
            raise UserError(
                f"--timeout-s must be at least 1 second, not {self.timeout_s}: it is how long a "
                "collective waits for the other ranks before the job fails"
            )
        if not is_factory(self.model) and self.model not in PRESET_NAMES:
            raise UserError(
                f"--model {self.model!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor "
                "package.module:factory"
            )
        if is_factory(self.model) and (self.batch_size is None or self.seq_len is None):
            missing = " and ".join(
                f"--{n.replace('_', '-')}"
                for n in ("batch_size", "seq_len")
                if getattr(self, n) is None
            )
            raise UserError(
                f"--model {self.model} is your own factory: pass {missing} (tokens per step = "
                "batch x seq; use --seq-len 1 for a model without a sequence dimension)"
            )
        self.reshard_after_forward = parse_reshard(self.reshard_after_forward)
        self.root_reshard_after_forward = parse_root_reshard(self.root_reshard_after_forward)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def changed_knobs(self) -> list[str]:
        """The options of every knob that differs from its default, in field order (--model
        and --out apart: a recorded command always names them). Call on a validated config."""
        defaults = CaptureConfig()
        args: list[str] = []
        for spec in dataclasses.fields(self):
            name = spec.name
            value = getattr(self, name)
            default = getattr(defaults, name)
            if name in ("model", "out") or value == default:
                continue
            if name in SWITCHES:
                args.append(SWITCHES[name][0 if value else 1])
            elif value is not None:
                args += [f"--{name.replace('_', '-')}", option_text(value)]
        return args

    def capture_command(self, nproc_per_node: int, launch_args: Sequence[str] = ()) -> str:
        """The `fsdp-trace capture` command that reproduces this run: what run.json records
        (a sweep point records its own capture, not the sweep command)."""
        return shlex.join(
            [
                "fsdp-trace",
                "capture",
                "--model",
                self.model,
                "--nproc-per-node",
                str(nproc_per_node),
                *launch_args,
                "--out",
                self.out,
                *self.changed_knobs(),
            ]
        )

    def to_cli_args(self) -> list[str]:
        """The `capture` arguments that rebuild this config on every rank under torchrun."""
        args = ["--model", self.model, "--out", self.out, "--device", self.device]
        if self.overwrite:
            args.append("--overwrite")
        for name in ("batch_size", "seq_len"):
            if getattr(self, name) is not None:
                args += [f"--{name.replace('_', '-')}", str(getattr(self, name))]
        reshard = self.reshard_after_forward
        reshard_text = str(reshard).lower() if isinstance(reshard, bool) else str(reshard)
        args += [
            "--dtype",
            self.dtype,
            "--reduce-dtype",
            self.reduce_dtype,
            "--hsdp",
            str(self.hsdp),
            "--reshard-after-forward",
            reshard_text,
            "--root-reshard-after-forward",
            option_text(self.root_reshard_after_forward),
            "--prefetch-forward",
            str(self.prefetch_forward),
            "--prefetch-backward",
            str(self.prefetch_backward),
            "--ac-coverage",
            repr(self.ac_coverage),
            "--ac-mode",
            self.ac_mode,
            "--warmup-steps",
            str(self.warmup_steps),
            "--timing-steps",
            str(self.timing_steps),
            "--timed-steps",
            str(self.timed_steps),
            "--grad-accum",
            str(self.grad_accum),
            "--seed",
            str(self.seed),
            "--lr",
            repr(self.lr),
            "--timeout-s",
            str(self.timeout_s),
        ]
        args.append("--keep-last-unsharded" if self.keep_last_unsharded else "--reshard-last")
        args.append("--shard-embeddings" if self.shard_embeddings else "--no-shard-embeddings")
        args.append("--compile" if self.compile else "--no-compile")
        args.append("--accum-no-sync" if self.accum_no_sync else "--accum-sync")
        if self.baseline:
            args += ["--baseline", self.baseline]
        if self.straggler_rank is not None:
            args += [
                "--straggler-rank",
                str(self.straggler_rank),
                "--straggler-delay-ms",
                repr(self.straggler_delay_ms),
            ]
        return args
