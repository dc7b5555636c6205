"""The diagnosis rules. Adding a rule is one function in one of these modules plus its
`@rule(...)` line (the registry: `fsdp_trace.diagnose.registry`); `fsdp_trace.diagnose.causes`
orders and folds what they find, and `scripts/rules_table.py` writes the README's table from
the registry.

Thresholds are plain and named in each module. Every rule is tested on a trace that shows
its problem and on one where it must stay silent (tests/test_diagnosis*.py).
"""

from fsdp_trace.diagnose.registry import RULES, Rule, rule, run_rules
from fsdp_trace.diagnose.rules import communication, host, overlap, settings, setups

__all__ = [
    "RULES",
    "Rule",
    "communication",
    "host",
    "overlap",
    "rule",
    "run_rules",
    "settings",
    "setups",
]
