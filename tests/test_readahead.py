"""--prefetch auto's choice (dipdeploy/runtime/readahead.py): alternate tokens on and off, then the setting
with the shorter median token, on when equal."""

from dipdeploy.runtime.readahead import ReadAheadProbe


def _probe(on: list[float], off: list[float]) -> ReadAheadProbe:
    p = ReadAheadProbe(tokens=len(on))
    for a, b in zip(on, off):
        assert p.next() is True
        p.record(True, a)
        assert p.chosen is None or len(on) == 1
        assert p.next() is False
        p.record(False, b)
    return p


def test_the_faster_median_wins_and_a_tie_keeps_the_read_ahead():
    assert _probe([0.20, 0.21, 0.90], [0.18, 0.19, 0.19]).chosen is False  # one slow "on" token aside
    assert _probe([0.10, 0.30, 0.11], [0.12, 0.12, 0.12]).chosen is True
    assert _probe([0.15, 0.15], [0.15, 0.15]).chosen is True


def test_the_choice_holds_once_made():
    p = _probe([0.3, 0.3], [0.1, 0.1])
    for _ in range(5):
        assert p.next() is False
        p.record(False, 9.0)
    assert p.chosen is False and len(p.seconds[False]) == 2
    assert p.describe().startswith("auto: off (300 ms a token on, 100 off")


def test_under_way_it_says_so():
    p = ReadAheadProbe(tokens=3)
    p.record(True, 0.1)
    assert p.describe() == "auto: probing (0 of 3 tokens each)" and p.next() is False
