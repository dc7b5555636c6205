"""fsdp-trace: where FSDP2 communication is not hidden behind compute, block by block.

    import fsdp_trace
    result = fsdp_trace.analyze("sample_traces/gpt-small-2gpu")

`analyze` is imported on first use, so `import fsdp_trace` stays light (capture needs only
torch, typer and rich).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fsdp_trace.pipeline import analyze
    from fsdp_trace.result import Result, RunAnalysis

__all__ = ["Result", "RunAnalysis", "__version__", "analyze"]


def __getattr__(name: str) -> Any:
    if name == "analyze":
        from fsdp_trace.pipeline import analyze

        return analyze
    if name in ("Result", "RunAnalysis"):
        from fsdp_trace import result

        return getattr(result, name)
    raise AttributeError(f"module 'fsdp_trace' has no attribute {name!r}")
