"""The fault launcher's stalled disk (dledger/chaos/faultnode.py ``stall_sync``): one fdatasync at or after the
given moment sleeps, once; before that moment, and after it was taken, syncs go straight through."""

from __future__ import annotations

import os
import time

from dledger.chaos import faultnode


def test_a_stall_is_taken_once_and_not_before_its_moment(tmp_path, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(faultnode.time, "sleep", slept.append)
    io = faultnode.SwitchableFullDisk(
        str(faultnode.control_path(tmp_path)), str(faultnode.stall_path(tmp_path))
    )
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        faultnode.stall_sync(tmp_path, time.time() + 3600, 250)
        io.fdatasync(fd)
        assert slept == [] and faultnode.stall_path(tmp_path).exists(), "not yet its moment"
        faultnode.stall_sync(tmp_path, time.time(), 250)
        io.fdatasync(fd)
        io.fdatasync(fd)
        assert slept == [0.25] and not faultnode.stall_path(tmp_path).exists()
        faultnode.stall_path(tmp_path).write_text("garbage\n")  # unreadable: ignored, never a failed sync
        io.fdatasync(fd)
        assert slept == [0.25]
    finally:
        os.close(fd)
