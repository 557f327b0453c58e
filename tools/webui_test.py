#!/usr/bin/env python3
"""The chat page of a running `deltaq serve` in Debian's headless Chromium, driven with Selenium.

Loads `/`, sends a message and watches the streamed answer grow, checks the thinking block opens and
closes, starts a long answer and stops it (the text stops growing, the page is idle again and the
server counts a cancelled request), reloads and finds the conversation kept, optionally attaches an
image (a server started with --mmproj) or checks that a 401 asks for the API key, checks nothing scrolls sideways at phone width, and takes
screenshots at desktop (1280x800) and phone (390x844) sizes.

    python3 tools/webui_test.py --base-url http://127.0.0.1:8080 --screenshots docs/
    python3 tools/webui_test.py --base-url http://127.0.0.1:8081 --image img.png  # server with --mmproj

Starts no server itself. Needs `apt-get install chromium chromium-driver` and `pip install selenium`;
Selenium Manager is never asked to download a browser or a driver.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

DESKTOP = (1280, 800)
PHONE = (390, 844)


def fail(msg):
    raise AssertionError(msg)


def http_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def browser(args, profile):
    opts = webdriver.ChromeOptions()
    opts.binary_location = args.chromium
    # Without the background-networking flags Chromium's own connections get refused on a closed
    # network and slow everything down.
    for flag in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=args.chromedriver), options=opts)
    driver.set_script_timeout(30)
    return driver


def viewport(driver, size, mobile):
    w, h = size
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": w, "height": h, "deviceScaleFactor": 2 if mobile else 1, "mobile": mobile},
    )


def wait(driver, seconds, cond, what):
    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.05).until(cond)
    except Exception:
        fail(f"timed out after {seconds} s waiting for {what}")


def js(driver, script, *args):
    return driver.execute_script(script, *args)


def idle(driver):
    return js(
        driver,
        "return !document.body.classList.contains('busy') && "
        "document.getElementById('stop').hidden && !document.getElementById('send').hidden;",
    )


def last_assistant_text(driver):
    return js(
        driver,
        "const m = document.querySelectorAll('.msg.assistant');"
        "return m.length ? m[m.length - 1].querySelector('.content').textContent : null;",
    )


def record_growth(driver):
    """Records the length of the last assistant message's text at every change (a MutationObserver)."""
    js(
        driver,
        """
        window.__growth = [];
        const box = document.getElementById('messages');
        window.__observer && window.__observer.disconnect();
        window.__observer = new MutationObserver(() => {
          const m = box.querySelectorAll('.msg.assistant');
          if (!m.length) return;
          const n = m[m.length - 1].querySelector('.content').textContent.length
                  + m[m.length - 1].querySelector('.thought').textContent.length;
          const g = window.__growth;
          if (!g.length || g[g.length - 1] !== n) g.push(n);
        });
        window.__observer.observe(box, {childList: true, subtree: true, characterData: true});
        """,
    )


def set_settings(driver, **fields):
    driver.find_element(By.ID, "open-settings").click()
    wait(driver, 5, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is not None, "the settings")
    for k, v in fields.items():
        e = driver.find_element(By.ID, k)
        e.clear()
        if v != "":
            e.send_keys(str(v))
    driver.find_element(By.ID, "close-settings").click()
    wait(driver, 5, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is None, "the settings to close")


def set_thinking(driver, on):
    box = driver.find_element(By.ID, "thinking")
    if box.is_selected() != on:
        # The checkbox is visually hidden: click its switch.
        driver.find_element(By.CSS_SELECTOR, "label.switch .track").click()
    if box.is_selected() != on:
        fail("the thinking switch does not toggle")


def send(driver, text):
    box = driver.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    wait(driver, 5, lambda d: d.find_element(By.ID, "send").is_enabled(), "the send button to be enabled")
    n = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    box.send_keys(Keys.ENTER)
    wait(driver, 5, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == n + 1, "the reply to start")


def check_stream(driver):
    """A short answer with thinking off: text appears and grows, then the page is idle again."""
    set_thinking(driver, False)
    set_settings(driver, max_tokens=120, temperature=0.7)
    record_growth(driver)
    send(driver, "Tell me about the beginning.")
    wait(driver, 120, lambda d: idle(d), "the answer to finish")
    text = last_assistant_text(driver)
    growth = js(driver, "return window.__growth;")
    if not text or len(text) < 20:
        fail(f"no answer text: {text!r}")
    if len([n for n in growth if n > 0]) < 3:
        fail(f"the answer did not stream (lengths seen: {growth})")
    if driver.find_element(By.CSS_SELECTOR, ".msg.user .content").text != "Tell me about the beginning.":
        fail("the user message is not shown")
    print(f"webui: streamed {len(text)} characters in {len(growth)} steps")


