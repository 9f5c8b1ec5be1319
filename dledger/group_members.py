"""Membership of a local group: add a learner, promote it, remove a member, replace a dead node (docs/membership.md).

The group's files are ``dledger.group``'s; these change who is in it, through the leader's ``ChangeMembership``
call (a configuration entry in the log), and keep group.json in step. ``dledger member`` and
``dledger group replace-node`` (``dledger/member.py``) are the commands over them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dledger.errors import ConfigError, UnavailableError
from dledger.group import (
    GroupSpec,
    NodeSpec,
    _node_toml,
    _write_manifest,
    client_security,
    configuration,
    free_ports,
    is_running,
    load,
    start_node,
    stop_node,
    wait_caught_up,
)
from dledger.recovery import Recovered


def _client(group: GroupSpec, timeout_s: float = 15.0):
    from dledger.client import DLedgerClient

    return DLedgerClient(
        group.addresses,
        group.name,
        timeout_s=timeout_s,
        rpc_timeout_s=min(5.0, timeout_s),
        **client_security(group.security),
    )


def _next_id(group: GroupSpec, directory: Path) -> str:
    """The first free ``nK`` (an id never reused while its directory exists: a removed node's log stays)."""
    taken = {n.id for n in group.nodes}
    k = 0
    while f"n{k}" in taken or (directory / f"n{k}").exists():
        k += 1
    return f"n{k}"


def add_member(
    directory: Path,
    node_id: str | None = None,
    port: int | None = None,
    *,
    module: str = "dledger",
    on_recorded: Callable[[], None] | None = None,
) -> NodeSpec:
    """Start a new node on a new directory and port, joining as a learner: it knows no configuration until the
    leader's log (or snapshot) reaches it. Records it in group.json, then asks the leader to add it; returns
    once the change committed. It catches up by itself; ``promote_member`` makes it a voter.

    The newcomer's config keeps the tables of the group's own nodes that the log layer does not write (a
    tenant's, e.g. a cluster's ``[broker]`` name servers). In a proxied (chaos) group it gets a proxy link to
    and from every member (``GroupSpec.links``; the chaos runner listens on them) and dials the others through
    them, and each member's ``[dial]`` names its link to the newcomer before the change (``_add_dial``), so the
    members dial it through the proxies too. ``module``: what runs the node (``start_node``'s, e.g. the chaos
    fault launcher). ``on_recorded()`` runs once group.json names the newcomer and its links, before it starts
    and before the change: the chaos runner listens on the new links then, so that the members' first dials to
    the newcomer reach it."""
    directory = Path(directory).resolve()
    group = load(directory)
    node_id = node_id or _next_id(group, directory)
    if any(n.id == node_id for n in group.nodes):
        raise ConfigError(f"node {node_id} is already in the group in {directory}")
    port = port or free_ports(1)[0]
    spec = NodeSpec(
        node_id, f"127.0.0.1:{port}", str(directory / node_id), str(directory / node_id / "node.toml")
    )
    if Path(spec.data_dir).exists() and any(Path(spec.data_dir).iterdir()):
        raise ConfigError(f"{spec.data_dir} is not empty: a new member starts from an empty directory")
    links = group.links
    if links:
        pairs = [(node_id, n.id) for n in group.nodes] + [(n.id, node_id) for n in group.nodes]
        taken = {p for _, _, p in links} | {port}
        ports = [p for p in free_ports(len(pairs) + len(taken)) if p not in taken][: len(pairs)]
        if len(ports) < len(pairs):
            raise ConfigError("could not find free ports for the new member's proxy links")
        links = (*links, *((a, b, p) for (a, b), p in zip(pairs, ports, strict=True)))
        for n in group.nodes:  # before the change: each member dials the newcomer through its own link
            via = next(p for a, b, p in links if a == n.id and b == node_id)
            # (a dead member's directory may be gone: replace-node)
            with contextlib.suppress(FileNotFoundError):
                _add_dial(Path(n.config), node_id, f"127.0.0.1:{via}")
    grown = GroupSpec(
        group.name, group.flush, (*group.nodes, spec), group.state_machine, links, group.security
    )
    if group.security:  # its certificate, from the group's CA: peers accept it once the add is in their log
        from dledger.security.bootstrap import issue_node_certificate

        issue_node_certificate(Path(group.security).parent, node_id, grown.addresses)
    Path(spec.data_dir).mkdir(parents=True, exist_ok=True)
    Path(spec.config).write_text(_node_toml(spec, grown, _raft_of(group), join=True) + _tenant_tables(group))
    _write_manifest(directory, grown)
    if on_recorded is not None:
        on_recorded()
    start_node(spec, module)
    with _client(group) as c:
        c.change_membership("add-learner", node_id, spec.address)
    return spec


OWN_TABLES = frozenset({"peers", "raft", "security", "dial"})  # what ``_node_toml`` and ``_add_dial`` write


def _add_dial(config: Path, node_id: str, address: str) -> None:
    """Tell the node whose config this is to dial ``node_id`` at ``address`` (its ``[dial]`` table, read again
    when the node learns of a new member: dledger/nodeconfig.py ``dial_address``). Only ``[dial]``: a member
    added to ``[peers]`` would become a voter of the starting configuration on the node's next start."""
    import tomllib

    text = config.read_text()
    line = f'{node_id} = "{address}"'
    if "dial" in tomllib.loads(text):
        lines = text.splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.replace(" ", "").startswith("[dial]"))
        lines.insert(at + 1, line)
        text = "\n".join(lines) + "\n"
    else:
        text = text.rstrip("\n") + f"\n\n[dial]\n{line}\n"
    tomllib.loads(text)  # still one valid file, or nothing is written
    tmp = config.with_name(config.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, config)


