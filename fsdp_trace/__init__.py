"""fsdp-trace: where FSDP2 communication is not hidden behind compute, block by block."""

__version__ = "0.1.0"
