"""The picture at the top of the README: the first screen of a real run's report.html, taken by
headless Chromium at 1400 × 900 (what a laptop shows before any scrolling).

    make analyze
    .venv/bin/python scripts/screenshot_report.py runs/smollm2-135m-python-reference docs/images/report_first_screen.png

Needs the `chromium` binary (Debian package `chromium`). The report is read, never changed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path


def screenshot(report: Path, out: Path, width: int = 1400, height: int = 900) -> Path:
    """A PNG of the top ``width`` × ``height`` pixels of ``report`` once its figures have drawn."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("screenshot_report: chromium is not installed (apt install chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=8000", f"--window-size={width},{height}", f"--screenshot={out.resolve()}",
                    report.resolve().as_uri()], check=True, capture_output=True, timeout=180)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run folder (holds report.html)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    report = args.run / "report.html"
    if not report.is_file():
        raise SystemExit(f"screenshot_report: {report} does not exist: run tl-geometry analyze first")
    print(screenshot(report, args.out))


if __name__ == "__main__":
    main(sys.argv[1:])
