"""A long transcript (3,000 events: 30 pages) opens with its latest page and
scrolls up through all of it: older pages (?before=) load above, keeping the
reading position. (It was 10,000: the same pages and code, 100 times, cost
make test ~50 s; 30 pages prove the paging as well.)"""

import pytest

from .conftest import assert_contiguous, seqs

pytestmark = pytest.mark.live

EVENTS = 3_000


def test_open_and_scroll_up_through_a_long_transcript(server, actor, page):
    agent = server.create_agent(actor)
    server.django(
        "from sessions import journal\n"
        f"for start in range(0, {EVENTS}, 1000):\n"
        f"    journal.append_many({agent!r}, [('operator.note', {{'text': f'event {{start + i + 1}}'}})"
        " for i in range(1000)])\n"
    )
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator(f"#row-{EVENTS}").wait_for()
    assert page.locator("#rows > li").count() == 100  # only the latest page is drawn

    box = page.locator("#transcript")
    # One step by hand: the row on top of the view stays where it was.
    top = page.evaluate("""() => { const b = document.getElementById('transcript');
        b.scrollTop = 0; const r = document.querySelector('#rows > li');
        return {id: r.id, y: r.getBoundingClientRect().top}; }""")
    page.wait_for_function("() => document.querySelectorAll('#rows > li').length > 100")
    page.wait_for_timeout(100)
    y = page.evaluate(f"document.getElementById({top['id']!r}).getBoundingClientRect().top")
    assert abs(y - top["y"]) <= 2, f"reading position moved by {y - top['y']} px"

    # Then all the way up.
    for _ in range(EVENTS // 100):
        if page.locator("#row-1").count():
            break
        count = page.locator("#rows > li").count()
        box.evaluate("b => { b.scrollTop = 0; }")
        page.wait_for_function(f"() => document.querySelectorAll('#rows > li').length > {count}")
    assert page.locator("#row-1").count() == 1
    assert "Start of the transcript" in page.locator("#older").inner_text()
    values = seqs(page)
    assert len(values) == EVENTS and values[0] == 1
    assert_contiguous(values)
