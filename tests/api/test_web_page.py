#!/usr/bin/env python3
# The web chat page (GET /) in a real browser: headless Chromium (Debian's chromium and chromium-driver)
# driven by Selenium loads the page from a real `troupe serve` that wants an API key, is asked for the key
# once (a browser prompt), picks the model, sends a message, sees the answer stream in (the text grows over
# several looks), the tokens/s figure and the memory panel, and saves a screenshot (web_page.png in the
# build folder's Testing/ directory, or --screenshot). Skips (77) without Selenium, the browser or the
# model; fails instead under CI=true.
import argparse
import os
import re
import shutil
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_openai_client as common  # noqa: E402  (the Daemon helper and the skip rules)

ARGS = None
KEY = "web-test-key"


class WebPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        cls.daemon = common.Daemon(ARGS.troupe, common.example_config(ARGS.source, ARGS.model, api_key=KEY), ARGS.source)
        opts = webdriver.ChromeOptions()
        opts.binary_location = ARGS.chromium
        opts.set_capability("unhandledPromptBehavior", "ignore")
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
            opts.add_argument(a)
        cls.browser = webdriver.Chrome(service=Service(ARGS.chromedriver), options=opts)
        cls.browser.set_page_load_timeout(60)

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        cls.daemon.stop()

    def wait(self, what, timeout=120, every=0.05):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = what()
            if v:
                return v
            time.sleep(every)
        self.fail("timed out waiting")

    def alert_text(self):
        try:
            return self.browser.switch_to.alert
        except Exception:
            return None

    def test_chat_streams_into_the_page(self):
        from selenium.webdriver.common.by import By
        b = self.browser
        b.get(f"http://127.0.0.1:{self.daemon.port}/")
        # The API wants a key: the page asks once and keeps it.
        alert = self.wait(self.alert_text)
        alert.send_keys(KEY)
        alert.accept()
        self.assertEqual(b.title, "troupe")
        self.wait(lambda: b.find_element(By.ID, "model").text.strip() == "smollm2")
        self.assertEqual(b.execute_script("return localStorage.getItem('troupe.api_key')"), KEY)
        self.wait(lambda: "model" in b.find_element(By.ID, "memory").text)
        b.find_element(By.ID, "system").send_keys("You are a helpful assistant.")
        b.execute_script("const t = document.getElementById('temperature'); t.value = 0; t.dispatchEvent(new Event('input')); document.getElementById('max_tokens').value = 48;")
        b.find_element(By.ID, "input").send_keys("Write a short poem about the sea.")
        b.find_element(By.ID, "send").click()
        # Streaming: the answer's text is seen growing while the stop button is live.
        lengths = []

        def answer():
            els = b.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")
            return els[-1].text if els else ""

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = answer()
            if text and (not lengths or len(text) != lengths[-1]):
                lengths.append(len(text))
            if b.find_element(By.ID, "stop").get_attribute("disabled") is not None and lengths:
                break
            time.sleep(0.02)
        self.assertGreaterEqual(len(lengths), 3, f"the answer did not arrive in pieces: {lengths}")
        self.assertEqual(lengths, sorted(lengths))
        stats = self.wait(lambda: b.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text)
        self.assertRegex(stats, r"^48 tokens, [0-9.]+ tokens/s$")
        self.wait(lambda: re.search(r"host|CPU", b.find_element(By.ID, "memory").text))
        b.save_screenshot(ARGS.screenshot)
        self.assertGreater(os.path.getsize(ARGS.screenshot), 10000)
        print(f"screenshot: {ARGS.screenshot}", file=sys.stderr)
        # The stop button ends an answer early.
        b.execute_script("document.getElementById('max_tokens').value = 400;")
        b.find_element(By.ID, "input").send_keys("Tell me a long story about a lighthouse keeper.")
        b.find_element(By.ID, "send").click()
        self.wait(lambda: len(answer()) > 20 and b.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
        b.find_element(By.ID, "stop").click()
        self.wait(lambda: b.find_element(By.ID, "send").get_attribute("disabled") is None)
        self.assertEqual(b.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text, "stopped")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--troupe", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--screenshot", default=os.path.abspath("web_page.png"))
    ARGS, rest = p.parse_known_args()
    ARGS.troupe = os.path.abspath(ARGS.troupe)
    ARGS.source = os.path.abspath(ARGS.source)
    try:
        import selenium  # noqa: F401
    except ImportError:
        venv_python = os.path.join(ARGS.source, ".venv", "bin", "python")
        if os.path.isfile(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ARGS.source, ".venv")):
            os.execv(venv_python, [venv_python] + sys.argv)
        common.skip_or_fail("selenium is not installed (scripts/install-deps makes .venv with it)")
    ARGS.chromium = shutil.which("chromium") or ""
    ARGS.chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not ARGS.chromium or not os.path.exists(ARGS.chromedriver):
        common.skip_or_fail("chromium and chromium-driver are not installed (scripts/install-deps installs them)")
    ARGS.model = os.path.join(ARGS.source, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(ARGS.model):
        common.skip_or_fail(f"{ARGS.model} is missing (scripts/fetch-model downloads it)")
    r = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    sys.exit(0 if r.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
