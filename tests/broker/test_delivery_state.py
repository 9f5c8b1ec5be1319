"""The replicated delivery state (issue 16): group settings, the timer index, open transactions, FIFO pops and
dead letters, as the broker state machine applies them. Pure units over real ConsumeQueue files; hypothesis
properties check that the state is replay-deterministic (the same entries in any batching give the same
snapshot), that a snapshot restored anywhere continues to the same state, and the delivery rules the state
itself enforces: never two messages of one FIFO message group in flight, per-group order, and never a delivery
past the group's attempts."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.core import commands, groups, message, topics
from broker_adapter.core.invisibility import PopStates
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.core.timer import RECALLED_WINDOW, TimerIndex, Waiting
from broker_adapter.core.topics import HALF_TOPIC, TIMER_TOPIC
from broker_adapter.core.transactions import COMMIT, MAX_CHECKS, ROLLBACK, HalfMessages
from statemachine.api import CommittedEntry

T, G = "t", "g"
HEADER = 48


class Log:
    """Committed entries as the leader would write them: messages with dense queue offsets and their place."""

    def __init__(self) -> None:
        self.entries: list[CommittedEntry] = []
        self.pos = 0
        self.next: dict[tuple[str, int], int] = {}

    def add(self, body: bytes) -> None:
        self.entries.append(CommittedEntry(len(self.entries), 1, self.pos, body))
        self.pos += HEADER + len(body)

    def command(self, cmd) -> None:
        self.add(commands.encode(cmd))

    def message(
        self, topic: str, qid: int = 0, props: dict[str, str] | None = None, body: bytes = b"x"
    ) -> int:
        q = self.next.get((topic, qid), 0)
        self.next[(topic, qid)] = q + 1
        raw = bytearray(
            message.encode(
                message.Message(
                    topic=topic, body=body, queue_id=qid, store_timestamp=1000, properties=props or {}
                )
            )
        )
        message.patch_placement(raw, q, self.pos + HEADER)
        self.add(bytes(raw))
        return q


def snapshot(sm: BrokerStateMachine) -> bytes:
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    return buf.getvalue()


def state_of(sm: BrokerStateMachine) -> tuple:
    """The delivery state as the node holds it in memory (not through ``save_snapshot``, which is under test)."""
    return (
        sorted(sm.timer.entries.items()),
        list(sm.timer.recalled.items()),
        sorted(sm.halves.open.items()),
        list(sm.halves.ended.items()),
        sorted((g, st) for g, st in sm.groups.items()),
        sm.pops.to_json(),
        sorted(sm.offsets.items()),
        sm.repeats,
    )


def test_timer_entries_open_on_dispatch_and_end_with_their_copy(tmp_path):
    log = Log()
    log.command(commands.CreateTopic(T, 2))
    props = {
        message.PROPERTY_TIMER_DELIVER_MS: "5000",
        message.PROPERTY_REAL_TOPIC: T,
        message.PROPERTY_REAL_QUEUE_ID: "1",
    }
    t0 = log.message(TIMER_TOPIC, 0, props)
    t1 = log.message(TIMER_TOPIC, 0, {**props, message.PROPERTY_TIMER_DELIVER_MS: "3000"})
    sm = BrokerStateMachine(tmp_path / "cq")
    sm.apply(log.entries)
    assert [w.offset for w in sm.timer.due(4000, 10)] == [t1]
    assert [w.offset for w in sm.timer.due(6000, 10)] == [t1, t0]
    assert sm.timer.entries[t0] == Waiting(t0, 5000, T, 1)
    n = len(log.entries)
    log.message(T, 1, {message.PROPERTY_ORIGIN: f"timer/{t1}"})  # the leader's copy
    log.message(T, 1, {message.PROPERTY_ORIGIN: f"timer/{t1}"})  # a second copy: counted, changes nothing
    log.command(commands.Settle("timer", t0, "unreadable"))
    sm.apply(log.entries[n:])
    assert len(sm.timer) == 0 and sm.repeats == 1
    assert sm.next_offset(T, 1) == 2


def test_a_recall_ends_a_waiting_timer_message_once_and_is_remembered(tmp_path):
    log = Log()
    log.command(commands.CreateTopic(T, 1))
    props = {message.PROPERTY_TIMER_DELIVER_MS: "5000", message.PROPERTY_REAL_TOPIC: T}
    t = [log.message(TIMER_TOPIC, 0, {**props, message.PROPERTY_UNIQ_KEY: f"id{i}"}) for i in range(3)]
    log.command(commands.Recall(t[0], "id0"))
    log.command(commands.Recall(t[0], "id0"))  # a retry: changes nothing
    log.message(T, 0, {message.PROPERTY_ORIGIN: f"timer/{t[1]}"})  # delivered
    log.command(commands.Recall(t[1], "id1"))  # too late: nothing to end
    sm = BrokerStateMachine(tmp_path / "cq")
    results = sm.apply(log.entries)
    assert [type(r).__name__ for r in results[-4:]] == ["Waiting", "NoneType", "Dispatched", "NoneType"]
    assert [w.offset for w in sm.timer.due(10_000, 10)] == [t[2]]
    assert dict(sm.timer.recalled) == {t[0]: "id0"}
    n = len(log.entries)
    log.message(T, 0, {message.PROPERTY_ORIGIN: f"timer/{t[0]}"})  # a copy of a recalled message: a repeat
    sm.apply(log.entries[n:])
    assert sm.repeats == 1
    again = BrokerStateMachine(tmp_path / "cq2")
    again.load_snapshot(io.BytesIO(snapshot(sm)))
    assert state_of(again) == state_of(sm)


def test_the_recalled_window_is_bounded_and_an_old_timer_snapshot_loads():
    t = TimerIndex.from_json([[3, 10, T, 0], [1, 5, T, 1]])  # a snapshot from before recalls: waiting rows
    assert sorted(t.entries) == [1, 3] and not t.recalled
    for i in range(RECALLED_WINDOW + 2):
        t.add(Waiting(10 + i, 99, T, 0))
        t.recall(10 + i, f"m{i}")
    assert len(t.recalled) == RECALLED_WINDOW and next(iter(t.recalled)) == 12  # the oldest went first
    assert TimerIndex.from_json(t.to_json()).to_json() == t.to_json()
    assert t.recall(10, "m0") is None  # forgotten and not waiting: nothing to end


def test_half_messages_commit_rollback_and_check_limit(tmp_path):
    log = Log()
    log.command(commands.CreateTopic(T, 1))
    props = {message.PROPERTY_REAL_TOPIC: T, message.PROPERTY_TRANSACTION_PREPARED: "true"}
    h = [log.message(HALF_TOPIC, 0, {**props, message.PROPERTY_UNIQ_KEY: f"id{i}"}) for i in range(3)]
    sm = BrokerStateMachine(tmp_path / "cq", tx_immunity_ms=500)
    sm.apply(log.entries)
    assert [x.offset for x in sm.halves.to_check(1499, 10)] == []
    assert [x.offset for x in sm.halves.to_check(1500, 10)] == h  # stored at 1000, immune for 500 ms
    n = len(log.entries)
    log.message(T, 0, {message.PROPERTY_ORIGIN: f"half/{h[0]}"})
    log.command(commands.Settle("half", h[1], "rollback"))
    for k in range(MAX_CHECKS + 1):
        log.command(commands.TxCheck(h[2], 2000 + k))
    sm.apply(log.entries[n:])
    assert sm.halves.open == {}
    assert dict(sm.halves.ended) == {"id0": COMMIT, "id1": ROLLBACK, "id2": ROLLBACK}  # by transaction id
    assert sm.halves.by_id == {}


def test_transaction_ids_are_message_ids_and_a_duplicate_ends_newest_first(tmp_path):
    log = Log()
    log.command(commands.CreateTopic(T, 1))
    props = {message.PROPERTY_REAL_TOPIC: T, message.PROPERTY_TRANSACTION_PREPARED: "true"}
    a = log.message(HALF_TOPIC, 0, {**props, message.PROPERTY_UNIQ_KEY: "A"})
    b1 = log.message(HALF_TOPIC, 0, {**props, message.PROPERTY_UNIQ_KEY: "B"})
    b2 = log.message(HALF_TOPIC, 0, {**props, message.PROPERTY_UNIQ_KEY: "B"})  # a retried send stored twice
    anonymous = log.message(HALF_TOPIC, 0, props)  # no message id: its offset's digits
    sm = BrokerStateMachine(tmp_path / "cq")
    sm.apply(log.entries)
    assert sm.halves.by_id == {"A": [a], "B": [b1, b2], str(anonymous): [anonymous]}
    assert sm.halves.find("A").offset == a and sm.halves.find("nope") is None
    assert sm.halves.find("B").offset == b2  # the newer first; the older is checked back like any orphan
    n = len(log.entries)
    log.message(T, 0, {message.PROPERTY_ORIGIN: f"half/{b2}"})
    sm.apply(log.entries[n:])
    assert sm.halves.find("B").offset == b1 and sm.halves.ended["B"] == COMMIT
    n = len(log.entries)
    log.command(commands.Settle("half", b1, "rollback"))
    log.command(commands.Settle("half", a, "rollback"))
    sm.apply(log.entries[n:])
    assert sm.halves.find("B") is None and list(sm.halves.ended.items()) == [("B", ROLLBACK), ("A", ROLLBACK)]
    # The index is derived: a snapshot holds only the open entries, and restores the same index.
    again = BrokerStateMachine(tmp_path / "cq2")
    again.load_snapshot(io.BytesIO(snapshot(sm)))
    assert again.halves.by_id == sm.halves.by_id == {str(anonymous): [anonymous]}
    assert again.halves.ended == sm.halves.ended


def test_an_old_snapshot_of_half_messages_loads_with_its_index():
    """Before transaction ids were message ids, ``ended`` was keyed by half offset; such a snapshot loads, its
    offsets as the digits a producer of that time holds as its transaction id."""
    old = {
        "open": [[7, 1000, T, 0, "", "M7", 1, 7000], [3, 900, T, 0, "", "M3", 0, 6900]],
        "ended": [[1, COMMIT]],
    }
    h = HalfMessages.from_json(old)
    assert h.by_id == {"M3": [3], "M7": [7]} and h.ended == {"1": COMMIT}
    assert h.find("M7").checks == 1
    assert HalfMessages.from_json(h.to_json()).to_json() == h.to_json()


def test_fifo_group_holds_one_message_per_message_group_and_waits(tmp_path):
    s = PopStates()
    mg = {0: "a", 1: "a", 2: "b", 3: "a"}
    pop = commands.Pop(G, T, 0, 0, 1000, (0, 1, 2, 3), (), tuple(mg.items()))
    got = s.pop(pop, 0, 4, fifo=True)
    assert [d.offset for d in got.deliveries] == [0, 2]  # 1 and 3 wait behind 0
    q = s.get((G, T, 0))
    assert q.deliverable(500, 4, 10) == []  # both heads invisible
    assert q.deliverable(1000, 4, 10) == [0, 2]  # expired heads only: 1 and 3 still wait
    s.ack(commands.Ack(G, T, 0, 0, got.deliveries[0].epoch))
    assert q.deliverable(10, 4, 10) == [1]
    again = s.pop(commands.Pop(G, T, 0, 10, 1000, (1, 3), (), ((1, "a"), (3, "a"))), 0, 4, fifo=True)
    assert [d.offset for d in again.deliveries] == [1]


def test_a_pop_never_grants_past_the_attempts_and_dead_ends_the_delivery():
    s = PopStates()
    p = s.pop(commands.Pop(G, T, 0, 0, 10, (0,)), 0, 1, max_attempts=2)
    p = s.pop(commands.Pop(G, T, 0, 10, 10, (0,)), 0, 1, max_attempts=2)
    assert p.deliveries[0].attempt == 2
    assert s.pop(commands.Pop(G, T, 0, 20, 10, (0,)), 0, 1, max_attempts=2).deliveries == ()
    q = s.get((G, T, 0))
    assert [o for o, _ in q.exhausted(20, 2)] == [0]
    assert not s.dead(G, T, 0, 0, 1)  # an old delivery's copy ends nothing
    assert s.dead(G, T, 0, 0, p.deliveries[0].epoch)
    assert (q.low, q.inflight) == (1, {})


def test_dead_letter_copy_moves_the_groups_offset(tmp_path):
    log = Log()
    log.command(commands.CreateTopic(T, 1))
    log.command(commands.GroupSettingsCmd(G, groups.GroupSettings(max_attempts=1).to_json()))
    log.message(T)
    log.command(commands.Pop(G, T, 0, 0, 10, (0,)))
    sm = BrokerStateMachine(tmp_path / "cq")
    sm.apply(log.entries)
    assert sm.group_settings(G).max_attempts == 1
    n = len(log.entries)
    log.message(topics.dlq_topic(G), 0, {message.PROPERTY_ORIGIN: f"dlq/0/0/1/{T}"})
    sm.apply(log.entries[n:])
    assert sm.committed_offset(G, T, 0) == 1 and sm.repeats == 0


def test_group_settings_are_checked_and_backoff_follows_rocketmq():
    d = groups.GroupSettings()
    assert (d.fifo, d.max_attempts) == (False, 17)
    assert [d.backoff_ms(a) for a in (1, 2, 3)] == [10_000, 30_000, 60_000]
    assert d.backoff_ms(100) == 7_200_000
    e = groups.GroupSettings(backoff=groups.EXPONENTIAL, initial_ms=100, max_ms=1000, multiplier=3)
    assert [e.backoff_ms(a) for a in (1, 2, 3, 4)] == [100, 300, 900, 1000]
    with pytest.raises(groups.GroupSettingsError):
        groups.GroupSettings.from_json({"max_attempts": 0})
    with pytest.raises(groups.GroupSettingsError):
        groups.GroupSettings.from_json({"backoff": "linear"})
    assert groups.GroupSettings.from_json(e.to_json()) == e


def test_timer_and_half_indexes_round_trip():
    t = TimerIndex()
    t.add(Waiting(3, 10, T, 0))
    t.add(Waiting(1, 5, T, 1))
    assert TimerIndex.from_json(t.to_json()).to_json() == t.to_json()
    h = HalfMessages.from_json({"open": [[0, 1, T, 0, "pg", "id", 2, 9]], "ended": [[5, COMMIT]]})
    assert HalfMessages.from_json(h.to_json()).to_json() == h.to_json()


# -- properties ------------------------------------------------------------------------------------------------
MGROUPS = ("a", "b", "c")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(MGROUPS), st.just(0)),
        st.tuples(st.just("send"), st.sampled_from(MGROUPS), st.just(0)),
        st.tuples(st.just("timer"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("half"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("pop"), st.integers(1, 4), st.integers(1, 30)),
        st.tuples(st.just("pop"), st.integers(1, 4), st.just(30)),
        st.tuples(st.just("ack"), st.integers(0, 15), st.integers(0, 40)),
        st.tuples(st.just("nack"), st.integers(0, 15), st.integers(0, 40)),
        st.tuples(st.just("release"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("recall"), st.integers(0, 10), st.booleans()),
        st.tuples(st.just("commit"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("check"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("dead"), st.integers(0, 15), st.integers(0, 40)),
        st.tuples(st.just("settings"), st.booleans(), st.integers(1, 4)),
    ),
    max_size=50,
)


def build(seq) -> Log:
    """A log from generated steps; pops name what a leader would (computed from a shadow state machine)."""
    log = Log()
    log.command(commands.CreateTopic(T, 1))
    log.command(commands.GroupSettingsCmd(G, groups.GroupSettings(fifo=True, max_attempts=3).to_json()))
    clock = 0
    timers = halves = 0
    mgroup_of: dict[int, str] = {}  # queue offset -> message group, as the leader reads it off the message
    for op, a, b in seq:
        clock += 7
        if op == "send":
            mgroup_of[log.message(T, 0, {message.PROPERTY_MESSAGE_GROUP: a})] = a
        elif op == "timer":
            log.message(
                TIMER_TOPIC,
                0,
                {
                    message.PROPERTY_TIMER_DELIVER_MS: str(clock + a),
                    message.PROPERTY_REAL_TOPIC: T,
                    message.PROPERTY_REAL_QUEUE_ID: "0",
                },
            )
            timers += 1
        elif op == "half":  # message ids repeat now and then (a retried send stored twice); some have none
            props = {message.PROPERTY_REAL_TOPIC: T}
            if a:
                props[message.PROPERTY_UNIQ_KEY] = f"m{a}"
            log.message(HALF_TOPIC, 0, props)
            halves += 1
        elif op == "pop":
            end = log.next.get((T, 0), 0)
            offsets = tuple(range(max(0, end - b), end))
            mg = tuple((o, mgroup_of.get(o, "a")) for o in offsets)
            log.command(commands.Pop(G, T, 0, clock, a * 5, offsets, (), mg))
        elif op == "ack":
            log.command(commands.Ack(G, T, 0, a, b))
        elif op == "nack":
            log.command(commands.ChangeInvisible(G, T, 0, a, b, clock, 3))
        elif op == "release" and timers:
            log.message(T, 0, {message.PROPERTY_ORIGIN: f"timer/{a % timers}"})
        elif op == "recall" and timers:  # b: a handle naming another message id (the state does not check it)
            log.command(commands.Recall(a % timers, f"t{a % timers}" if b else "other"))
        elif op == "commit" and halves:
            if b:
                log.message(T, 0, {message.PROPERTY_ORIGIN: f"half/{a % halves}"})
            else:
                log.command(commands.Settle("half", a % halves, "rollback"))
        elif op == "check" and halves:
            log.command(commands.TxCheck(a % halves, clock))
        elif op == "dead":
            log.message(topics.dlq_topic(G), 0, {message.PROPERTY_ORIGIN: f"dlq/0/{a}/{b}/{T}"})
        elif op == "settings":
            log.command(commands.GroupSettingsCmd(G, groups.GroupSettings(fifo=a, max_attempts=b).to_json()))
    return log


@settings(max_examples=60, deadline=None)
@given(steps, st.data())
def test_replay_in_any_batching_and_from_a_snapshot_gives_the_same_state(tmp_path_factory, seq, data):
    log = build(seq)
    n = len(log.entries)
    whole = BrokerStateMachine(tmp_path_factory.mktemp("a"))
    results = whole.apply(log.entries)
    # The same entries in other batches: the same state.
    cut = data.draw(st.integers(0, n), label="cut")
    split = BrokerStateMachine(tmp_path_factory.mktemp("b"))
    split.apply(log.entries[:cut])
    # A node restarting from a snapshot taken at the cut continues to the same state.
    restored = BrokerStateMachine(tmp_path_factory.mktemp("c"))
    restored.load_snapshot(io.BytesIO(snapshot(split)))
    assert snapshot(restored) == snapshot(split)
    assert state_of(restored) == state_of(split)
    split.apply(log.entries[cut:])
    restored.apply(log.entries[cut:])
    assert snapshot(split) == snapshot(whole) == snapshot(restored)
    assert state_of(split) == state_of(whole) == state_of(restored)
    # Rules the state enforces whatever the leader proposed.
    granted_at: dict[int, int] = {}
    for e, r in zip(log.entries, results, strict=True):
        if commands.is_command(e.body) and isinstance(commands.decode(e.body), commands.Pop):
            for d in r.deliveries:
                assert d.attempt >= 1
                granted_at[d.offset] = d.attempt
    q = whole.pops.get((G, T, 0))
    if q is not None:
        fifo_groups = [f.mgroup for f in q.inflight.values() if f.mgroup and f.attempt > 0]
        # a message group has at most one delivered, unacknowledged message (the others wait)
        assert len(fifo_groups) == len(set(fifo_groups))
        for o, f in q.inflight.items():
            if f.mgroup and f.attempt > 0:
                assert all(p > o or g.mgroup != f.mgroup for p, g in q.inflight.items() if p != o), (
                    "a later message of a message group was delivered before an earlier one was done"
                )
    for w in whole.timer.entries.values():
        assert w.topic == T
    assert not set(whole.timer.entries) & set(whole.timer.recalled), "a recalled message still waits"
    assert all(h.checks <= MAX_CHECKS for h in whole.halves.open.values())
    # the index by transaction id is the open entries', oldest first, whatever the history
    derived: dict[str, list[int]] = {}
    for off, h in sorted(whole.halves.open.items()):
        derived.setdefault(h.transaction_id, []).append(off)
    assert whole.halves.by_id == derived == restored.halves.by_id


names = st.from_regex(r"[a-zA-Z0-9_%-]{1,20}", fullmatch=True)
delivery_commands = st.one_of(
    st.builds(
        commands.Pop,
        names,
        names,
        st.integers(0, 7),
        st.integers(0, 2**40),
        st.integers(0, 2**31),
        st.lists(st.integers(0, 2**40), max_size=5).map(tuple),
        st.lists(st.integers(0, 2**40), max_size=5).map(tuple),
        st.lists(st.tuples(st.integers(0, 2**40), st.text(max_size=10)), max_size=5).map(tuple),
    ),
    st.builds(
        commands.GroupSettingsCmd,
        names,
        st.builds(groups.GroupSettings, st.booleans(), st.integers(1, 100)).map(lambda g: g.to_json()),
    ),
    st.builds(
        commands.Settle, st.sampled_from(commands.SETTLE_KINDS), st.integers(0, 2**40), st.text(max_size=20)
    ),
    st.builds(commands.TxCheck, st.integers(0, 2**40), st.integers(0, 2**45)),
    st.builds(commands.Recall, st.integers(0, 2**40), st.text(min_size=1, max_size=40)),
)


@given(delivery_commands)
def test_delivery_commands_round_trip(cmd):
    assert commands.decode(commands.encode(cmd)) == cmd


def test_malformed_delivery_commands_are_refused():
    with pytest.raises(commands.CommandError):
        commands.encode(commands.Settle("other", 1, "x"))
    with pytest.raises(commands.CommandError):
        commands.encode(commands.TxCheck(-1, 0))
    with pytest.raises(commands.CommandError):
        commands.encode(commands.Recall(1, ""))
    body = commands.encode(commands.TxCheck(1, 2)).replace(b'"offset"', b'"offzet"')
    with pytest.raises(commands.CommandError):
        commands.decode(body)


fifo_steps = st.lists(
    st.one_of(
        st.tuples(st.just("pop"), st.integers(1, 6)),
        st.tuples(st.just("ack"), st.integers(0, 30)),
        st.tuples(st.just("nack"), st.integers(0, 30)),
        st.tuples(st.just("wait"), st.integers(1, 40)),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30), fifo_steps)
def test_a_fifo_group_sees_each_message_group_in_order_one_at_a_time(mgroups, seq):
    """A leader that pops what ``deliverable`` offers (or every offset), a consumer that acks, nacks or lets
    invisible times run out: each message group's messages are first delivered in offset order, a message is only delivered when all
    earlier ones of its group were acknowledged, and never two of a group are out at once."""
    s = PopStates()
    end = len(mgroups)
    now = 0
    held: dict[int, int] = {}  # offset -> epoch of deliveries the consumer holds
    acked: set[int] = set()
    for op, a in seq:
        now += 1
        q = s.view((G, T, 0), 0)
        if op == "pop":
            # a = 6: a stale or careless leader names every offset; the state machine must still hold the rules
            offsets = list(range(end)) if a == 6 else q.deliverable(now, end, a, max_attempts=5)
            groups_of = tuple((o, mgroups[o]) for o in offsets)
            got = s.pop(commands.Pop(G, T, 0, now, 10, tuple(offsets), (), groups_of), 0, end, True, 5)
            for d in got.deliveries:
                mg = mgroups[d.offset]
                earlier = [o for o in range(d.offset) if mgroups[o] == mg]
                assert all(o in acked for o in earlier), (
                    f"{d.offset} of {mg} delivered before {earlier} were acked"
                )
                assert d.attempt <= 5
                held[d.offset] = d.epoch
        elif op in ("ack", "nack") and held:
            o = sorted(held)[a % len(held)]
            if op == "ack":
                if s.ack(commands.Ack(G, T, 0, o, held.pop(o))).outcome.value == "done":
                    acked.add(o)
            else:
                h = s.change_invisible(commands.ChangeInvisible(G, T, 0, o, held.pop(o), now, 3))
                if h.epoch > 0:
                    held[o] = h.epoch
        elif op == "wait":
            now += a
        q = s.get((G, T, 0))
        if q is not None:
            out = [f.mgroup for f in q.inflight.values() if f.attempt > 0 and f.deadline_ms > now]
            assert len(out) == len(set(out)), f"two messages of one group invisible at once: {out}"
