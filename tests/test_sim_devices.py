"""Device profiles: every number sourced, the paper's default present, the Flash read-size curve."""

import pytest

from dipdeploy.sim.devices import GB, FlashModel, get_device, list_devices


def test_profiles_cover_the_issue_and_are_sourced():
    names = {d.name for d in list_devices()}
    assert {"a18-paper", "a18", "sd8gen3", "midrange", "laptop-nvme"} <= names
    for d in list_devices():
        assert d.sources and all(str(v).strip() for v in d.sources.values())


def test_paper_default_profile():
    d = get_device("a18-paper")
    assert (d.dram_bandwidth, d.flash.seq_bandwidth, d.dram_capacity) == (60 * GB, 1 * GB, 8 * GB)
    assert d.flash.request_s == 0.0


def test_small_reads_are_slower_than_large_ones():
    for d in list_devices():
        if d.flash.request_s == 0:
            continue
        bw = [d.flash.effective_bandwidth(s) for s in (4096, 65536, 1 << 20)]
        assert bw[0] < bw[1] < bw[2] < d.flash.seq_bandwidth


def test_iops_derive_the_request_cost():
    d = get_device("midrange")  # UFS 3.1: 2.1 GB/s sequential, 100K IOPS → 4 KiB in 10 µs
    assert d.flash.read_time(1, 4096) == pytest.approx(1e-5)


def test_unsourced_number_is_refused(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text('name = "x"\ndram_bandwidth_gbs = 10\ndram_bandwidth_gbs_source = "spec"\n'
                 'dram_capacity_gb = 4\ndram_capacity_gb_source = "assumption: guess"\n'
                 'flash_seq_read_gbs = 1\nflash_request_us = 5\nflash_request_us_source = "x"\n')
    with pytest.raises(ValueError, match="without a source: flash_seq_read_gbs"):
        get_device(str(p))


def test_unknown_device_lists_profiles():
    with pytest.raises(KeyError, match="a18-paper"):
        get_device("pixel-99")


def test_flash_model_validation():
    with pytest.raises(ValueError, match="seq_bandwidth"):
        FlashModel(seq_bandwidth=0, request_s=0)
    with pytest.raises(ValueError, match="request_s"):
        FlashModel(seq_bandwidth=1e9, request_s=-1)
