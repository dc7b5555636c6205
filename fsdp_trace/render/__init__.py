"""Rendering of analysis results (terminal, files, HTML, Perfetto): apart from computing."""
