#!/usr/bin/env python3
"""Browser scenarios for the Conclave dashboard, in headless Chromium.

    run.py SCENARIO --url BASE_URL [--key KEY] [--wrong-key KEY] [--screenshots DIR]

Scenarios: sessions, deliberations, pipelines, gateway, views, auth (and
bigsession, a 10,000-event session, for a server with demo.chunk_delay_ms = 0).
The server is started and configured by the caller (tests/dashboard.rs).

Prints one JSON object (`{"ok": true, ...facts}`) on stdout and exits 0,
or prints why it failed on stderr and exits 1. Every wait is an explicit
WebDriverWait on a condition; nothing sleeps to synchronise.
"""

import argparse
import json
import os
import sys
import time
import traceback

from selenium import webdriver
from selenium.common.exceptions import (ElementClickInterceptedException, StaleElementReferenceException,
                                        TimeoutException, WebDriverException)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios  # noqa: E402
from scenarios import Failure  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")


class Browser:
    """The driver and the helpers every scenario uses."""

    def __init__(self, args):
        self.args = args
        self.base = args.url.rstrip("/")
        self.shots = args.screenshots
        if self.shots:
            os.makedirs(self.shots, exist_ok=True)
        options = Options()
        for flag in ("--headless=new", "--no-sandbox", "--window-size=1280,800",
                     "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                     "--disable-extensions", "--force-prefers-reduced-motion"):
            options.add_argument(flag)
        options.binary_location = CHROMIUM
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_script_timeout(60)
        self.requested = []       # every URL the page asked for
        self.sockets = []         # every WebSocket URL the page opened
        self.console = []         # console messages at level SEVERE

    # ---- navigation and waits ----

    def open(self, path):
        self.driver.get(self.base + path)

    def wait(self, condition, timeout=20, what="a condition"):
        try:
            # The dashboard refreshes live: an element a condition found may
            # be replaced before it is read, and the condition is asked again.
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1,
                                 ignored_exceptions=[StaleElementReferenceException]).until(lambda d: condition())
        except TimeoutException:
            raise Failure(f"timed out after {timeout}s waiting for {what} (at {self.driver.current_url})") from None

    def css(self, selector):
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def one(self, selector, timeout=20, visible=True):
        def found():
            for el in self.css(selector):
                try:
                    if not visible or el.is_displayed():
                        return el
                except WebDriverException:
                    continue
            return None
        return self.wait(found, timeout, f"{selector}")

    def tid(self, testid, timeout=20, visible=True):
        return self.one(f'[data-testid="{testid}"]', timeout, visible)

    def click(self, testid_or_el, timeout=20):
        el = self.tid(testid_or_el, timeout) if isinstance(testid_or_el, str) else testid_or_el
        self.wait(lambda: el.is_enabled(), timeout, "an enabled control")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
        el.click()
        return el

    def click_css(self, selector, timeout=20):
        """Clicks the element `selector` names once it is there and enabled,
        finding it again if a live refresh replaced it meanwhile."""
        def attempt():
            for el in self.css(selector):
                try:
                    if el.is_displayed() and el.is_enabled():
                        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
                        el.click()
                        return True
                except (StaleElementReferenceException, ElementClickInterceptedException):
                    return False
            return False
        self.wait(attempt, timeout, f"{selector} to be clickable")

    def attr(self, selector, name):
        """An attribute of the first element `selector` names (None if none),
        read in one step so a live refresh cannot make it stale."""
        return self.driver.execute_script(
            "const el = document.querySelector(arguments[0]); return el ? el.getAttribute(arguments[1]) : null;", selector, name)

    def set_value(self, el, value):
        """Sets a field's value as typing would (newlines included, which
        send_keys would turn into Enter presses)."""
        self.driver.execute_script(
            """
            const el = arguments[0], value = arguments[1];
            const proto = el.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype
                : el.tagName === 'SELECT' ? HTMLSelectElement.prototype : HTMLInputElement.prototype;
            Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, value);
            el.dispatchEvent(new Event('input', {bubbles: true}));
            el.dispatchEvent(new Event('change', {bubbles: true}));
            """, el, value)

    def text(self, selector):
        """The text of every element `selector` names, read in one step so a
        live refresh between finding them and reading them cannot make one
        stale."""
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), (el) => el.textContent || '');",
            selector)

    def path(self):
        return self.driver.execute_script("return location.pathname")

    def shot(self, name):
        if self.shots:
            self.driver.save_screenshot(os.path.join(self.shots, f"{name}.png"))

    # ---- the page's own API calls (same origin, with the page's key) ----

    def api(self, method, path, body=None):
        result = self.driver.execute_async_script(
            """
            const [method, path, body, done] = arguments;
            const headers = {Accept: 'application/json'};
            const key = sessionStorage.getItem('conclave.key');
            if (key) headers.Authorization = 'Bearer ' + key;
            const init = {method, headers};
            if (method !== 'GET') { headers['Content-Type'] = 'application/json'; init.body = JSON.stringify(body ?? {}); }
            fetch(path, init).then(async (r) => {
                const text = await r.text();
                let data = null; try { data = JSON.parse(text); } catch (e) { data = text; }
                done({status: r.status, body: data});
            }).catch((e) => done({status: 0, body: String(e)}));
            """, method, path, body)
        return result["status"], result["body"]

    # ---- logs ----

    def drain_logs(self):
        try:
            for entry in self.driver.get_log("performance"):
                msg = json.loads(entry["message"])["message"]
                if msg["method"] == "Network.requestWillBeSent":
                    self.requested.append(msg["params"]["request"]["url"])
                elif msg["method"] == "Network.webSocketCreated":
                    self.sockets.append(msg["params"]["url"])
        except WebDriverException:
            pass
        try:
            for entry in self.driver.get_log("browser"):
                if entry.get("level") == "SEVERE":
                    self.console.append(entry.get("message", ""))
        except WebDriverException:
            pass

    def js_errors(self, allow=()):
        """Console errors from the dashboard's own code (not failed requests
        a scenario provokes on purpose)."""
        self.drain_logs()
        bad = []
        for m in self.console:
            if any(a in m for a in allow):
                continue
            if "Failed to load resource" in m or "WebSocket connection" in m:
                continue
            bad.append(m)
        return bad

    def quit(self):
        try:
            self.driver.quit()
        except WebDriverException:
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key")
    parser.add_argument("--wrong-key")
    parser.add_argument("--secret", action="append", help="text that must never be on the page (another key)")
    parser.add_argument("--screenshots")
    args = parser.parse_args()

    run = getattr(scenarios, f"scenario_{args.scenario}", None)
    if run is None:
        print(f"unknown scenario {args.scenario!r}; known: {', '.join(scenarios.NAMES)}", file=sys.stderr)
        return 1
    started = time.monotonic()
    browser = None
    try:
        browser = Browser(args)
        facts = run(browser, args) or {}
        errors = browser.js_errors(allow=facts.pop("_allow_console", ()))
        if errors:
            raise Failure(f"the page logged errors: {errors[:5]}")
        facts = {"ok": True, "scenario": args.scenario, "seconds": round(time.monotonic() - started, 2), **facts}
        print(json.dumps(facts))
        return 0
    except Failure as e:
        if browser and args.screenshots:
            browser.shot(f"failure-{args.scenario}")
        print(f"{args.scenario}: {e}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - any other error is a failure with its trace
        if browser and args.screenshots:
            try:
                browser.shot(f"failure-{args.scenario}")
            except Exception:  # noqa: BLE001
                pass
        print(f"{args.scenario}: {traceback.format_exc()}", file=sys.stderr)
        return 1
    finally:
        if browser:
            browser.quit()


if __name__ == "__main__":
    sys.exit(main())
