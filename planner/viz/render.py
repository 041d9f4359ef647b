"""Turn DOT text into SVG/PNG with the Graphviz `dot` binary, and SVG into an HTML page.

Graphviz is the only renderer: the `graphviz` Python package shells out to the same
binary, so it adds nothing here. `dot` is looked up on PATH (or $PLANNER_DOT) and run as
a subprocess with a timeout; a missing binary, a timeout or a crash is a RenderError with
a message that says what to install or change, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["RenderError", "find_dot", "render_dot", "html_page", "INSTALL_HINT", "FORMATS"]

FORMATS = ("svg", "png", "dot", "html")
INSTALL_HINT = ("install Graphviz for the `dot` binary: `apt-get install graphviz` (Debian/Ubuntu), "
                "`brew install graphviz` (macOS) or `conda install graphviz`")


class RenderError(Exception):
    """The picture could not be rendered (no renderer, timeout, renderer failure)."""


def find_dot() -> str | None:
    """Path of the `dot` binary, or None. $PLANNER_DOT overrides the PATH lookup ('' disables)."""
    import shutil  # here, not at import: the CLI imports this module for FORMATS on every command

    env = os.environ.get("PLANNER_DOT")
    if env is not None:
        return shutil.which(env) if env else None
    return shutil.which("dot")


def render_dot(dot_text: str, fmt: str, timeout: float = 120.0, engine: str | None = None) -> bytes:
    """Run Graphviz on `dot_text`; fmt is 'svg' or 'png'."""
    import subprocess

    exe = find_dot()
    if exe is None:
        raise RenderError(f"no Graphviz renderer found; {INSTALL_HINT}")
    cmd = [exe, f"-T{fmt}"]
    if engine:
        cmd.append(f"-K{engine}")
    try:
        res = subprocess.run(cmd, input=dot_text.encode(), capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RenderError(f"Graphviz took longer than {timeout:g} s; raise --timeout, or drop --expand"
                          " so repeated layers are collapsed") from None
    except OSError as exc:
        raise RenderError(f"could not run {exe}: {exc}") from None
    if res.returncode != 0 or not res.stdout:
        err = res.stderr.decode(errors="replace").strip().splitlines()
        raise RenderError(f"Graphviz failed (exit {res.returncode}): {' / '.join(err[-3:]) or 'no output'}")
    return res.stdout


def html_page(svg: str, title: str) -> str:
    """A self-contained page: the SVG inline, zoomable with the browser, nothing fetched."""
    import html

    svg = svg[svg.find("<svg"):] if "<svg" in svg else svg
    t = html.escape(title)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{t}</title>
<style>
 body {{ margin: 0; font-family: Helvetica, Arial, sans-serif; background: #fafafa; }}
 header {{ padding: 8px 14px; border-bottom: 1px solid #ddd; background: #fff; }}
 main {{ overflow: auto; padding: 10px; }}
 main svg {{ height: auto; max-width: none; }}
</style></head>
<body><header><b>{t}</b> &mdash; hover a node for its id, stream, inputs and events</header>
<main>
{svg}
</main></body></html>
"""


def write_bytes(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
