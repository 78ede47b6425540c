"""Add a to-do through the product's page, as a user would (a corral browser check).

Runs inside the verifier sandbox: Playwright for Python connects to the
Chromium corral started there (CORRAL_CDP_URL); the product is at PRODUCT_URL.
The exit status is the verdict; what it prints is shown as the check's output.
"""

import json
import os
import sys
import urllib.request

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

URL = os.environ["PRODUCT_URL"]

with sync_playwright() as pw:
    browser = pw.chromium.connect_over_cdp(os.environ["CORRAL_CDP_URL"])
    page = browser.new_context().new_page()
    page.goto(URL + "/")
    page.fill("#title", "buy milk")
    page.click("#add")
    try:
        page.wait_for_selector("#todos li:has-text('buy milk')", timeout=5000)
    except PlaywrightTimeout:
        print("after clicking #add, the list #todos does not show 'buy milk'")
        sys.exit(1)
    browser.close()

opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(URL + "/todos", timeout=5) as resp:
    titles = [t["title"] for t in json.load(resp)]
if "buy milk" not in titles:
    print(f"the page showed 'buy milk' but GET /todos has {titles!r}")
    sys.exit(1)
print("the page added 'buy milk' and the server has it")
