"""The documentation site fails to build on a broken example or a broken link.

Builds a tiny site (two pages) with the real ``mkdocs.yml`` settings and ``docs/hooks.py``,
not the whole site (``make docs`` does that). Skipped unless the docs extra is installed
(``pip install -e '.[docs]'``, as ``make docs`` does).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

for module in ("mkdocs", "material", "markdown_exec", "mkdocstrings", "yaml"):
    pytest.importorskip(module, reason="needs the docs extra: pip install -e '.[docs]'")

import yaml  # noqa: E402


def _hooks():
    spec = importlib.util.spec_from_file_location("posenc_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(tmp_path: Path, pages: dict[str, str]) -> subprocess.CompletedProcess[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text)
    config.update(
        docs_dir=str(docs),
        site_dir=str(tmp_path / "site"),
        hooks=[str(ROOT / "docs" / "hooks.py")],
        nav=[{name.removesuffix(".md"): name} for name in pages],
    )
    config.pop("exclude_docs", None)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT / "src")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


GOOD = """# Good

```python
import math
print(math.sqrt(16.0))
```

```bash
this-command-does-not-exist --it-is-shown-not-run
```

[the other page](other.md)
"""

OTHER = "# Other\n\n```python\nx = 1\n```\n\n```python\nprint(x + 41)  # the page's blocks share a session\n```\n"


def test_hook_makes_every_python_fence_a_markdown_exec_block():
    hooks = _hooks()
    out = hooks.executed("```python\nprint(1)\n```\n\n```bash\nls\n```\n", "page_md")
    assert out.splitlines() == [
        '```python exec="on" session="page_md" source="above" result="text"',
        "import torch; torch.manual_seed(0)  # markdown-exec: hide",
        "print(1)",
        "```",
        "",
        "```bash",
        "ls",
        "```",
    ]
    kept = '```python exec="on" html="1"\nprint("<b>x</b>")\n```'
    assert hooks.executed(kept, "s") == kept


def test_docs_build_runs_the_examples(tmp_path):
    result = _build(tmp_path, {"index.md": GOOD, "other.md": OTHER})
    assert result.returncode == 0, result.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "4.0" in index  # the example's output is on the page
    assert "42" in (tmp_path / "site" / "other" / "index.html").read_text()


def test_docs_build_fails_on_a_broken_example(tmp_path):
    broken = "# Broken\n\n```python\nraise ValueError('this example is broken')\n```\n"
    result = _build(tmp_path, {"index.md": broken})
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "Execution of python code block exited with errors" in log
    assert "this example is broken" in log and "strict mode" in log


def test_docs_build_fails_on_a_broken_link(tmp_path):
    result = _build(tmp_path, {"index.md": "# Links\n\n[nowhere](missing.md)\n"})
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "missing.md" in log and "strict mode" in log


def test_docs_build_fails_on_a_broken_api_reference(tmp_path):
    result = _build(tmp_path, {"index.md": "# Refs\n\n[gone][posenc.no_such_name]\n"})
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "posenc.no_such_name" in log and "strict mode" in log
