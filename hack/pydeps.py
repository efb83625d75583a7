"""Print the requirement lines of pyproject.toml (core deps plus the named extras), one per line.

The test venv installs dependencies only; the working tree is put on PYTHONPATH, so a cached venv can serve
any checkout without a stale copy of the package shadowing it.
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
lines = list(project["dependencies"])
for extra in sys.argv[2:]:
    lines += project["optional-dependencies"][extra]
print("\n".join(lines))
