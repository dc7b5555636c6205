"""`python -m fsdp_trace` (what torchrun runs on every rank)."""

from fsdp_trace.cli import run

if __name__ == "__main__":
    run()
