"""The diagnosis rules, as a registry: each rule is one function registered with its stable
id, what it looks for and what it needs. Adding a rule is one function in one of these
modules plus its `@rule(...)` line; `fsdp_trace.diagnose.causes` orders and folds what they
find, and `scripts/rules_table.py` writes the README's table from this registry.

Thresholds are plain and named in each module. Every rule is tested on a trace that shows
its problem and on one where it must stay silent (tests/test_diagnosis*.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fsdp_trace.diagnose.context import Context
from fsdp_trace.diagnose.finding import Finding


@dataclass(frozen=True)
class Rule:
    id: str  # stable: tests, --fail-on and JSON name rules by it
    title: str
    fires_when: str  # one line for the README's table
    needs: str  # what the input must have ("" = any GPU trace)
    check: Callable[[Context], Finding | None]


RULES: dict[str, Rule] = {}


def rule(id: str, title: str, fires_when: str, needs: str = ""):
    """Register a rule function under a stable id."""

    def register(check: Callable[[Context], Finding | None]):
        if id in RULES:
            raise ValueError(f"rule {id!r} registered twice")
        RULES[id] = Rule(id, title, fires_when, needs, check)
        return check

    return register


def run_rules(ctx: Context) -> list[Finding]:
    """Every registered rule's finding on one run, in registry order."""
    return [f for r in RULES.values() if (f := r.check(ctx)) is not None]


# Registration happens on import; the order here is the registry's (and the README table's).
from fsdp_trace.diagnose.rules import communication, host, overlap, settings  # noqa: E402, F401
