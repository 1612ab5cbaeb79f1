"""Cost charts scaled to their data, the ceiling marked where it fits (``brainstem/operator/dashboard/charts.py``).

Hostile labels and values are tests/hostile/test_dashboard.py; here, the scale: real costs far under the
ceiling fill the chart (the ceiling then named, with how near the highest bar comes), a ceiling near the
data is a labelled line, and no data or only zeros still draws.
"""

from __future__ import annotations

import re

import pytest

from brainstem.operator.dashboard import charts


@pytest.mark.parametrize(("x", "top"), [(0.0031, 0.005), (0.004, 0.005), (0.011, 0.02), (0.05, 0.05), (2.3, 2.5),
                                        (7, 10), (0, 1.0)])
def test_an_axis_top_is_a_round_number_at_least_the_value(x, top):
    assert charts.nice(x) == pytest.approx(top)


def _heights(svg: str) -> list[float]:
    return [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', svg)]


def test_costs_far_under_the_ceiling_fill_the_chart_and_the_ceiling_is_named():
    svg = charts.bars([("1", 0.002), ("2", 0.004)], ceiling=0.5, height=160)
    assert max(_heights(svg)) > 90  # the tallest bar fills most of the 130 px plot, not 1 px of it
    assert 'class="ceiling"' not in svg
    assert "ceiling $0.5, above this scale; the highest bar is 0.8% of it" in svg
    assert charts.scale(0.004, 0.5) == (0.005, False)


def test_a_ceiling_near_the_data_is_a_labelled_line():
    svg = charts.bars([("1", 0.03), ("2", 0.045)], ceiling=0.05)
    assert svg.count('class="ceiling"') == 1 and ">ceiling $0.05</text>" in svg
    top, drawn = charts.scale(0.045, 0.05)
    assert drawn and top >= 0.05
    y = float(re.search(r'<line [^>]*y1="([0-9.]+)"[^>]*class="ceiling"', svg).group(1))
    tallest = max(_heights(svg))
    assert 16 <= y < 16 + 126 - tallest  # above the tallest bar, inside the plot
    over = charts.bars([("1", 0.08)], ceiling=0.05)  # a ceiling the data passed is drawn under its top
    assert 'class="ceiling"' in over


def test_no_data_and_only_zeros_still_draw():
    assert "no data" in charts.bars([], ceiling=1.0)
    zeros = charts.bars([("1", 0.0)], ceiling=0.05)
    assert 'class="ceiling"' in zeros and charts.scale(0.0, 0.05)[1]
    assert charts.scale(0.0, None) == (1.0, False) and 'ceiling' not in charts.bars([("1", 0.0)])
