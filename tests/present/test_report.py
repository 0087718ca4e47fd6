"""The HTML report: untrusted strings escaped, every figure rendered in a real browser (Chromium)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import tl_geometry as tlg
from tl_geometry import plots
from tl_geometry.intervene.pruning import TopNDeletion
from tl_geometry.label.taxonomy import REGIME_MEANING, REGIMES, regime_gloss
from tl_geometry.present.report import build_report, script_safe_json, write_report

from ..tiny import random_tokens, tiny_model

EVIL = "<script>document.title='pwned'</script>\"onmouseover=document.title='pwned' x=\"<img src=x onerror=document.title='pwned'>"


@pytest.fixture(scope="module")
def analysis():
    model = tiny_model(4, 2)
    res = tlg.analyze(model, random_tokens(4, 12), (1, 2, 4), repeats=2, progress=False, bootstrap=50)
    res.geometry.settings["corpus"] = EVIL  # user-given names are untrusted too
    scan = tlg.intervene.single_head_scan(model, random_tokens(2, 8), progress=False)
    importances = {"random": tlg.intervene.head_importance(model, method="random"),
                   "taxonomy": tlg.intervene.head_importance(model, method="taxonomy", taxonomy=res.taxonomy)}
    curve = tlg.intervene.pruning_curve(model, random_tokens(3, 8), importances, (1.0, 0.75, 0.5), progress=False)
    # A report test, not an intervention test: fixed values (the 3.x bridge cannot run top-N deletion)
    topn = [TopNDeletion((1, 2, 4), torch.tensor([0.8, 0.2, 0.01]), 3.0, False, {0.01: 4, 0.05: 4, 0.1: 4})]
    evil_figure = go.Figure(go.Bar(x=[EVIL, "ok"], y=[1, 2], hovertext=[EVIL, EVIL], name=EVIL))  # raw, unescaped
    return res, {"scan": scan, "pruning": curve, "topn": topn, "drilldowns": [evil_figure]}


class _Markup(HTMLParser):
    """Every tag and attribute of a page, and the text of its scripts."""

    def __init__(self):
        super().__init__()
        self.tags, self.attributes, self.scripts, self._in_script = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [name for name, _ in attrs]
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def test_untrusted_strings_cannot_open_tags_or_attributes(analysis):
    res, extras = analysis
    page = build_report(res, title=EVIL, **extras)
    markup = _Markup()
    markup.feed(page)
    assert "img" not in markup.tags and not {"onmouseover", "onerror"} & set(markup.attributes)
    assert not any(script.lstrip().startswith("document.title") for script in markup.scripts)  # only inside JSON strings
    assert page.count("<script>") == page.count("</script>")  # only our own script blocks
    assert "&quot;onmouseover=" in page or "&#34;onmouseover=" in page  # the title, escaped by the template
    assert script_safe_json({"a": "</script><b>&"}) == '{"a": "\\u003c/script\\u003e\\u003cb\\u003e\\u0026"}'
    assert plots.safe_text(EVIL).count("<") == 0


def test_report_lists_settings_claims_and_every_figure(analysis):
    res, extras = analysis
    page = build_report(res, **extras)
    for cid in [f"C{i}" for i in range(1, 12)]:
        assert f"<td>{cid}</td>" in page
    assert page.count('class="tlg-plot"') == 10  # 3 head maps (regime, gap, certified P), curves, sink, regimes, scan map, pruning, top-N, drill-down
    assert "Certified precision" in page
    assert "Plotly.newPlot" in page and "transformer_lens" in page


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
def test_report_renders_in_headless_chromium(analysis, tmp_path):
    res, extras = analysis
    path = write_report(res, tmp_path / "report.html", title="tl_geometry report", **extras)
    common = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000"]
    dom = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("js-plotly-plot") >= 9  # plotly marks every rendered container
    assert dom.stdout.count('class="main-svg"') >= 9
    assert "<title>tl_geometry report</title>" in dom.stdout  # no injected script renamed the page
    errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    assert not errors, errors
    shot = tmp_path / "report.png"
    subprocess.run([*common, "--window-size=1400,2400", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
def test_the_first_screen_answers_which_heads_do_what(analysis, tmp_path):
    """In a 1400 × 900 browser window, before any scrolling: the regime map with each label's
    meaning in its legend, the reading guide and the heads at a glance; settings and claims folded."""
    res, extras = analysis
    page = build_report(res, **extras)
    measure = """<script>setTimeout(function () {
      var seen = [];
      document.querySelectorAll('h2, h3, .legendtext, .tlg-guide dd, table').forEach(function (el) {
        var box = el.getBoundingClientRect();
        if (box.width > 0 && box.bottom <= 900 && box.right <= 1400) seen.push(el.tagName + ': ' + el.textContent.replace(/\\s+/g, ' ').trim().slice(0, 80));
      });
      var out = document.createElement('pre'); out.id = 'tlg-seen'; out.textContent = seen.join('\\n');
      document.body.appendChild(out);
    }, 1500);</script></body>"""
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", measure), encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000",
                          "--window-size=1400,900", "--dump-dom", path.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    seen = html.unescape(re.search(r'<pre id="tlg-seen">(.*?)</pre>', dom, re.S).group(1)).splitlines()
    assert seen[0] == "H2: What the heads do"
    for regime in REGIMES:
        assert f"text: {regime_gloss(regime)}" in seen  # the map's legend (svg text)
        assert any(line.startswith("DD: ") and f"{regime}: {REGIME_MEANING[regime]}" in line for line in seen)
    assert "H3: Heads at a glance: the surest of each regime" in seen
    assert any(line.startswith("TABLE: regime head share 95% interval queries head type") for line in seen)
    folded = re.findall(r"<details><summary>(.*?)</summary>", dom)
    assert folded == ["Run settings", "Claims of the paper and what this run measured"]


def test_head_rows_hold_json_nulls_and_booleans(analysis):
    import json

    res, _ = analysis
    page = build_report(res)
    rows = json.loads(re.search(r"var TLG_HEADS = (\{.*?\});\n", page).group(1).replace("\\u003c", "<")
                      .replace("\\u003e", ">").replace("\\u0026", "&"))
    table = res.heads_table()
    for name, flag, offset in zip(table["name"], table["label_uncertain"], table["dominant_offset"], strict=True):
        assert rows[name]["label_uncertain"] is bool(flag)  # a boolean, not the string "True"
        assert rows[name]["dominant_offset"] == (None if offset is pd.NA else int(offset))  # null, not "<NA>"
