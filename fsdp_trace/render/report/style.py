"""The report's fixed vocabulary of colours, fonts and the attribute the page sets once every
figure is drawn. One colour per meaning, everywhere in the report."""

from __future__ import annotations

COLORS = {
    "compute": "#4e79a7",
    "AllGather": "#59a14f",
    "AllGather forward": "#59a14f",
    "AllGather backward": "#8c6bb1",
    "ReduceScatter": "#f28e2b",
    "other": "#9c755f",
    "memory": "#bab0ac",
    "exposed": "#e15759",
    # The step breakdown's other parts (exposed transfer is "exposed" above).
    "recompute": "#a0cbe8",
    "fsdp_copy": "#76b7b2",
    "waiting": "#f1ce63",
    "exposed_unsplit": "#ff9d9a",
    "idle": "#c9ced6",
}
# The breakdown's parts (fsdp_trace.present.view.STACK_ORDER) → their colour.
PART_COLORS = {
    "compute_us": COLORS["compute"],
    "recompute_us": COLORS["recompute"],
    "fsdp_copy_us": COLORS["fsdp_copy"],
    "exposed_transfer_us": COLORS["exposed"],
    "exposed_wait_us": COLORS["waiting"],
    "exposed_unsplit_us": COLORS["exposed_unsplit"],
    "idle_us": COLORS["idle"],
}
PHASE_COLORS = {
    "forward": "#e3ebf4",
    "backward": "#f3e8dc",
    "recompute": "#efe3ee",
    "optimizer": "#e6e6e6",
}
BLOCK_CATEGORIES = ("AllGather forward", "AllGather backward", "ReduceScatter")
FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'
RENDERED_ATTRIBUTE = "data-fsdp-rendered"
