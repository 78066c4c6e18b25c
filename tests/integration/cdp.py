"""Headless Chromium driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages
separated by NUL bytes on file descriptors 3 and 4), so a test can click the status page's buttons and read what the
page then shows, with no WebSocket or browser-automation package."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


class Browser:
    def __init__(self, chromium: str, profile: Path, window: str = "1280,900"):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        command = " ".join(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={window}",
                "--remote-debugging-pipe",
                "about:blank",
            ]
        )
        # bash puts the two pipe ends where Chromium expects them: 3 to read commands, 4 to write answers.
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {command} 3<&{to_browser_r} 4>&{from_browser_w}"],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._answers: dict[int, dict] = {}
        self._arrived = threading.Condition()
        self.exceptions: list[str] = []  # uncaught script errors of the pages (Runtime.exceptionThrown)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = os.read(self._from_browser, 65536)
            except OSError:
                data = b""
            if not data:
                with self._arrived:
                    self._arrived.notify_all()
                return
            buffer += data
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if message.get("method") == "Runtime.exceptionThrown":
                    details = message["params"]["exceptionDetails"]
                    self.exceptions.append(details.get("exception", {}).get("description") or details.get("text"))
                if "id" in message:
                    with self._arrived:
                        self._answers[message["id"]] = message
                        self._arrived.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60.0) -> dict:
        self._next_id += 1
        ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._arrived:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise TimeoutError(
                        f"Chromium did not answer {method}: "
                        f"{self.process.stderr.read().decode()[-2000:] if self.process.poll() is not None else ''}"
                    )
                self._arrived.wait(min(left, 1.0))
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def open(self, url: str) -> Tab:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, session)
        self.send("Runtime.enable", session=session)
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        tab.wait_for("document.readyState === 'complete'")
        return tab

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Tab:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str) -> Any:
        """The value of a script expression in the page (promises awaited)."""
        result = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"page: {what or expression} not true within {timeout:.0f}s")
            time.sleep(0.2)

    def click(self, selector: str) -> None:
        """A click on the element, as the user's (a mouse press and release at its centre)."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            f" e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();"
            f" return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        )
        if box is None:
            raise AssertionError(f"page: nothing matches {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.browser.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                session=self.session,
            )

    def type(self, selector: str, text: str) -> None:
        self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.value = ''; }})()"
        )
        self.browser.send("Input.insertText", {"text": text}, session=self.session)

    def text(self, selector: str) -> str | None:
        return self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            f"return e ? e.textContent : null; }})()"
        )
