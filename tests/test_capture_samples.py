"""sample_traces/README.md lists each shipped run's command exactly as its run.json records it
(a sweep's points, and any run whose name another shipped run shares, under their path in
sample_traces/)."""

from __future__ import annotations

import json
import re

from tests.conftest import SAMPLES


def readme_commands() -> dict[str, str]:
    """`# name` comment lines in the README's bash blocks, each followed by its command."""
    text = (SAMPLES / "README.md").read_text()
    commands = {}
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        name = None
        for line in block.splitlines():
            if line.startswith("# ") and name is None:
                name = line[2:].split()[0].rstrip(":")
            elif line.startswith("fsdp-trace ") and name is not None:
                commands[name] = line
                name = None
    return commands


def test_every_shipped_run_has_its_recorded_command_in_the_readme():
    listed = readme_commands()
    runs = sorted(SAMPLES.glob("**/run.json"))
    assert len(runs) >= 20
    names = [path.parent.name for path in runs]
    for path in runs:
        run_dir = path.parent
        relative = run_dir.relative_to(SAMPLES)
        # a name two shipped runs share (a sweep's points, each tune's eager) goes by its path
        unique = names.count(run_dir.name) == 1 and not relative.parts[0].startswith("sweep-")
        name = run_dir.name if unique else relative.as_posix()
        recorded = json.loads(path.read_text())["command"]
        assert listed.get(name) == recorded, (name, recorded)