def check_thinking(driver):
    """Thinking on, in a new conversation: the reasoning streams into a collapsible block."""
    driver.find_element(By.ID, "new-chat").click()
    wait(driver, 5, lambda d: not d.find_elements(By.CSS_SELECTOR, ".msg"), "an empty new chat")
    set_thinking(driver, True)
    # Greedy: the demo model's first token for this prompt is not the end of the answer.
    set_settings(driver, max_tokens=60, temperature=0)
    send(driver, "Hello")
    wait(driver, 120, lambda d: idle(d), "the thinking answer to finish")
    details = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].find_element(By.CSS_SELECTOR, "details.thinking")
    if not details.is_displayed():
        fail("no thinking block")
    thought = details.find_element(By.CSS_SELECTOR, ".thought")
    summary = details.find_element(By.TAG_NAME, "summary")
    before = details.get_attribute("open") is not None
    summary.click()
    after = details.get_attribute("open") is not None
    if before == after:
        fail("the thinking block does not open or close")
    if after and not thought.text.strip():
        fail("the thinking block is empty")
    if not after:
        summary.click()  # leave it open for the screenshot
    print("webui: thinking block streamed and toggles")


def check_stop(driver, base):
    """A long answer stopped midway: the text stops growing, the page is idle, the server cancelled."""
    set_thinking(driver, False)
    set_settings(driver, max_tokens=3900, temperature=0.7)
    cancelled = http_json(base + "/health")["requests"]["cancelled"]
    send(driver, "Tell me a very long story.")
    # The demo model may end an answer early: then ask again. A release build decodes the demo model
    # at over 1000 tokens/s, so the answer must be long (the server runs with -c 4096, the demo model's
    # training context) for the stop to reach the server before it has generated everything.
    for attempt in range(3):
        wait(driver, 60, lambda d: len(last_assistant_text(d) or "") > 10 or idle(d), "the long answer to start")
        if not idle(driver):
            break
        if attempt == 2:
            fail("the long answer finished three times before it could be stopped")
        driver.find_element(By.CSS_SELECTOR, ".msg.assistant:last-child .regenerate").click()
        wait(driver, 5, lambda d: not idle(d) or len(last_assistant_text(d) or "") > 10, "the answer to restart")
    driver.find_element(By.ID, "stop").click()
    wait(driver, 5, lambda d: idle(d), "the page to be idle after stop")
    stopped_at = last_assistant_text(driver)
    time.sleep(1.0)
    if last_assistant_text(driver) != stopped_at:
        fail("the text kept growing after stop")
    last = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    if "stopped" not in last.get_attribute("class"):
        fail("the stopped answer is not marked")
    deadline = time.time() + 10
    while http_json(base + "/health")["requests"]["cancelled"] <= cancelled:
        if time.time() > deadline:
            fail("the server did not cancel the generation after stop")
        time.sleep(0.1)
    if http_json(base + "/health")["slots"]["busy"] != 0:
        time.sleep(1)
        if http_json(base + "/health")["slots"]["busy"] != 0:
            fail("a session is still busy after stop")
    print(f"webui: stopped after {len(stopped_at)} characters; the server cancelled the job")


def check_api_key(driver, key):
    """A server with --api-key: the first request gets a 401, the settings open at the key field, and
    with the key entered the retry works."""
    set_settings(driver, max_tokens=20, temperature=0)
    send(driver, "Hello")
    wait(driver, 30, lambda d: idle(d), "the refused request to end")
    err = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].find_element(By.CSS_SELECTOR, ".error")
    if not err.is_displayed() or "API key" not in err.text:
        fail(f"no API key error shown: {err.text!r}")
    wait(driver, 5, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is not None, "the settings to open on a 401")
    if not driver.find_element(By.ID, "settings-note").is_displayed():
        fail("the settings do not say why they opened")
    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.ID, "close-settings").click()
    driver.find_element(By.CSS_SELECTOR, ".msg.assistant:last-child .regenerate").click()
    wait(driver, 120, lambda d: idle(d), "the retried request to end")
    err = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].find_element(By.CSS_SELECTOR, ".error")
    if err.is_displayed():
        fail(f"the request with the key failed: {err.text}")
    driver.find_element(By.ID, "new-chat").click()
    print("webui: a 401 asks for the API key; with it the request works")


def check_persisted(driver):
    title = driver.find_element(By.ID, "title").text
    n = len(driver.find_elements(By.CSS_SELECTOR, ".msg"))
    convs = len(driver.find_elements(By.CSS_SELECTOR, "#conversations li"))
    driver.refresh()
    wait(driver, 10, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "the page to load again")
    if driver.find_element(By.ID, "title").text != title:
        fail("the conversation is not the current one after a reload")
    if len(driver.find_elements(By.CSS_SELECTOR, ".msg")) != n:
        fail("the messages were not kept over a reload")
    items = driver.find_elements(By.CSS_SELECTOR, "#conversations li")
    if len(items) != convs:
        fail(f"{len(items)} conversations listed after a reload, not {convs}")
    if "current" not in items[0].get_attribute("class"):
        fail("the conversation list does not show the conversation")
    if js(driver, "return document.getElementById('max_tokens').placeholder") == "":
        fail("the settings have no server defaults")
    print(f"webui: {n} messages kept over a reload")


