"""The knobs of one capture run: parsed once, recorded in run.json, and replayed to every rank."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import shlex
import sys
import textwrap
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


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring: the string literal right below the field in the
    class body (as torchtitan's and tyro's config classes document theirs), whitespace
    folded. The CLI's help for each option is this text; {} when the source is not there."""
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    body = _class_body(cls)
    if body is None:
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):  # no source (a frozen or zipped install): no help text
            return ()
        body = ast.parse(source).body[0].body
    docs = []
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs.append((node.target.id, " ".join(inspect.cleandoc(after.value.value).split())))
    return tuple(docs)


def _class_body(cls: type) -> list[ast.stmt] | None:
    """The body of `cls`'s class statement, from one parse of its module's file (what
    `inspect.getsource` finds by parsing that file and tokenizing it again, ~10x slower:
    every command line builds the capture options); None for a class not at the top of
    its module, or without a readable source file."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    try:
        tree = _parsed(path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__qualname__:
            return node.body
    return None


@functools.cache
def _parsed(path: str) -> ast.Module:
    with open(path, "rb") as fh:
        return ast.parse(fh.read())


def switch_options(name: str) -> tuple[str, str]:
    """The (on, off) options of a boolean knob."""
    flag = name.replace("_", "-")
    return SWITCHES.get(name, (f"--{flag}", f"--no-{flag}"))


# The capture command's help groups its options under these headings (every field in one;
# a test checks), and names the values some options take.
HELP_PANELS = {
    "Run": ("model", "out", "overwrite", "device", "batch_size", "seq_len", "baseline"),
    "FSDP2 knobs": (
        "dtype",
        "reduce_dtype",
        "hsdp",
        "reshard_after_forward",
        "root_reshard_after_forward",
        "keep_last_unsharded",
        "shard_embeddings",
        "prefetch_forward",
        "prefetch_backward",
        "ac_coverage",
        "ac_mode",
        "compile",
        "grad_accum",
        "accum_no_sync",
    ),
    "Steps": ("warmup_steps", "timing_steps", "timed_steps", "seed", "lr", "timeout_s"),
    "Diagnostics": ("straggler_rank", "straggler_delay_ms"),
}
METAVARS = {
    "model": "NAME",
    "out": "DIR",
    "baseline": "DIR",
    "device": "DEVICE",
    "dtype": "DTYPE",
    "reduce_dtype": "DTYPE",
    "reshard_after_forward": "true|false|N",
    "root_reshard_after_forward": "MODE",
    "ac_mode": "MODE",
    "ac_coverage": "FRACTION",
    "timeout_s": "SECONDS",
    "straggler_delay_ms": "MS",
    "lr": "LR",
}


@dataclass
class CaptureConfig:
    """Everything that shapes the measured step. Field names are the run.json keys; each
    field's docstring is its `fsdp-trace capture --help` text (the CLI is generated from
    these fields: name, type, default and help)."""

    model: str = "tiny"
    """A preset (tiny, gpt-small, gpt-1.3b) or your own package.module:factory."""
    out: str = "fsdp-trace-run"
    """Run directory to write traces and run.json into."""
    overwrite: bool = False
    """Reuse a non-empty --out (its old traces are deleted)."""
    device: str = "auto"
    """auto (CUDA+NCCL if GPUs, else CPU+gloo), cuda or cpu."""
    batch_size: int | None = None
    """Local batch per GPU (default: the preset's; required for a factory model)."""
    seq_len: int | None = None
    """Sequence length (default: the preset's; required for a factory model)."""
    dtype: str = "bf16"
    """Parameter/compute dtype of the mixed-precision policy: bf16, fp16 or fp32."""
    reduce_dtype: str = "fp32"
    """Gradient reduce-scatter dtype: fp32, bf16 or fp16."""
    hsdp: int = 1
    """Hybrid sharding: R replicas of world/R shards each (1: plain FSDP over all ranks)."""
    reshard_after_forward: bool | int = True
    """fully_shard's reshard_after_forward for every block: true, false, or a group size."""
    root_reshard_after_forward: bool | str = "default"
    """reshard_after_forward for the root unit: default (FSDP2's), true or false."""
    keep_last_unsharded: bool = False
    """Keep the last block (and the head unit) unsharded after forward: backward needs them
    at once (torchtitan's default)."""
    shard_embeddings: bool = False
    """Shard the embeddings and the norm+output head as their own units."""
    prefetch_forward: int = 0
    """Explicit forward prefetch depth (0: FSDP2's default)."""
    prefetch_backward: int = 0
    """Explicit backward prefetch depth (0: FSDP2's default of 1)."""
    ac_coverage: float = 0.0
    """Fraction of blocks under activation checkpointing, spread evenly."""
    ac_mode: str = "non-reentrant"
    """Checkpoint implementation: non-reentrant or reentrant."""
    compile: bool = False
    """torch.compile each block."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    accum_no_sync: bool = False
    """Skip the reduce-scatter on non-final micro-batches."""
    warmup_steps: int = 3
    """Untimed steps before profiling."""
    timing_steps: int = 5
    """Steps in the lean timing trace."""
    timed_steps: int = 10
    """Un-profiled steps timed for tokens/s, MFU and memory."""
    seed: int = 0
    """Seed for weights and synthetic tokens."""
    lr: float = 1e-4
    """AdamW learning rate."""
    timeout_s: int = 300
    """Process-group timeout (at least 1 s): a stuck collective fails, never hangs."""
    baseline: str | None = None
    """A 1-GPU run directory: record scaling efficiency against it."""
    straggler_rank: int | None = None
    """Delay this rank's steps on the host (a slow data loader)."""
    straggler_delay_ms: float = 0.0
    """Host delay per step on --straggler-rank."""

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
            if name in BOOLEAN_FIELDS:
                args.append(switch_options(name)[0 if value else 1])
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
        """The `capture` arguments that rebuild this config on every rank under torchrun:
        every field as its option (a switch for each boolean; None left out)."""
        args: list[str] = []
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) and spec.name in BOOLEAN_FIELDS:
                args.append(switch_options(spec.name)[0 if value else 1])
            elif value is not None:
                text = repr(value) if isinstance(value, float) else option_text(value)
                args += [f"--{spec.name.replace('_', '-')}", text]
        return args


# The fields that are plain switches (reshard_after_forward is also bool-valued, but an option
# that takes true / false / N).
BOOLEAN_FIELDS = frozenset(
    f.name for f in dataclasses.fields(CaptureConfig) if f.type in ("bool", bool)
)
