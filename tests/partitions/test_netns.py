"""The lab's own checks that need no namespaces: why it cannot run, and what it refuses."""

from pathlib import Path

import pytest
from support import netns
from support.netns import NetnsLab, netns_unavailable


def test_without_root_the_lab_says_why(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns_unavailable() == "network namespaces need root (ip netns add)"


@pytest.mark.parametrize("hosts, message", [([], "1-250 distinct"), (["a", "a"], "1-250 distinct"),
                                            (["bad-name"], "'bad-name' must be"), (["x" * 13], "must be 1-12"),
                                            (["sw"], "not 'sw'")])
def test_bad_host_names_are_refused_by_name(hosts, message, tmp_path: Path):
    with pytest.raises(ValueError, match=message):
        NetnsLab(hosts, tmp_path)


def test_an_unknown_host_is_named(tmp_path: Path):
    with pytest.raises(ValueError, match="no host 'nope' in this lab"):
        NetnsLab(["redis", "agent0"], tmp_path).host("nope")
