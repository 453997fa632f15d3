"""The console in a real browser: Debian's headless Chromium driven by selenium through
Debian's chromium-driver. Types the token, runs python that prints (live, while it runs) and
plots (the image appears), C++ with a compile error (shown as one), a session with two cells
sharing a variable, a run in the history; a phone-width view; screenshots of each page into
docs/. Then a page of another origin, in the same browser, tries the API with the token and
is refused.

Usage: console_test.py BASE_URL TOKEN OTHER_ORIGIN_URL SHOTS_DIR
(prints `console: N passed, M failed`)
"""
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

passed = failed = 0


def check(name, fn):
    global passed, failed
    try:
        fn()
        passed += 1
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - a failed check, whatever it raised
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def main():
    base, token, other, shots = sys.argv[1:5]
    os.makedirs(shots, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="codebox-console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_window_size(1280, 800)
    wait = WebDriverWait(driver, 120)
    by_id = lambda i: driver.find_element(By.ID, i)  # noqa: E731

    def shot(name, at=None):
        if at:
            driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", at)
        driver.save_screenshot(os.path.join(shots, f"console-{name}.png"))

    def set_code(area_id, text):
        area = by_id(area_id)
        driver.execute_script("arguments[0].value = arguments[1];", area, text)

    def page_and_headers():
        with urllib.request.urlopen(base + "/", timeout=30) as r:
            csp = r.headers["Content-Security-Policy"]
            html = r.read().decode()
        assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
        assert "frame-ancestors 'none'" in csp, csp
        # Nothing from elsewhere: every script and style is the server's own.
        assert "http://" not in html and "https://" not in html, "an absolute URL in the page"
        driver.get(base + "/")
        assert by_id("login").is_displayed(), "the token form is not shown"
        assert not by_id("tabs").is_displayed(), "the tabs are shown before the token"

    def wrong_token_is_told():
        by_id("token").send_keys("not-the-token")
        by_id("token").send_keys(Keys.ENTER)
        wait.until(lambda d: "Cannot connect" in by_id("login-error").text)

    def login():
        box = by_id("token")
        box.clear()
        box.send_keys(token)
        shot("login")
        box.send_keys(Keys.ENTER)
        wait.until(EC.visibility_of_element_located((By.ID, "play")))
        assert by_id("token").get_attribute("value") == "", "the token stays in the field"
        cookies = driver.get_cookies()
        assert cookies == [], cookies
        stored = driver.execute_script("return [localStorage.length, sessionStorage.length]")
        assert stored == [0, 0], stored
        assert token not in driver.current_url

    def python_prints_live_and_plots():
        Select(by_id("language")).select_by_value("python")
        assert "print" in by_id("code").get_attribute("value"), "the sample is not preloaded"
        code = (
            "import time, os\n"
            "for i in range(6):\n"
            "    print(f'step {i}', flush=True)\n"
            "    time.sleep(0.4)\n"
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "os.makedirs('outputs', exist_ok=True)\n"
            "plt.plot([1, 4, 9, 16]); plt.title('squares'); plt.savefig('outputs/plot.png')\n"
            "open('outputs/data.csv', 'w').write('n,sq\\n1,1\\n2,4\\n')\n"
            "print('plotted')\n"
        )
        set_code("code", code)
        by_id("code").send_keys(Keys.CONTROL, Keys.ENTER)
        # Output arrives while the run still goes on (the Run button is disabled until its end).
        wait.until(lambda d: "step 1" in by_id("output").text)
        assert not by_id("run").is_enabled(), "the run ended before its output was shown"
        wait.until(lambda d: "Succeeded" in by_id("summary").text)
        out = by_id("output").text
        for i in range(6):
            assert f"step {i}" in out, out
        assert "plotted" in out, out
        img = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#files img"))
        wait.until(lambda d: d.execute_script("return arguments[0].naturalWidth", img) > 100)
        links = driver.find_elements(By.CSS_SELECTOR, "#files a[download]")
        assert [a.get_attribute("download") for a in links] == ["data.csv"], links
        summary = by_id("summary").text
        assert "CPU time" in summary and "peak memory" in summary, summary
        shot("playground", "output")

    def cpp_compile_error():
        Select(by_id("language")).select_by_value("cpp")
        set_code("code", "int main() { return undefined_name; }\n")
        by_id("run").click()
        wait.until(lambda d: "Compile error" in by_id("summary").text)
        out = by_id("output").text
        assert "undefined_name" in out and "error" in out, out
        shot("compile-error", "output")

    def phone_width():
        driver.set_window_size(390, 844)
        time.sleep(0.3)
        width = driver.execute_script("return document.documentElement.scrollWidth")
        inner = driver.execute_script("return window.innerWidth")
        wide = driver.execute_script(
            "return [...document.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
            ".map(e => e.tagName + '#' + e.id + '.' + e.className).slice(0, 8)")
        assert width <= inner + 1, f"the page is {width}px wide on a {inner}px screen: {wide}"
        shot("phone")
        driver.set_window_size(1280, 800)

    def session_with_two_cells():
        by_id("tab-sessions").click()
        Select(by_id("session-language")).select_by_value("python")
        driver.find_element(By.CSS_SELECTOR, "#open-form button[type=submit]").click()
        wait.until(EC.visibility_of_element_located((By.ID, "session-view")))
        set_code("cell", "x = 41\nopen('kept.txt', 'w').write('kept')\n")
        by_id("run-cell").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cells .cell .status")) == 1)
        set_code("cell", "print(x + 1)")
        by_id("cell").send_keys(Keys.CONTROL, Keys.ENTER)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cells .cell .status")) == 2)
        cells = driver.find_elements(By.CSS_SELECTOR, "#cells .cell")
        assert "42" in cells[1].find_element(By.TAG_NAME, "pre").text, cells[1].text
        assert all("Succeeded" in c.text for c in cells), [c.text for c in cells]
        wait.until(lambda d: "kept.txt" in by_id("session-files").text)
        shot("session", "session-view")
        by_id("close-session").click()
        wait.until(lambda d: "Closed" in by_id("session-state").text)

    def history_has_the_runs():
        by_id("tab-server").click()
        wait.until(lambda d: "Updated" in by_id("server-state").text)
        rows = driver.find_elements(By.CSS_SELECTOR, "#history tbody tr")
        assert len(rows) >= 3, [r.text for r in rows]
        Select(by_id("history-status")).select_by_value("compile_error")
        driver.find_element(By.CSS_SELECTOR, "#history-form button").click()
        wait.until(lambda d: d.execute_script(
            "const rows = [...document.querySelectorAll('#history tbody tr')];"
            "return rows.length > 0 && rows.every(r => r.textContent.includes('Compile error'))"
            " && rows[0].querySelector('button') !== null"))
        for _ in range(5):  # the table may be drawn again meanwhile
            try:
                driver.find_element(By.CSS_SELECTOR, "#history tbody tr button").click()
                break
            except Exception:  # noqa: BLE001 - a stale row: find it again
                time.sleep(0.2)
        wait.until(lambda d: "Compile error" in by_id("report-view").text)
        numbers = by_id("numbers").text
        assert "Runs executing" in numbers and "Pool" in numbers, numbers
        shot("server", "server-title")

    def keyboard_only():
        driver.get(base + "/")
        box = by_id("token")
        box.send_keys(token, Keys.ENTER)
        wait.until(EC.visibility_of_element_located((By.ID, "play")))
        # Tab from the language picker reaches the editor, then Ctrl+Enter runs.
        active = driver.switch_to.active_element
        assert active.get_attribute("id") == "language", active.get_attribute("id")
        Select(by_id("language")).select_by_value("python")
        active.send_keys(Keys.TAB)
        editor = driver.switch_to.active_element
        assert editor.get_attribute("id") == "code", editor.get_attribute("id")
        driver.execute_script("arguments[0].value = 'print(7 * 6)'", editor)
        editor.send_keys(Keys.CONTROL, Keys.ENTER)
        wait.until(lambda d: "Succeeded" in by_id("summary").text)
        assert "42" in by_id("output").text

    def another_origin_is_refused():
        # The same browser, a page served by another origin (a second loopback port),
        # with the token: the API refuses it.
        driver.get(other + "/")
        result = driver.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            fetch(arguments[0] + '/v1/runs', {method: 'POST', headers: {'Authorization': 'Bearer ' + arguments[1],
                  'Content-Type': 'application/json'}, body: JSON.stringify({language: 'python', code: 'print(1)'})})
              .then(r => done('answered ' + r.status), e => done('refused: ' + e));
            """,
            base, token,
        )
        assert result.startswith("refused"), result
        # And a "simple" request the browser sends without asking first reaches the server
        # and is refused there.
        req = urllib.request.Request(base + "/v1/runs", method="POST", data=b'{"language":"python","code":"print(1)"}')
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Origin", other)
        req.add_header("Content-Type", "text/plain")
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 403, e.code
            assert json.loads(e.read())["error"]["code"] == "forbidden"

    try:
        check("the page: a strict Content-Security-Policy, nothing from elsewhere", page_and_headers)
        check("a wrong token is told, and nothing else is shown", wrong_token_is_told)
        check("the token is typed once and kept out of cookies, storage and the URL", login)
        check("python prints (live, while it runs) and plots: the image appears, a file to download", python_prints_live_and_plots)
        check("C++ with a compile error is shown as one", cpp_compile_error)
        check("readable at a phone's width (no sideways scrolling)", phone_width)
        check("a session: two cells share a variable, its files, closed", session_with_two_cells)
        check("the server: numbers, history with filters, a report opened", history_has_the_runs)
        check("usable by keyboard: token, picker, editor, Ctrl+Enter", keyboard_only)
        check("a page of another origin cannot use the API", another_origin_is_refused)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    print(f"console: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
