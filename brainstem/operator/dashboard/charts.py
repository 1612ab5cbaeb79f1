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


FIT = 2.0  # a ceiling up to this many times the highest bar is drawn in the chart; higher, it is named


def nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``x`` (> 0): an axis top."""
    if x <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(x))
    return next((m * power for m in (1, 2, 2.5, 5, 10) if m * power >= x * (1 - 1e-9)), 10 * power)


def scale(peak: float, ceiling: float | None) -> tuple[float, bool]:
    """The axis top for bars up to ``peak``, and whether ``ceiling`` is drawn on it: scaled to the data,
    taking the ceiling in only when it is near enough (within :data:`FIT` times the peak) to leave the bars
    readable; with no data at all, the ceiling is the scale."""
    if ceiling is not None and ceiling > 0 and (peak <= 0 or ceiling <= peak * FIT):
        return nice(max(peak, ceiling) * 1.05), True
    return nice(peak * 1.1) if peak > 0 else 1.0, False


def _money(unit: str, value: float) -> str:
    return f"{unit}{value:.4g}" if value >= 0.01 or value == 0 else f"{unit}{value:.2g}"


def bars(values: list[tuple[str, float]], *, ceiling: float | None = None, width: int = 720, height: int = 160,
         title: str = "", unit: str = "$") -> Drawn:
    """A bar per (label, value), oldest left, on a scale fitted to the values (:func:`scale`); ``ceiling``
    drawn as a labelled dashed line where it fits, else named above the chart with how near the highest
    bar comes to it. Labels are text (any redaction comes before): they are escaped here."""
    width, height = int(width), int(height)
    values = [(str(label), max(0.0, number(value))) for label, value in values]
    ceiling = number(ceiling) if ceiling is not None else None
    unit, title = escape(str(unit)), str(title)
    if not values:
        return Drawn(f'<svg class="chart" width="{width}" height="40" role="img"><text x="8" y="24">no data</text>'
                     f'</svg>')
    peak = max(v for _, v in values)
    top, drawn = scale(peak, ceiling)
    pad_l, pad_b, pad_t = 56, 18, 16
    w, h = width - pad_l - 8, height - pad_b - pad_t
    step = w / len(values)
    out = [f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
           f'<title>{escape(title)}</title>',
           f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l + w}" y2="{pad_t}" class="grid"/>',
           f'<line x1="{pad_l}" y1="{pad_t + h / 2:.1f}" x2="{pad_l + w}" y2="{pad_t + h / 2:.1f}" class="grid"/>',
           f'<text x="4" y="{pad_t + 4}" class="axis">{_money(unit, top)}</text>',
           f'<text x="4" y="{pad_t + h / 2 + 4:.1f}" class="axis">{_money(unit, top / 2)}</text>',
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
        every = max(1, len(values) // 8)
        for i, (label, _) in enumerate(values[::every]):
            x = pad_l + (i * every + 0.5) * step  # under the middle of its bar
            out.append(f'<text x="{x:.1f}" y="{height - 4}" class="axis tick">{escape(label[-5:])}</text>')
    out.append(_ceiling(ceiling, drawn, top, peak, unit, pad_l, pad_t, w, h))
    out.append("</svg>")
    return Drawn("".join(out))


def _ceiling(ceiling: float | None, drawn: bool, top: float, peak: float, unit: str, pad_l: int, pad_t: int,
             w: float, h: float) -> str:
    """The ceiling as a dashed line labelled at its right end, or, above the scale, named in the corner."""
    if ceiling is None or ceiling <= 0:
        return ""
    if drawn:
        y = pad_t + h - ceiling / top * h
        return (f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + w}" y2="{y:.1f}" class="ceiling"/>'
                f'<text x="{pad_l + w}" y="{max(y - 3, 10):.1f}" class="ceiling-note">'
                f'ceiling {unit}{ceiling:g}</text>')
    share = f"; the highest bar is {100 * peak / ceiling:.2g}% of it"
    return (f'<text x="{pad_l + w}" y="10" class="ceiling-note">ceiling {unit}{ceiling:g}, '
            f'above this scale{share}</text>')
