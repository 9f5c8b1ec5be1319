"""On a failing scenario, attach the transcript of every cluster the test built to the pytest report."""

from __future__ import annotations

import pytest

from tests.sim import cluster as cluster_module


@pytest.fixture(autouse=True)
def _record_clusters(request, monkeypatch):
    built: list[cluster_module.Cluster] = []
    original = cluster_module.Cluster.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(cluster_module.Cluster, "__init__", init)
    request.node.sim_clusters = built
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        for i, c in enumerate(getattr(item, "sim_clusters", [])):
            rep.sections.append((f"transcript of cluster {i} (seed {c.seed})", c.dump(300)))
