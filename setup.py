"""The compiled reader, an optional C extension (fsdp_trace/analysis/read/_fastread.c: trace
events straight into columns). Everything else about the package is in pyproject.toml. Where
it cannot be built (no C compiler), the install goes on without it and the loader decodes with
msgspec alone, to the same results."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fsdp_trace.analysis.read._fastread",
            sources=["fsdp_trace/analysis/read/_fastread.c"],
            depends=["fsdp_trace/analysis/read/_fastread_json.c"],  # #included by it
            optional=True,
        )
    ]
)
