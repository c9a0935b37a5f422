"""Line charts as inline SVG, rendered on the server (no script, no inline style: the pages'
Content-Security-Policy allows neither; colours come from ``app.css`` by class).

:func:`line_chart` draws one or more series over shared time slots, with both axes, their
tick labels, an axis title, a legend and a ``<title>`` for screen readers; a missing value
(None) breaks its line. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from markupsafe import Markup

WIDTH = 640
HEIGHT = 220
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 30, 34
"""Margins in SVG units: the y axis' labels, the legend, the x axis' labels."""


@dataclass(frozen=True)
class Series:
    """One line: ``name`` (the legend's), ``css`` (its class: ``s-ok``, ``s-ko``, ...), one
    value per slot (None: no value there)."""

    name: str
    css: str
    values: Sequence[float | None]


def count(value: float) -> str:
    """A count or rate for an axis: ``12``, ``1.5``, ``2.4k``, ``3.1M``."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def seconds(value: float) -> str:
    """A duration in seconds for an axis: ``0``, ``12 ms``, ``1.5 s``, ``2 min``, ``1.5 h``."""
    if value == 0:
        return "0"
    if value < 1:
        return f"{value * 1000:.3g} ms"
    if value < 120:
        return f"{value:.3g} s"
    if value < 7200:
        return f"{value / 60:.3g} min"
    return f"{value / 3600:.3g} h"


def nice_ceiling(value: float) -> float:
    """The least of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop's last step always answers


def line_chart(title: str, slots: Sequence[datetime], series: Sequence[Series], *,
               y_label: str, y_format: Callable[[float], str] = count,
               chart_id: str = "chart") -> Markup:
    """An SVG line chart of ``series`` over ``slots`` (aware datetimes, oldest first, shown
    as UTC ``HH:MM``), titled ``title``, the y axis titled ``y_label`` and its ticks written
    by ``y_format``; ``chart_id``: the element's id (its ``<title>``'s is ``<id>-title``)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    n = len(slots)

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h - plot_h * v / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-labelledby="{escape(chart_id)}-title">',
           f'<title id="{escape(chart_id)}-title">{escape(title)}</title>']
    for k in range(5):  # the y axis: 0 .. top in quarters, a grid line each
        v = top * k / 4
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{escape(y_format(v))}</text>')
    labels = max(1, min(6, n))
    for k in range(labels):  # the x axis: up to 6 times, evenly spread
        i = round(k * (n - 1) / (labels - 1)) if labels > 1 else 0
        if n:
            anchor = "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 \
                else "middle"
            out.append(f'<text class="tick" x="{x(i):.1f}" y="{TOP + plot_h + 16}" '
                       f'text-anchor="{anchor}">{slots[i].strftime("%H:%M")}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" '
               f'y2="{TOP + plot_h}"/>')
    out.append(f'<text class="axis-label" x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 2}" '
               f'text-anchor="middle">time (UTC)</text>')
    out.append(f'<text class="axis-label" x="12" y="{TOP + plot_h / 2:.1f}" '
               f'text-anchor="middle" transform="rotate(-90 12 {TOP + plot_h / 2:.1f})">'
               f'{escape(y_label)}</text>')
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        for i, value in enumerate(s.values[:n]):
            if value is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((x(i), y(value)))
        for run in runs:
            if len(run) == 1:
                out.append(f'<circle class="line {escape(s.css)}" cx="{run[0][0]:.1f}" '
                           f'cy="{run[0][1]:.1f}" r="2"/>')
            elif run:
                points = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                out.append(f'<polyline class="line {escape(s.css)}" points="{points}"/>')
    lx = LEFT
    for s in series:  # the legend, above the plot
        out.append(f'<rect class="key {escape(s.css)}" x="{lx}" y="8" width="12" height="12"/>')
        out.append(f'<text class="legend" x="{lx + 16}" y="18">{escape(s.name)}</text>')
        lx += 24 + 7 * len(s.name)
    out.append("</svg>")
    return Markup("".join(out))  # every text above is escaped
