"""Helpers for tests/test_browser.py: a Jupyter server on 127.0.0.1 in a private
folder, Debian's Chromium driven by Playwright for Python, and the page-side
measurements (visible text, contrast ratios).

Nothing is downloaded at run time: the browser is the system's ``chromium``
(``apt-get install chromium``), reached through Playwright's ``executable_path``
(never ``playwright install``), and everything it loads comes from the local
server.  Every Jupyter folder (config, data, runtime, settings, workspaces) is
private to the test, so nothing of the user's ``~/.jupyter`` is read or written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CHROMIUM", "CHROMIUM_ARGS", "JupyterServer", "browser_context", "missing", "run_all_cells",
    "wait_kernel_idle", "low_contrast", "visible_text", "console_errors", "broken_words", "lines_of",
]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags that keep Chromium off the network and quick to start on a closed machine.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


def missing() -> str | None:
    """Why the browser test cannot run here, or ``None``."""
    if not Path(CHROMIUM).exists():
        return "no Chromium (apt-get install chromium)"
    for module in ("playwright", "jupyterlab", "notebook", "nbconvert"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[test]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """``jupyter lab`` or ``jupyter notebook`` serving ``root`` on 127.0.0.1, no token."""

    def __init__(self, app: str, root: Path, home: Path, *, theme: str | None = None):
        self.app = app
        self.root = root
        self.home = home
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"{app}-server.log"
        self.env = jupyter_env(home)
        settings = Path(self.env["JUPYTERLAB_SETTINGS_DIR"])
        _write_json(settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings",
                    {"fetchNews": "false", "checkForUpdates": False})
        if theme:
            _write_json(settings / "@jupyterlab/apputils-extension/themes.jupyterlab-settings", {"theme": theme})
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> JupyterServer:
        cmd = [
            sys.executable, "-m", "jupyter", self.app, "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            "--IdentityProvider.token=", f"--ServerApp.root_dir={self.root}",
            "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        if self.app == "notebook":
            cmd = [c.replace("--LabApp.", "--JupyterNotebookApp.") for c in cmd]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter {self.app} exited:\n{self.log()}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2).read()
                return self
            time.sleep(0.3)
        raise RuntimeError(f"jupyter {self.app} did not answer in 90 s:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def api(self, path: str):
        return json.loads(urllib.request.urlopen(f"{self.url}/api/{path}", timeout=10).read())

    def page_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}" if self.app == "lab" else f"{self.url}/notebooks/{notebook}"


def jupyter_env(home: Path) -> dict[str, str]:
    """The environment of a Jupyter server (or nbconvert, or ``jupyter trust``) whose
    folders all lie under ``home``, with a ``python3`` kernel that is this interpreter."""
    env = dict(os.environ)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(home / sub)
        (home / sub).mkdir(parents=True, exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    _write_json(home / "data" / "kernels" / "python3" / "kernel.json", {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python",
    })
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@contextlib.contextmanager
def browser_context(profile: Path, *, width: int = 1280, height: int = 1000) -> Iterator:
    """A headless Chromium (the system's) with a fresh profile."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            yield context
        finally:
            context.close()


def console_errors(page) -> list[str]:
    """Collect the page's console errors and uncaught exceptions into a list."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    return errors


def wait_kernel_idle(server: JupyterServer, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kernels = server.api("kernels")
        except urllib.error.HTTPError as error:
            # jupyter_server answers 500 while a kernel it lists is still being
            # started: the kernel is in its table before ``last_activity`` is set,
            # and the model formats that None. Not idle yet, so ask again.
            if error.code < 500:
                raise
            kernels = None
        if kernels and all(k.get("execution_state") == "idle" for k in kernels):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no idle kernel after {timeout} s: {server.api('kernels')}\n{server.log()}")


def run_all_cells(page, count: int) -> None:
    """Run the notebook's first ``count`` cells as a person would: select the first
    cell, then Shift+Enter on each."""
    page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    for _ in range(count):
        page.keyboard.press("Shift+Enter")
        page.wait_for_timeout(200)


def visible_text(locator) -> str:
    return locator.evaluate("e => e.innerText")


# Page-side: every visible text node under `root`, its colour composited over the
# backgrounds of its ancestors, and the WCAG contrast ratio of the two.
_CONTRAST_JS = r"""
(root) => {
  const parse = (c) => {
    let m = c.match(/^rgba?\(([^)]*)\)$/);
    if (m) {
      const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
      return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
    }
    m = c.match(/^color\(srgb ([^)]*)\)$/);
    if (m) {
      const p = m[1].split(/[\s\/]+/).filter(Boolean).map(Number);
      return {r: p[0] * 255, g: p[1] * 255, b: p[2] * 255, a: p.length > 3 ? p[3] : 1};
    }
    return null;
  };
  const over = (top, under) => ({
    r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a),
    b: top.b * top.a + under.b * (1 - top.a), a: 1,
  });
  const lum = (c) => {
    const ch = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * ch(c.r) + 0.7152 * ch(c.g) + 0.0722 * ch(c.b);
  };
  const background = (el) => {
    const chain = [];
    for (let e = el; e; e = e.parentElement) chain.push(e);
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (const e of chain.reverse()) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) bg = over(c, bg);
    }
    return bg;
  };
  const out = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = n.textContent.trim();
    const el = n.parentElement;
    if (!text || !el || el.closest('style')) continue;
    const rects = el.getClientRects();
    const style = getComputedStyle(el);
    if (!rects.length || style.visibility === 'hidden' || style.opacity === '0') continue;
    const fg = parse(style.color);
    const bg = background(el);
    if (!fg) { out.push({text: text.slice(0, 40), ratio: 0, color: style.color}); continue; }
    const a = lum(over(fg, bg)), b = lum(bg);
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    out.push({text: text.slice(0, 40), ratio: Math.round(ratio * 100) / 100, color: style.color,
              background: `rgb(${Math.round(bg.r)}, ${Math.round(bg.g)}, ${Math.round(bg.b)})`});
  }
  return out;
}
"""


# Page-side: every word (a run of non-space characters) of the visible text under `root`
# whose glyphs sit on more than one line: a word the browser broke (JupyterLab styles an
# output's <pre> with `word-break: break-all`, which splits "largest" as "la" / "rgest").
# A word wider than its box may have to break; those are reported apart.
_BROKEN_WORDS_JS = r"""
(root) => {
  const broken = [], too_wide = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || !el.getClientRects().length || getComputedStyle(el).visibility === 'hidden') continue;
    const box = el.closest('pre, div, td, li, span') || el;
    const re = /\S+/g;
    let m;
    while ((m = re.exec(n.textContent))) {
      const range = document.createRange();
      range.setStart(n, m.index);
      range.setEnd(n, m.index + m[0].length);
      const rects = Array.from(range.getClientRects()).filter((r) => r.width > 0);
      const lines = new Set(rects.map((r) => Math.round(r.top)));
      if (lines.size > 1) {
        const width = rects.reduce((w, r) => w + r.width, 0);
        (width > box.getBoundingClientRect().width ? too_wide : broken).push(m[0]);
      }
    }
  }
  return {broken, too_wide};
}
"""


def broken_words(locator) -> tuple[list[str], list[str]]:
    """(words broken over two lines, words too wide for their box that had to break)."""
    found = locator.evaluate(_BROKEN_WORDS_JS)
    return found["broken"], found["too_wide"]


def lines_of(locator) -> int:
    """On how many lines the element's text lies (1: it did not wrap)."""
    return locator.evaluate(
        "e => { const r = document.createRange(); r.selectNodeContents(e); return new Set(Array.from("
        "r.getClientRects()).filter(x => x.width > 0).map(x => Math.round(x.top))).size; }")


def low_contrast(locator, minimum: float = 4.5) -> tuple[int, list[dict]]:
    """(number of visible text runs checked, those whose contrast is below ``minimum``)."""
    runs = locator.evaluate(_CONTRAST_JS)
    return len(runs), [r for r in runs if r["ratio"] < minimum]
