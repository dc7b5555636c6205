"""The inferred configuration as the views list it: one (label, value, source) line per item,
the source saying whether the trace showed it, run.json said it, or a default is assumed."""

from __future__ import annotations

from typing import Any

from fsdp_trace import fmt
from fsdp_trace.analysis.job.config import From, InferredConfig
from fsdp_trace.vocab import Parallelism


def config_lines(config: InferredConfig) -> list[tuple[str, str, str]]:
    """(label, value, source) per configuration item, as the views list it."""
    units = config.units
    blocks = config.blocks
    others = [u.name for u in units if u.name not in blocks]

    def reshard_text() -> str:
        groups: dict[str, list[str]] = {}
        for u in units:
            value = u.reshard_after_forward.value
            text = "yes" if value is True else "no" if value is False else f"to {value} ranks"
            groups.setdefault(text, []).append(u.name)
        return "; ".join(f"{t}: {short_list(n)}" for t, n in groups.items()) or fmt.DASH

    def sources(items) -> str:
        found = sorted({i.reshard_after_forward.source for i in items})
        return ", ".join(found)

    mesh = config.mesh.value
    ckpt = config.checkpointed.value or []
    setup = config.setup.value
    fsdp2 = config.parallelism == Parallelism.FSDP2

    def source(text: str) -> str:
        """FSDP2's default is what an FSDP2 run does when its trace does not say; in another
        set-up it is only assumed."""
        return text if fsdp2 or text != From.DEFAULT else "assumed: the trace does not show it"

    if config.labels:
        unit_source = From.TRACE
    elif config.parallelism == Parallelism.FSDP1:
        unit_source = (
            f"{From.TRACE}: FSDP1's hooks, in order"
            if units
            else "not read: FSDP1's labels name no module and no collective was attributed"
        )
    else:
        unit_source = source(From.DEFAULT)
    lines = [
        ("set-up", setup.describe(), f"{config.setup.source}: {config.setup.evidence}"),
        *(
            [("CPU offload", "yes", f"{From.TRACE}: {setup.cpu_offload_evidence}")]
            if setup.cpu_offload
            else []
        ),
        *([("float8", "yes", f"{From.TRACE}: {setup.float8_evidence}")] if setup.float8 else []),
        ("mesh", mesh.describe(), config.mesh.source),
        ("world size", fmt.count(config.world_size.value), config.world_size.source),
        (
            "units",
            f"{len(units)}: {len(blocks)} blocks" + (f" + {'; '.join(others)}" if others else "")
            if units or fsdp2
            else fmt.DASH,
            unit_source,
        ),
        ("reshard after forward", reshard_text(), sources(units)),
        (
            "micro-batches per step",
            fmt.count(config.micro_batches.value),
            source(config.micro_batches.source),
        ),
        (
            "activation checkpointing",
            f"{len(ckpt)}/{len(blocks)} blocks" + (f" ({short_list(ckpt)})" if ckpt else ""),
            config.checkpointed.source,
        ),
        (
            "prefetch",
            f"forward {_prefetch(config.forward_prefetch.value, True)}, backward "
            f"{_prefetch(config.backward_prefetch.value, False)}",
            ", ".join(
                sorted(
                    {
                        source(config.forward_prefetch.source),
                        source(config.backward_prefetch.source),
                    }
                )
            ),
        ),
        ("torch.compile", "yes" if config.compiled.value else "no", config.compiled.source),
        ("reduce dtype", str(config.reduce_dtype.value or fmt.DASH), config.reduce_dtype.source),
    ]
    if config.parallelism not in (Parallelism.FSDP2, Parallelism.FSDP1):  # no FSDP units
        unit_rows = {"units", "reshard after forward", "prefetch", "reduce dtype"}
        lines = [line for line in lines if line[0] not in unit_rows]
    if (config.micro_batches.value or 1) > 1:
        lines.append(
            (
                "gradient sync",
                "last micro-batch only" if config.accum_no_sync.value else "every micro-batch",
                config.accum_no_sync.source,
            )
        )
    return lines


def _prefetch(depth: Any, forward: bool) -> str:
    if depth in (None, 0) and forward:
        return "implicit"
    return f"{fmt.plural(depth, 'unit')} ahead" if depth is not None else fmt.DASH


def short_list(names: list[str], limit: int = 4) -> str:
    """The first `limit` names, and how many there are when there are more."""
    names = list(names)
    return ", ".join(names[:limit]) + (f", … ({len(names)})" if len(names) > limit else "")
