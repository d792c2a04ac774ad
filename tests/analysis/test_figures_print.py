"""Every figure ``make figures`` writes is one a paper can print: at most 7 inches wide, no text under 7 pt at that
size, and no two colours a colour-blind reader cannot tell apart.

The figures are drawn from two packed results sweeps of the repository (``results/products``: ten cells, every
baseline and ablation, the claims; ``results/exchange``: the latent exchange, divergence), so the palette is checked
on the most cells any figure shows. Colour distance: CAM02-UCS (colorspacious) between the two colours as a reader
with full deuteranopia, and one with full protanopia, sees them (Machado et al.'s simulation at severity 100); every
pair in a figure at least ``analysis.figures.CVD_MIN_DISTANCE`` (10; a just-noticeable difference is about 1-2, and
the old palette's competitive red against self-refine's brown was 4.3). Pairs of two greys are left out: they differ
in lightness only, which colour blindness does not change. Colours drawn at alpha below 0.5 (bands, shading) are
left out too: they sit behind a full-strength line of the same colour.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from colorspacious import cspace_convert
from matplotlib.collections import Collection
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

import analysis.figures as figures
from analysis import load_runs

# every figure of two packed sweeps drawn and rendered (about 45 s of a core): make test-long, which CI runs
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = [ROOT / "results" / "products", ROOT / "results" / "exchange"]
MAX_WIDTH_IN = 7.0
CVD = ("deuteranomaly", "protanomaly")


def _rgba(color) -> list[tuple[float, float, float, float]]:
    array = np.atleast_2d(np.asarray(color, dtype=float)) if not isinstance(color, str) else np.array([to_rgba(color)])
    return [tuple(float(v) for v in to_rgba(c)) for c in array] if array.size else []


def colours(fig) -> set[tuple[float, float, float]]:
    """The opaque colours a figure draws its data and legend with (lines, markers, bars, points, text)."""
    skip = {id(fig.patch), *(id(ax.patch) for ax in fig.axes)}
    found = []
    for artist in fig.findobj():
        if not artist.get_visible() or id(artist) in skip:
            continue
        if isinstance(artist, Line2D):
            if artist.get_linestyle() not in ("None", "none", "", " "):
                found += _rgba(artist.get_color())
            if artist.get_marker() not in (None, "None", "none", ""):
                found += _rgba(artist.get_markerfacecolor()) + _rgba(artist.get_markeredgecolor())
        elif isinstance(artist, Patch):
            if artist.get_fill():
                found += _rgba(artist.get_facecolor())
            if artist.get_hatch():
                found += _rgba(artist.get_edgecolor())
        elif isinstance(artist, Collection):
            found += _rgba(artist.get_facecolor()) + _rgba(artist.get_edgecolor())
        elif isinstance(artist, Text) and artist.get_text().strip():
            found += _rgba(artist.get_color())
    return {(round(r, 3), round(g, 3), round(b, 3)) for r, g, b, a in found if a >= 0.5}


def _grey(rgb) -> bool:
    return max(rgb) - min(rgb) < 0.08


def cvd_distance(a, b) -> float:
    """The smaller CAM02-UCS distance between ``a`` and ``b`` as seen with full deuteranopia and protanopia."""
    out = []
    for kind in CVD:
        space = {"name": "sRGB1+CVD", "cvd_type": kind, "severity": 100}
        seen = [np.clip(cspace_convert(np.array(c), space, "sRGB1"), 0, 1) for c in (a, b)]
        ucs = [cspace_convert(c, "sRGB1", "CAM02-UCS") for c in seen]
        out.append(float(np.linalg.norm(ucs[0] - ucs[1])))
    return min(out)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{(sweep, figure name): (figure's text sizes, colours, PNG path)} of every figure both sweeps make."""
    out: dict = {}
    real_save = figures._save
    for sweep in SWEEPS:
        target = tmp_path_factory.mktemp(sweep.name)
        record = {}

        def save(fig, where, name, record=record):
            sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
            labels = [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_fontsize() < 7
                      and t.get_text().strip()]
            record[name] = (sizes, labels, colours(fig))
            return real_save(fig, where, name)

        figures._save = save
        try:
            figures.make_figures(load_runs([sweep]), target)
        finally:
            figures._save = real_save
        for name, (sizes, labels, found) in record.items():
            out[(sweep.name, name)] = (sizes, labels, found, target / f"{name}.png")
    return out


def test_every_figure_is_drawn(drawn):
    names = {name for _, name in drawn}
    assert {"accuracy_grid", "trace_length", "training_curves", "conversion_regression", "recap_diagnostic",
            "divergence", "claims_forest"} <= names


def test_no_figure_is_wider_than_a_page(drawn):
    dpi = figures.STYLE["savefig.dpi"]
    for key, (_, _, _, png) in drawn.items():
        height, width = matplotlib.image.imread(png).shape[:2]
        assert width / dpi <= MAX_WIDTH_IN, f"{key}: {width / dpi:.2f} in wide"


def test_no_text_under_7_points(drawn):
    for key, (sizes, small, _, _) in drawn.items():
        assert sizes and min(sizes) >= figures.MIN_FONT, f"{key}: {min(sizes)} pt, e.g. {small[:3]}"


def test_every_pair_of_colours_is_told_apart_with_colour_blindness(drawn):
    assert max(len(found) for _, _, found, _ in drawn.values()) >= 10  # the cells' palette is in what is checked
    for key, (_, _, found, _) in drawn.items():
        for a, b in itertools.combinations(sorted(found), 2):
            if _grey(a) and _grey(b):
                continue
            distance = cvd_distance(a, b)
            assert distance >= figures.CVD_MIN_DISTANCE, f"{key}: {a} and {b} are {distance:.1f} apart"


def test_the_old_palette_fails_the_check():
    """The check can fail: competitive's old red against self-refine's old brown, and the old conversion green
    against the regression red."""
    assert cvd_distance(to_rgba("#c44e52")[:3], to_rgba("#937860")[:3]) < figures.CVD_MIN_DISTANCE
    assert cvd_distance(to_rgba("#55a868")[:3], to_rgba("#c44e52")[:3]) < figures.CVD_MIN_DISTANCE
