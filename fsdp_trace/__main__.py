"""`python -m fsdp_trace` (what torchrun runs on every rank)."""

from fsdp_trace.cli import main

if __name__ == "__main__":
    main()
