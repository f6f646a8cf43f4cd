from payload import units


def test_duration_and_eta():
    assert units.duration(None) == "-"
    assert units.duration(5.4) == "5s"
    assert units.duration(425) == "7m05s"
    assert units.duration(3 * 3600 + 12 * 60 + 9) == "3h12m"
    assert units.eta(100, 0) == "-"
    assert units.eta(None, 3) == "-"
    assert units.eta(0, 3) == "0s"
    assert units.eta(120, 2) == "1m00s"


def test_size_and_rate():
    assert units.size(None) == "?"
    assert units.size(512) == "512 B"
    assert units.size(1_300_000) == "1.3 MB"
    assert units.size(2.5e9) == "2.5 GB"
    assert units.rate(0) == "-"
    assert units.rate(1e8) == "100.0 MB/s"
