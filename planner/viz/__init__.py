"""Pictures of plans: the compiled dependency graph (DOT/SVG/PNG/HTML) and measured timelines."""

import importlib

__all__ = ["VizOptions", "VizStats", "to_dot", "kind_color", "stream_color", "render_timeline", "timeline_svg"]

# the CLI imports planner.viz.render on every command: the drawing modules load when first named
_HOME = {"VizOptions": "dot", "VizStats": "dot", "to_dot": "dot", "kind_color": "palette",
         "stream_color": "palette", "render_timeline": "timeline", "timeline_svg": "timeline"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