def check_image(driver, image):
    if driver.find_element(By.ID, "attach").get_attribute("hidden") is not None:
        fail("the server has an mmproj but the page offers no image upload")
    driver.find_element(By.ID, "new-chat").click()
    set_thinking(driver, False)
    set_settings(driver, max_tokens=30)
    driver.find_element(By.ID, "file").send_keys(os.path.abspath(image))
    wait(driver, 10, lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments img"), "the image preview")
    send(driver, "What is in this picture?")
    wait(driver, 180, lambda d: idle(d), "the answer about the image")
    last = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    err = last.find_element(By.CSS_SELECTOR, ".error")
    if err.is_displayed():
        fail(f"the image request failed: {err.text}")
    if not last_assistant_text(driver):
        fail("no answer about the image")
    if not driver.find_elements(By.CSS_SELECTOR, ".msg.user .images img"):
        fail("the sent image is not shown")
    print("webui: image attached, sent and answered")


def check_no_sideways_scroll(driver):
    wide = js(driver, "return [document.documentElement.scrollWidth, window.innerWidth];")
    if wide[0] > wide[1]:
        fail(f"the page scrolls sideways at phone width ({wide[0]} > {wide[1]} px)")
    # Every control of the composer and header is on screen.
    for id_ in ["menu", "thinking", "open-settings", "input", "send"]:
        e = driver.find_element(By.ID, id_)
        r = js(driver, "const r = arguments[0].getBoundingClientRect(); return [r.left, r.right];",
               e if id_ != "thinking" else driver.find_element(By.CSS_SELECTOR, "label.switch"))
        if r[0] < 0 or r[1] > wide[1]:
            fail(f"#{id_} is off screen at phone width: {r}")


def screenshot(driver, folder, name):
    path = os.path.join(folder, name)
    driver.save_screenshot(path)
    print(f"webui: screenshot {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--screenshots", help="folder for webui-desktop.png and webui-phone.png")
    ap.add_argument("--image", help="an image to attach (the server must run with --mmproj)")
    ap.add_argument("--api-key", help="the server's --api-key: checks that a 401 asks for it")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    props = http_json(base + "/props")
    if bool(args.api_key) != props["api_key_required"]:
        fail("--api-key must be given exactly when the server wants a key")
    if args.image and not props["modalities"]["vision"]:
        fail("--image given but the server has no vision tower (start it with --mmproj)")

    with tempfile.TemporaryDirectory(prefix="deltaq-webui-") as profile:
        driver = browser(args, profile)
        try:
            viewport(driver, DESKTOP, False)
            driver.get(base + "/")
            wait(driver, 15, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "the page to load")
            if driver.find_element(By.ID, "model-name").text != props["model"]:
                fail("the page does not show the model")
            if args.api_key:
                check_api_key(driver, args.api_key)
            if args.image:
                check_image(driver, args.image)
            else:
                check_stream(driver)
                check_thinking(driver)
                check_stop(driver, base)
                check_persisted(driver)
            if args.screenshots:
                os.makedirs(args.screenshots, exist_ok=True)
                suffix = "-image" if args.image else ""
                # The thinking block open, to show it.
                for d in driver.find_elements(By.CSS_SELECTOR, "details.thinking:not([open]) summary"):
                    if d.is_displayed():
                        d.click()
                time.sleep(0.3)  # the chevron turns
                screenshot(driver, args.screenshots, f"webui-desktop{suffix}.png")
            viewport(driver, PHONE, True)
            driver.refresh()
            wait(driver, 10, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "the page at phone width")
            check_no_sideways_scroll(driver)
            if args.screenshots:
                screenshot(driver, args.screenshots, f"webui-phone{suffix}.png")
                driver.find_element(By.ID, "open-settings").click()
                time.sleep(0.2)
                screenshot(driver, args.screenshots, f"webui-phone-settings{suffix}.png")
                driver.find_element(By.ID, "close-settings").click()
                driver.find_element(By.ID, "menu").click()
                time.sleep(0.4)  # the list slides in
                screenshot(driver, args.screenshots, f"webui-phone-menu{suffix}.png")
                driver.execute_cdp_cmd(
                    "Emulation.setEmulatedMedia",
                    {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
                )
                # The scrim's middle is under the list: a tap at its side closes the list.
                js(driver, "document.getElementById('scrim').click();")
                time.sleep(0.4)
                screenshot(driver, args.screenshots, f"webui-phone-dark{suffix}.png")
        except Exception:
            if args.screenshots:
                os.makedirs(args.screenshots, exist_ok=True)
                screenshot(driver, args.screenshots, "webui-failure.png")
            raise
        finally:
            driver.quit()
    print("webui: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"webui test failed: {e}", file=sys.stderr)
        sys.exit(1)
