"""The usage scenario (issue 41): an admin key signs in and opens Usage;
the chart has a bar per day of the range with today's tokens, the table
breaks them down by model and, switched, by key name; a wider range
draws more days. scenarios.py lists it; it is apart only to keep files
short."""

from selenium.webdriver.support.ui import Select

from scenarios import Failure

BARS_JS = """return [...document.querySelectorAll('[data-testid="usage-bar"]')]
  .map((el) => ({day: el.dataset.day, tokens: Number(el.dataset.tokens), height: Number(el.getAttribute('height'))}));"""
ROWS_JS = """return [...document.querySelectorAll('[data-testid="usage-row"]')]
  .map((el) => ({group: el.dataset.group, text: el.textContent}));"""


def bars(b):
    return b.driver.execute_script(BARS_JS)


def rows(b):
    return b.driver.execute_script(ROWS_JS)


def scenario_usage(b, args):
    if not args.key:
        raise Failure("the usage scenario needs --key (an admin key)")
    b.open("/")
    b.tid("key-input").send_keys(args.key)
    b.click("key-submit")
    b.click("nav-usage", 15)
    b.wait(lambda: b.path() == "/ui/usage", 10, "the usage view")
    b.wait(lambda: len(bars(b)) == 7, 20, "a bar for each of the last seven days")
    week = bars(b)
    today = week[-1]
    if today["tokens"] <= 0 or today["height"] <= 0:
        raise Failure(f"today's bar shows no tokens: {today}")
    if any(bar["tokens"] or bar["height"] for bar in week[:-1]):
        raise Failure(f"days before today show usage: {week}")
    b.wait(lambda: rows(b), 20, "the breakdown by model")
    by_model = rows(b)
    b.shot("usage")

    Select(b.tid("usage-by")).select_by_value("key")
    b.wait(lambda: rows(b) and all(r["group"] != "demo" for r in rows(b)), 20, "the breakdown by key")
    by_key = rows(b)
    page = b.driver.page_source
    for secret in args.secret or []:
        if secret in page:
            raise Failure("a key is on the page")

    Select(b.tid("usage-range")).select_by_value("30")
    b.wait(lambda: len(bars(b)) == 30, 20, "a bar for each of the last thirty days")
    return {
        "today": today,
        "days": [bar["day"] for bar in week],
        "models": [r["group"] for r in by_model],
        "keys": [r["group"] for r in by_key],
        "key_rows": [" ".join(r["text"].split()) for r in by_key],
        "total": b.tid("usage-total").text,
    }
