"""Charts drawn on the server as SVG: nothing to download, nothing from the internet.

Labels come from the store (session ids, days), so every text and attribute put in
the SVG is escaped here; numbers are formatted from floats. The result is a
:class:`Drawn`, the one kind of markup the dashboard's templates print as is.
"""

from __future__ import annotations

import math
from html import escape

from markupsafe import Markup


class Drawn(Markup):
    """Markup this module built from escaped pieces. Templates print it unescaped; any other markup
    (whatever its source) is printed as text."""


def number(value: object) -> float:
    """A finite float, or 0.0: a value that is not a number (or is NaN, infinite) draws nothing."""
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def bars(values: list[tuple[str, float]], *, ceiling: float | None = None, width: int = 720, height: int = 160,
         title: str = "", unit: str = "$") -> Drawn:
    """A bar per (label, value), oldest left; ``ceiling`` drawn as a dashed line. Labels are text (any
    redaction comes before): they are escaped here."""
    width, height = int(width), int(height)
    values = [(str(label), max(0.0, number(value))) for label, value in values]
    ceiling = number(ceiling) if ceiling is not None else None
    unit, title = escape(str(unit)), str(title)
    if not values:
        return Drawn(f'<svg class="chart" width="{width}" height="40" role="img"><text x="8" y="24">no data</text>'
                     f'</svg>')
    top = max([v for _, v in values] + [ceiling or 0.0]) or 1.0
    pad_l, pad_b, pad_t = 56, 18, 14
    w, h = width - pad_l - 8, height - pad_b - pad_t
    step = w / len(values)
    out = [f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
           f'<title>{escape(title)}</title>',
           f'<text x="4" y="{pad_t + 4}" class="axis">{unit}{top:.4g}</text>',
           f'<text x="4" y="{pad_t + h}" class="axis">{unit}0</text>',
           f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" class="base"/>']
    bar_w = min(48.0, max(1.0, step * 0.8))  # a lone bar stays a bar, not the whole width
    for i, (label, value) in enumerate(values):
        bh = max(0.0, value / top * h)
        x = pad_l + i * step + (step - bar_w) / 2
        out.append(f'<rect x="{x:.1f}" y="{pad_t + h - bh:.1f}" width="{bar_w:.1f}" '
                   f'height="{max(bh, 1.0):.1f}" class="bar"><title>{escape(label)}: {unit}{value:.6f}</title></rect>')
        if len(values) <= 12:  # few bars: each says what it is
            out.append(f'<text x="{x:.1f}" y="{pad_t + h - bh - 3:.1f}" class="axis">{unit}{value:.4f}</text>')
    if len(values) <= 31:
        for i, (label, _) in enumerate(values[:: max(1, len(values) // 8)]):
            x = pad_l + i * max(1, len(values) // 8) * step
            out.append(f'<text x="{x:.1f}" y="{height - 4}" class="axis">{escape(label[-5:])}</text>')
    if ceiling is not None:
        y = pad_t + h - ceiling / top * h
        out.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + w}" y2="{y:.1f}" class="ceiling"/>'
                   f'<text x="{pad_l + w - 140}" y="{y - 3:.1f}" class="axis">ceiling {unit}{ceiling:g}</text>')
    out.append("</svg>")
    return Drawn("".join(out))
