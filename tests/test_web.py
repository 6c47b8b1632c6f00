"""`commviz web` in a real headless browser (Debian's chromium): the page starts a
dashboard that is a view of the collector, and what the browser draws is that
dashboard, not textual-serve's splash. Skips where chromium or textual-serve is
missing (CI installs neither); the screenshot is kept for a person to look at."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib

import pytest

from commviz.httpview import StateServer
from commviz.viewlink import ViewSource
from tests.helpers import free_port
from tests.tui.scenes import busy_ring

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt install chromium)"),
    pytest.mark.skipif(not __import__("importlib").util.find_spec("textual_serve"), reason="no textual-serve"),
]


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered rows): enough PNG for a screenshot."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color = head[:4]
    assert depth == 8 and color in (2, 6)
    bpp = 4 if color == 6 else 3
    raw, stride = zlib.decompress(idat), w * bpp
    out, prev = bytearray(), bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, bpp, bytes(out)


def orange_share(png: bytes) -> float:
    """The share of pixels in the dashboard's title orange (panel titles, the ops/s
    bars): textual-serve's splash has none."""
    w, h, bpp, px = png_pixels(png)
    hits = sum(1 for i in range(0, len(px), bpp * 3)
               if px[i] > 200 and 110 < px[i + 1] < 200 and px[i + 2] < 90)
    return hits / (w * h / 3)


# Before the page's own script: keep what the terminal's websocket brings (the app's
# output, escape codes and all). xterm.js draws on a canvas, so the page holds no text.
HOOK = """
window.__cvzText = [];
const Real = window.WebSocket;
window.WebSocket = function (...a) {
  const ws = new Real(...a);
  ws.addEventListener("message", (e) => {
    if (typeof e.data === "string") { window.__cvzText.push(e.data); }
    else if (e.data instanceof Blob) { e.data.text().then((t) => window.__cvzText.push(t)); }
    else { window.__cvzText.push(new TextDecoder().decode(e.data)); }
  });
  return ws;
};
window.WebSocket.prototype = Real.prototype;
Object.assign(window.WebSocket, Real);
"""


async def browse(url: str, wait_s: float) -> tuple[list[str], bytes, str]:
    """Open `url` in headless chromium over the DevTools protocol; the body's classes
    once a second (textual-serve adds -first-byte when the app's output arrives), then
    a screenshot, and the text the terminal was sent, escape codes taken out."""
    import aiohttp

    port = free_port()
    profile = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"cvz-chromium-{port}")
    p = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
                          f"--user-data-dir={profile}", "--window-size=1600,1000", "about:blank"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=1).read())
                break
            except OSError:
                assert time.monotonic() < deadline, "chromium never opened its DevTools port"
                time.sleep(0.2)
        ws_url = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")
        classes: list[str] = []
        async with aiohttp.ClientSession() as s, s.ws_connect(ws_url, max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))

            async def call(method: str, **params):
                i = next(ids)
                await ws.send_json({"id": i, "method": method, "params": params})
                while True:
                    m = await ws.receive_json()
                    if m.get("id") == i:
                        return m.get("result", {})

            await call("Page.enable")
            await call("Page.addScriptToEvaluateOnNewDocument", source=HOOK)
            await call("Page.navigate", url=url)
            t0 = time.monotonic()
            while time.monotonic() - t0 < wait_s:
                r = await call("Runtime.evaluate", expression="document.body ? document.body.className : ''")
                classes.append(str(r.get("result", {}).get("value", "")))
                if "-first-byte" in classes[-1] and time.monotonic() - t0 > 4:
                    await asyncio.sleep(4)  # the first frames and a data tick or two
                    break
                await asyncio.sleep(1)
            shot = base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"])
            got = await call("Runtime.evaluate", expression="window.__cvzText.join('')")
            text = re.sub(r"\x1b\[[0-9;?$]*[A-Za-z]|\x1b\][^\x07]*\x07", "", got.get("result", {}).get("value", ""))
        return classes, shot, text
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(profile, ignore_errors=True)


@needs_browser[0]
@needs_browser[1]
def test_the_browser_shows_the_dashboard_of_the_collector(tmp_path):
    feed = busy_ring(4, ops=20)
    server = StateServer(feed, "127.0.0.1", 0, views=ViewSource(feed, title="browser test")).start()
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "commviz.cli", "web", "--connect", server.url, "--port", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = web.stdout.readline()  # "… at http://127.0.0.1:PORT/?token=TOKEN": the page's own token
        page = said.rsplit(" at ", 1)[-1].strip()
        assert page.startswith(f"http://127.0.0.1:{port}/?token="), said
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(page, timeout=1).read()
                break
            except OSError:
                assert web.poll() is None and time.monotonic() < deadline, "commviz web never served its page"
                time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError, match="401"):  # without it, nothing
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
        before = server.requests
        classes, shot, text = asyncio.run(browse(page, wait_s=60))
        (tmp_path / "web.png").write_bytes(shot)
        assert any("-first-byte" in c for c in classes), classes
        assert server.requests - before >= 2  # the tab's dashboard asked the collector for views
        assert orange_share(shot) > 0.0005, f"the page shows no dashboard: see {tmp_path / 'web.png'}"
        # what it drew: the ranks table of the collector's four ranks, their op among them
        assert "Ranks 4/4" in text and "all_reduce" in text, f"see {tmp_path / 'web.png'}"
    finally:
        web.terminate()
        try:
            web.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            web.kill()
        server.close()


@needs_browser[1]
def test_a_web_view_open_to_other_machines_wants_the_token(monkeypatch, capsys):
    from commviz.cli import main

    monkeypatch.delenv("COMMVIZ_TOKEN", raising=False)
    assert main(["web", "--host", "0.0.0.0", "--connect", "127.0.0.1:9"]) != 0
    assert "set COMMVIZ_TOKEN" in capsys.readouterr().err


def test_a_tab_s_dashboard_ends_when_the_web_server_does(tmp_path):
    """textual-serve starts each tab's app under a shell; if `commviz web` dies, the
    app must go too (orphaned, it spun on its closed stdin)."""
    ready = tmp_path / "ready"
    child = ("import time; from commviz.commands.watch import exit_with_parent; exit_with_parent(0.1); "
             f"open({str(ready)!r}, 'w').close(); time.sleep(60)")
    middle = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
                               "print(p.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    pid = int(middle.stdout.readline())
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:  # it knows its parent
        time.sleep(0.05)
    middle.kill()
    middle.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                if "\nState:\tZ" in f.read():
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the orphaned view kept running")
