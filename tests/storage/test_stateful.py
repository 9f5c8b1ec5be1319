"""Hypothesis drives random append / truncate_suffix / compact_prefix / reset / close+reopen / crash-mid-append
sequences against FileLogStore and MemoryLogStore (the model); after every step they must agree on the tail,
the first index, the snapshot point and every byte and term they still hold."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from storage import codec
from storage.filestore import FileLogStore
from storage.memory import MemoryLogStore
from tests.storage.faults import CrashIO, SimulatedCrash, abandon
from tests.storage.helpers import build

SEGMENT = 512
UNITS = 8


class LogAgainstModel(RuleBasedStateMachine):
    @initialize(flush=st.sampled_from(["sync", "async"]))
    def setup(self, flush):
        self.dir = tempfile.mkdtemp(prefix="storage-stateful-")
        self.flush = flush
        self.file = self._open()
        self.model = MemoryLogStore(segment_size=SEGMENT)

    def _open(self, io=None):
        return FileLogStore.open(self.dir, segment_size=SEGMENT, flush=self.flush, index_units=UNITS, io=io)

    def teardown(self):
        if hasattr(self, "file") and not self.file._closed:
            self.file.close()
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _frames(self, sizes, bump):
        t = self.model.tail()
        return build(t, [bytes([len(sizes) % 251]) * n for n in sizes], max(t.last_term, 1) + bump, SEGMENT)

    @rule(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12), bump=st.integers(0, 1))
    def append(self, sizes, bump):
        frames = self._frames(sizes, bump)
        assert self.file.append(frames) == self.model.append(frames)

    @rule(data=st.data())
    def bad_append(self, data):
        frames = bytearray(self._frames([10, 20], 0))
        i = data.draw(st.integers(codec.HEADER_SIZE, codec.HEADER_SIZE + 9))  # a body byte of the first entry
        frames[i] ^= 0xFF
        for s in (self.file, self.model):
            try:
                s.append(bytes(frames))
            except codec.FrameError:
                continue
            raise AssertionError("a damaged frame was accepted")

    @rule(data=st.data())
    def truncate_suffix(self, data):
        i = data.draw(st.integers(self.model.first_index, self.model.last_index + 1))
        self.file.truncate_suffix(i)
        self.model.truncate_suffix(i)

    @rule(data=st.data())
    def compact_prefix(self, data):
        i = data.draw(st.integers(self.model.first_index, self.model.last_index + 1))
        self.file.compact_prefix(i)
        self.model.compact_prefix(i)

    @rule(skip=st.integers(0, 3), gap=st.integers(0, 3 * SEGMENT))
    def reset_to_snapshot(self, skip, gap):
        t = self.model.tail()
        args = (
            t.last_index + skip,
            max(t.last_term, 1),
            (t.chain_crc * 31 + skip) & 0xFFFFFFFF,
            t.end_pos + gap,
        )
        self.file.reset_to_snapshot(*args)
        self.model.reset_to_snapshot(*args)

    @rule()
    def reopen(self):
        self.file.close()
        self.file = self._open()

    @rule(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8), data=st.data())
    def crash_during_append(self, sizes, data):
        frames = self._frames(sizes, 0)
        budget = data.draw(st.integers(0, len(frames) + 16))
        self.file.close()
        crashing = self._open(io=CrashIO(budget))
        before = self.model.last_index
        try:
            crashing.append(frames)
        except SimulatedCrash:
            abandon(crashing)
        else:
            crashing.close()
        self.file = self._open()
        assert before <= self.file.last_index <= before + len(sizes)
        self.model.append(frames)
        self.model.truncate_suffix(self.file.last_index + 1)

    @precondition(lambda self: hasattr(self, "file"))
    @invariant()
    def agree(self):
        f, m = self.file, self.model
        assert f.tail() == m.tail()
        assert (f.first_index, f.last_index) == (m.first_index, m.last_index)
        assert f.snapshot_point() == m.snapshot_point()
        assert f.term(f.first_index - 1) == m.term(m.first_index - 1)
        if m.last_index >= m.first_index:
            assert f.raw(m.first_index, m.last_index + 1) == m.raw(m.first_index, m.last_index + 1)
            assert [f.term(i) for i in range(m.first_index, m.last_index + 1)] == [
                m.term(i) for i in range(m.first_index, m.last_index + 1)
            ]


def test_log_against_model():
    run_state_machine_as_test(
        LogAgainstModel,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.slow
def test_log_against_model_long():
    run_state_machine_as_test(
        LogAgainstModel,
        settings=settings(
            max_examples=400,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