def _tenant_tables(group: GroupSpec) -> str:
    """The tables of a member's node.toml that ``_node_toml`` does not write, as text to append (the layers
    above add theirs to the file, e.g. ``broker_adapter/cluster/local.py``'s ``[broker]``)."""
    import tomllib

    for n in group.nodes:
        try:
            text = Path(n.config).read_text()
            tomllib.loads(text)
        except (OSError, tomllib.TOMLDecodeError):
            continue
        out: list[str] = []
        keep = False
        for line in text.splitlines():
            head = line.strip()
            if head.startswith("[") and head.endswith("]"):
                keep = head.strip("[]").split(".")[0].strip() not in OWN_TABLES
            if keep:
                out.append(line)
        return ("\n" + "\n".join(out) + "\n") if out else ""
    return ""


def _raft_of(group: GroupSpec) -> dict[str, int | str]:
    """The [raft] settings of the group's first node (a new member must time like the others)."""
    import tomllib

    for n in group.nodes:
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
            return dict(tomllib.loads(Path(n.config).read_text()).get("raft", {}))
    return {}


def wait_learner_caught_up(group: GroupSpec, node_id: str, timeout_s: float = 60.0) -> int:
    """Poll until ``node_id`` has committed what the leader had committed when asked; returns that index."""
    deadline = time.monotonic() + timeout_s
    lead = configuration(group)
    while lead is None and time.monotonic() < deadline:  # an election in progress, or a slow answer
        time.sleep(0.2)
        lead = configuration(group, timeout_s=2.0)
    if lead is None:
        raise UnavailableError(f"no leader answered within {timeout_s:.0f} s; try again once one is elected")
    row = wait_caught_up(group, node_id, lead.commit_index, timeout_s)
    if row is None or row.commit_index is None or row.commit_index < lead.commit_index:
        raise UnavailableError(
            f"{node_id} did not catch up to index {lead.commit_index} within {timeout_s:.0f} s "
            f"(it holds {None if row is None else row.commit_index}); see {group.node(node_id).data_dir}/node.log"
        )
    return lead.commit_index


def promote_member(directory: Path, node_id: str, timeout_s: float = 60.0) -> None:
    """Make learner ``node_id`` a voter once it has caught up (the leader refuses a learner that lags)."""
    group = load(directory)
    group.node(node_id)
    wait_learner_caught_up(group, node_id, timeout_s)
    deadline = time.monotonic() + timeout_s
    with _client(group) as c:
        while True:
            try:
                c.change_membership("promote", node_id)
                return
            except UnavailableError as e:  # still a little behind, or a change in flight: retry shortly
                if time.monotonic() > deadline:
                    raise UnavailableError(f"could not promote {node_id}: {e}") from e
                time.sleep(0.1)


