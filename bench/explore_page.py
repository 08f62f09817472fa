"""The explorer page on SmolLM2-135M at full size (30 blocks x 9 heads, a ~100-token prompt): its file size,
the time to compute it, and the time Chromium takes to draw it and to answer a hover and a click; then the
README's screenshots, taken in the same headless Chromium (Selenium + Debian's chromium-driver).

    .venv/bin/python bench/explore_page.py [--tokens 100] [--shots docs/explore]

Render time: `performance.now()` when the page's script has drawn everything (from the start of
navigation, parsing the embedded JSON included), median of --repeats loads. The machine may be shared:
compare runs made together. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
        "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally "
        "nicknamed the Iron Lady, it was constructed as the centrepiece of the 1889 World's Fair, and to crown the "
        "centennial anniversary of the French Revolution. Although initially criticised by some of France's leading "
        "artists and intellectuals for its design, it has since become a global cultural icon of France and one of "
        "the most recognisable structures in the world.")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def browser(profile: str, width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for f in FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        opts.add_argument(f)
    opts.binary_location = "/usr/bin/chromium"
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def small_png(src: Path, dst: Path, colours: int = 64) -> None:
    """A screenshot as a palette PNG (a few tens of kB instead of hundreds)."""
    from PIL import Image

    dst.parent.mkdir(parents=True, exist_ok=True)
    Image.open(src).convert("RGB").quantize(colours).save(dst, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100, help="prompt length to time (0: screenshots only)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shots", default=None, help="write the README's screenshots into this folder")
    args = ap.parse_args()

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from lumen.files import write_text
    from lumen.formats import load
    from lumen.report.explore import explore_data, explore_page

    loaded = load("smollm2")
    model, tok = loaded.model.eval(), loaded.tokenizer
    tmp = Path(tempfile.mkdtemp(prefix="explore-bench-"))
    drv = browser(str(tmp / "profile"), 1500, 1000)
    try:
        if args.tokens:
            ids = tok.encode(TEXT)[: args.tokens]
            t0 = time.perf_counter()
            data = explore_data(model, tok, tok.decode(ids))
            computed = time.perf_counter() - t0
            big = write_text(tmp / "big.html", explore_page(data))
            print(f"SmolLM2-135M, {len(data['tokens'])} tokens, {data['n_layers']} blocks x {data['n_heads']} heads: "
                  f"{big.stat().st_size / 1e6:.2f} MB page, computed in {computed:.1f} s")
            renders = []
            for _ in range(args.repeats):
                drv.get(big.as_uri())
                renders.append(float(drv.find_element(By.TAG_NAME, "body").get_attribute("data-rendered")))
            cells = len(drv.find_elements(By.CSS_SELECTOR, "#lens td.cell"))
            click = drv.execute_script(
                "const t0 = performance.now(); select(40); showPattern(20, 3); return performance.now() - t0;")
            print(f"render {statistics.median(renders):.0f} ms (median of {args.repeats}: "
                  f"{', '.join(f'{r:.0f}' for r in renders)}), {cells} lens cells; a column click + a head click "
                  f"redraw in {click:.0f} ms")
        if args.shots:
            shots = Path(args.shots)
            eiffel = explore_data(model, tok, "The Eiffel Tower is in the city of", contrast=(" Paris", " Rome"),
                                  corrupt="The Colosseum is in the city of")
            page = write_text(tmp / "eiffel.html", explore_page(eiffel))
            drv.set_window_size(1600, 900)   # wide enough for the bars, the head map and a pattern side by side
            time.sleep(1)
            drv.get(page.as_uri())
            cell = drv.find_element(By.CSS_SELECTOR, '#lens td.cell[data-layer="24"][data-t="8"]')
            ActionChains(drv).move_to_element(cell).perform()
            drv.save_screenshot(str(tmp / "lens.png"))
            small_png(tmp / "lens.png", shots / "lens.png")
            drv.find_element(By.CSS_SELECTOR, '#heads td.head[data-layer="23"][data-head="4"]').click()
            drv.execute_script("document.getElementById('attr-title').scrollIntoView()")
            drv.save_screenshot(str(tmp / "attribution.png"))
            small_png(tmp / "attribution.png", shots / "attribution.png")
            drv.execute_script("document.getElementById('patching-box').scrollIntoView()")
            drv.save_screenshot(str(tmp / "patching.png"))
            small_png(tmp / "patching.png", shots / "patching.png")
            print(f"wrote {', '.join(str(p) for p in sorted(shots.glob('*.png')))}")
    finally:
        drv.quit()


if __name__ == "__main__":
    main()
