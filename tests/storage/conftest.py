"""Store factories for the storage tests: the same contract runs against every LogStore implementation."""

from __future__ import annotations

import pytest

from storage.filestore import FileLogStore
from storage.memory import MemoryLogStore

SEGMENT = 1024  # small data files so tests cross segment boundaries often
INDEX_UNITS = 16  # small index files so tests cross index files too


class Factory:
    """Builds a store of one kind; ``reopen`` closes and opens it again (memory: the same object)."""

    def __init__(self, kind: str, tmp_path, flush: str = "sync"):
        self.kind = kind
        self.dir = str(tmp_path / "node")
        self.flush = flush

    def open(self, segment_size: int = SEGMENT):
        if self.kind == "memory":
            return MemoryLogStore(segment_size=segment_size)
        return FileLogStore.open(
            self.dir, segment_size=segment_size, flush=self.flush, index_units=INDEX_UNITS
        )

    def reopen(self, store):
        if self.kind == "memory":
            return store
        store.close()
        return FileLogStore.open(
            self.dir, segment_size=store.segment_size, flush=self.flush, index_units=INDEX_UNITS
        )


@pytest.fixture(params=["memory", "file-sync", "file-async"])
def factory(request, tmp_path):
    kind = request.param
    if kind == "memory":
        return Factory("memory", tmp_path)
    return Factory("file", tmp_path, flush=kind.split("-")[1])


@pytest.fixture
def store(factory):
    s = factory.open()
    yield s
    if not getattr(s, "_closed", False):
        s.close()