def remove_member(directory: Path, node_id: str, stop: bool = True) -> None:
    """Remove ``node_id`` from the configuration (the leader transfers leadership first if it is the one
    removed), then stop its process and drop it from group.json; its directory stays on disk."""
    directory = Path(directory).resolve()
    group = load(directory)
    spec = group.node(node_id)
    others = _without(group, node_id)
    with _client(group) as c:
        c.change_membership("remove", node_id)
    if stop:
        stop_node(spec)
    _write_manifest(directory, others)


def forget_member(directory: Path, node_id: str) -> None:
    """Drop ``node_id`` from group.json only: a node whose add never reached the configuration (the change
    failed), so there is nothing to remove through the leader. Its process must be stopped first."""
    directory = Path(directory).resolve()
    group = load(directory)
    if is_running(group.node(node_id)):
        raise ConfigError(f"{node_id} is still running: stop it before dropping it from {directory}")
    _write_manifest(directory, _without(group, node_id))


def _without(group: GroupSpec, node_id: str) -> GroupSpec:
    """``group`` less ``node_id`` (and its proxy links)."""
    return GroupSpec(
        group.name,
        group.flush,
        tuple(n for n in group.nodes if n.id != node_id),
        group.state_machine,
        tuple(lk for lk in group.links if node_id not in lk[:2]),
        group.security,
    )


@dataclass(frozen=True, slots=True)
class Replacement:
    dead: str
    new: str
    address: str
    caught_up_index: int
    seconds: float


def replace_node(
    directory: Path,
    dead: str,
    port: int | None = None,
    timeout_s: float = 120.0,
    *,
    module: str = "dledger",
    node_id: str | None = None,
    on_recorded: Callable[[], None] | None = None,
) -> Replacement:
    """Replace node ``dead`` (its machine is gone) by a new node on a new directory and port: start it as a
    learner, let it catch up (snapshot + log, streamed by the leader), promote it, then remove ``dead``. The
    group keeps serving throughout: until the removal a dead voter counts as a missing vote, as before.
    ``on_recorded``: ``add_member``'s."""
    t0 = time.monotonic()
    directory = Path(directory).resolve()
    group = load(directory)
    group.node(dead)
    if len(group.nodes) < 2:
        raise ConfigError("a one-node group cannot replace its only node: add a member first")
    spec = add_member(directory, node_id, port=port, module=module, on_recorded=on_recorded)
    group = load(directory)
    index = wait_learner_caught_up(group, spec.id, timeout_s)
    promote_member(directory, spec.id, timeout_s)
    remove_member(directory, dead)
    return Replacement(dead, spec.id, spec.address, index, time.monotonic() - t0)


def recover_group(directory: Path, survivor: str, start: bool = True) -> Recovered:
    """A group whose majority is lost for good becomes a one-node group of ``survivor``, with its whole log
    (``dledger.recovery``): its other members leave group.json, and the survivor is started again (``start``),
    ready for ``add_member``. Refused while any other member runs: recovering beside a live majority would make
    two groups out of one."""
    from dledger.nodeconfig import load as load_config
    from dledger.recovery import make_sole_voter

    directory = Path(directory).resolve()
    group = load(directory)
    spec = group.node(survivor)
    if group.links:
        raise ConfigError("recovery is not supported on a proxied (chaos) group")
    running = [n.id for n in group.nodes if n.id != survivor and is_running(n)]
    if running:
        raise ConfigError(
            f"{', '.join(running)} still running: `group recover` is for a group that lost its majority for good; "
            "a group with a live majority elects a leader by itself (`member remove` the dead nodes instead)"
        )
    stop_node(spec)  # a survivor left running waits for votes that never come; its log is taken offline
    recovered = make_sole_voter(load_config(Path(spec.config)), spec.address)
    alone = GroupSpec(group.name, group.flush, (spec,), group.state_machine, security=group.security)
    Path(spec.config).write_text(_node_toml(spec, alone, _raft_of(group)))
    _write_manifest(directory, alone)
    if start:
        start_node(spec)
    return recovered
