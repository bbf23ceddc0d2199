"""The screenshot of docs/guide/report.md: the top of a report page in headless Chromium, kept small.

    .venv/bin/python scripts/report_screenshot.py report-v1-224.html docs/guide/report.png

Opens the page from disk with Debian's chromium and chromium-driver through selenium (as tests/test_report.py
does), shoots HEIGHT CSS pixels of it at 1280 wide, halves it and stores it with a 96-colour palette (about 60 kB).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page")
    ap.add_argument("png")
    ap.add_argument("--height", type=int, default=2500, help="CSS pixels of the page's top to shoot")
    ap.add_argument("--colours", type=int, default=96)
    args = ap.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        driver.get(Path(args.page).resolve().as_uri())
        driver.set_window_size(1280, args.height)
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
    im = Image.open(io.BytesIO(png)).convert("RGB")
    im = im.resize((im.width // 2, im.height // 2), Image.Resampling.LANCZOS)
    im = im.quantize(args.colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    im.save(args.png, optimize=True)
    print(f"{args.png}: {im.width}x{im.height}, {Path(args.png).stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
