"""``fedhet report``: one self-contained HTML page per run or folder of runs, with every
figure embedded and the algorithm's reports; opened in headless Chromium when installed."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fedhet.cli import main


class Page(HTMLParser):
    """The parts of the page a reader relies on."""

    def __init__(self):
        super().__init__()
        self.images: list[bytes] = []
        self.headings: list[str] = []
        self.tables = 0
        self.details = 0
        self._tag = None

    def handle_starttag(self, tag, attrs):
        self._tag = tag
        attrs = dict(attrs)
        if tag == "img":
            src = attrs.get("src", "")
            assert src.startswith("data:image/png;base64,"), "figures must be embedded"
            self.images.append(base64.b64decode(src.split(",", 1)[1]))
        self.tables += tag == "table"
        self.details += tag == "details"

    def handle_data(self, data):
        if self._tag in ("h1", "h2", "h3") and data.strip():
            self.headings.append(data.strip())

    def handle_endtag(self, tag):
        self._tag = None


@pytest.fixture
def runs(finished_runs) -> Path:
    """The session's finished runs (salf and fedstale), read only: pages are written elsewhere."""
    return finished_runs


def _parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_a_run_report_holds_figures_summary_config_and_algorithm_reports(runs, tmp_path):
    assert main(["report", str(runs / "fedstale"), "--out", str(tmp_path / "fedstale.html")]) == 0
    page = _parse(tmp_path / "fedstale.html")
    import matplotlib.image

    assert len(page.images) >= 4  # accuracy vs round and vs time, deadlines, participants
    for png in page.images:
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(io.BytesIO(png)).shape[0] > 100
    assert {"Summary", "Figures", "Configuration"} <= set(page.headings)
    text = (tmp_path / "fedstale.html").read_text()
    assert "participation.json" in text and "server_memory.json" in text and page.details >= 2
    assert "what each client spent over the run (clients.csv)" in text  # its distribution over clients


def test_a_folder_of_runs_gets_one_page_with_every_run(runs, tmp_path):
    assert main(["report", str(runs), "--out", str(tmp_path / "all.html")]) == 0
    page = _parse(tmp_path / "all.html")
    assert page.headings[0] == "runs: 2 runs"
    assert {"salf", "fedstale"} <= set(page.headings)
    assert page.tables >= 3 and len(page.images) >= 2 + 2 * 4


def test_report_of_something_else_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None, reason="headless check needs Debian's chromium (apt-get install chromium)"
)
def test_the_page_opens_in_headless_chromium(runs, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(runs), "--out", str(page)]) == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    parsed = Page()
    parsed.feed(dom)
    assert parsed.headings[0] == "runs: 2 runs" and len(parsed.images) == len(_parse(page).images)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1200) and pixels.std() > 0.05  # something was drawn
