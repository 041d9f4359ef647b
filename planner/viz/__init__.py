"""Pictures of plans: the compiled dependency graph (DOT/SVG/PNG/HTML) and measured timelines."""

from .dot import VizOptions, VizStats, to_dot
from .palette import kind_color, stream_color
from .timeline import render_timeline, timeline_svg

__all__ = ["VizOptions", "VizStats", "to_dot", "kind_color", "stream_color", "render_timeline", "timeline_svg"]
