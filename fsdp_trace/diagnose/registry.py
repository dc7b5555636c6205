"""The rule registry: each rule is one function registered with its stable id, what it
looks for and what it needs (fsdp_trace/diagnose/rules/ holds the rules themselves)."""

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
    # Costs read collectives' times: without a cross-rank match they may include waiting
    # for peers (an upper bound), never the transfer alone.
    communication: bool = False


RULES: dict[str, Rule] = {}


def rule(id: str, title: str, fires_when: str, needs: str = "", communication: bool = False):
    """Register a rule function under a stable id."""

    def register(check: Callable[[Context], Finding | None]):
        if id in RULES:
            raise ValueError(f"rule {id!r} registered twice")
        RULES[id] = Rule(id, title, fires_when, needs, check, communication)
        return check

    return register


def run_rules(ctx: Context) -> list[Finding]:
    """Every registered rule's finding on one run, in registry order."""
    return [f for r in RULES.values() if (f := r.check(ctx)) is not None]
