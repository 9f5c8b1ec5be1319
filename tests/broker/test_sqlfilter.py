"""SQL92 filters (``broker_adapter.core.sqlfilter``): examples of RocketMQ's documented language, errors that name the
position, and hypothesis tests that parse generated expressions (random keyword case, spacing, parentheses) and
compare every result with a small reference interpreter of the same expression tree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.core.sqlfilter import MAX_DEPTH, MAX_LENGTH, FilterSyntaxError, compile_filter

PROPS = {"TAGS": "TagA", "a": "10", "b": "-2.5", "s": "it's", "flag": "TRUE", "empty": ""}


@pytest.mark.parametrize(
    "text, truth",
    [
        ("a = 10", True),
        ("a > 9 AND a < 11", True),
        ("a >= 10 and a <= 10", True),
        ("a <> 10", False),
        ("a != 11", True),
        ("a BETWEEN 1 AND 10", True),
        ("a not between 1 and 9", True),
        ("b < -2", True),
        ("b BETWEEN -3 AND -2.5", True),
        ("TAGS IN ('TagA', 'TagB')", True),
        ("TAGS NOT IN ('TagA')", False),
        ("TAGS = 'TagA'", True),
        ("s = 'it''s'", True),
        ("empty = ''", True),
        ("flag = TRUE", True),
        ("flag = false", False),
        ("a = '10'", True),  # a string literal compares strings: the property's text
        ("a = '10.0'", False),
        ("a = 10.0", True),  # a number literal compares numbers
        ("s > 1", False),  # not a number: not greater
        ("missing IS NULL", True),
        ("a IS NOT NULL", True),
        ("missing > 1", None),  # unknown: not selected
        ("NOT (missing > 1)", None),  # and neither is its negation
        ("missing = 'x' OR a = 10", True),
        ("missing = 'x' AND a = 11", False),
        ("missing = 'x' AND a = 10", None),
        ("missing IN ('x')", None),
        ("a = NULL", None),
        ("TRUE", True),
        ("NOT FALSE", True),
        ("(a = 10) AND ((TAGS = 'TagA') OR (b > 0))", True),
        ("a > 1e1", False),
    ],
)
def test_examples(text, truth):
    f = compile_filter(text)
    assert f.truth(PROPS) is truth
    assert f.matches(PROPS) is (truth is True)


@pytest.mark.parametrize(
    "text, position, words",
    [
        ("", 1, "empty"),
        ("a >", 4, "end of the expression"),
        ("a > 'x'", 5, "compares numbers"),
        ("'x' BETWEEN 1 AND 2", 1, "compares numbers"),
        ("a BETWEEN 1 OR 2", 13, "AND between the bounds"),
        ("a = 1 b", 7, "found 'b'"),
        ("(a = 1", 7, "')'"),
        ("a IN (1)", 7, "string literals"),
        ("a IN ('x' 'y')", 11, "',' or ')'"),
        ("a @ 1", 3, "unexpected character '@'"),
        ("a = 'x", 5, "not closed"),
        ("a NOT 5", 7, "BETWEEN or IN"),
        ("a IS 1", 6, "NULL"),
        ("a", 2, "expected a comparison"),
        ("a = 1 AND", 10, "end of the expression"),
        ("AND a = 1", 1, "found 'AND'"),
    ],
)
def test_a_bad_expression_names_its_position(text, position, words):
    with pytest.raises(FilterSyntaxError) as e:
        compile_filter(text)
    assert e.value.position == position
    assert words in str(e.value) and f"position {position}" in str(e.value)


def test_limits():
    with pytest.raises(FilterSyntaxError, match="nests deeper"):
        compile_filter("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    assert compile_filter("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH).matches({"a": "1"})
    with pytest.raises(FilterSyntaxError, match="longer than"):
        compile_filter("a = 1 OR " * (MAX_LENGTH // 9 + 1) + "a = 1")


# -- generated expressions against a reference interpreter ----------------------------------------------------
NAMES = ("a", "b", "TAGS", "x.y", "missing")
texts = st.sampled_from(["", "TagA", "TagB", "10", "-2.5", "1e3", "abc", "it's", " 7 ", "true"])
numbers = st.one_of(st.integers(-20, 20), st.sampled_from([0.5, -2.5, 10.0, 1000.0]))
properties = st.dictionaries(st.sampled_from(NAMES[:-1]), texts)


def number_of(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "infinity", "+inf", "-infinity"):
        return None
    return f


def ref(node, p):
    """The reference interpreter: three-valued (None = unknown), written from the rules in the module docstring."""
    kind = node[0]
    if kind == "and":
        vs = [ref(node[1], p), ref(node[2], p)]
        return False if False in vs else (None if None in vs else True)
    if kind == "or":
        vs = [ref(node[1], p), ref(node[2], p)]
        return True if True in vs else (None if None in vs else False)
    if kind == "not":
        v = ref(node[1], p)
        return None if v is None else not v
    if kind == "bool":
        return node[1]
    if kind == "null":
        return (p.get(node[1]) is not None) if node[2] else (p.get(node[1]) is None)
    v = p.get(node[1])
    if kind == "in":
        return None if v is None else ((v in node[2]) != node[3])
    if v is None:
        return None
    if kind == "cmp":
        op, lit = node[2], node[3]
        if op in ("=", "<>"):
            if isinstance(lit, str):
                eq = v == lit
            else:
                n = number_of(v)
                eq = n is not None and n == lit
            return eq if op == "=" else not eq
        n = number_of(v)
        if n is None:
            return False
        return {"<": n < lit, "<=": n <= lit, ">": n > lit, ">=": n >= lit}[op]
    if kind == "between":
        n = number_of(v)
        r = n is not None and node[2] <= n <= node[3]
        return r != node[4]
    raise AssertionError(node)


def quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def literal(v) -> str:
    return quote(v) if isinstance(v, str) else repr(v)


leaves = st.one_of(
    st.tuples(
        st.just("cmp"), st.sampled_from(NAMES), st.sampled_from(["=", "<>"]), st.one_of(texts, numbers)
    ),
    st.tuples(st.just("cmp"), st.sampled_from(NAMES), st.sampled_from(["<", "<=", ">", ">="]), numbers),
    st.tuples(st.just("between"), st.sampled_from(NAMES), numbers, numbers, st.booleans()),
    st.tuples(
        st.just("in"), st.sampled_from(NAMES), st.frozensets(texts, min_size=1, max_size=3), st.booleans()
    ),
    st.tuples(st.just("null"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("bool"), st.booleans()),
)
trees = st.recursive(
    leaves,
    lambda sub: st.one_of(
        st.tuples(st.just("and"), sub, sub),
        st.tuples(st.just("or"), sub, sub),
        st.tuples(st.just("not"), sub),
    ),
    max_leaves=12,
)


def render(node, draw) -> str:
    def kw(word: str) -> str:
        return draw(st.sampled_from([word, word.lower(), word.capitalize()]))

    sp = draw(st.sampled_from([" ", "  ", "\t", "\n "]))
    kind = node[0]
    if kind in ("and", "or"):
        return f"({render(node[1], draw)}){sp}{kw(kind.upper())}{sp}({render(node[2], draw)})"
    if kind == "not":
        return f"{kw('NOT')} ({render(node[1], draw)})"
    if kind == "bool":
        return kw("TRUE" if node[1] else "FALSE")
    if kind == "null":
        return f"{node[1]} {kw('IS')}{' ' + kw('NOT') if node[2] else ''} {kw('NULL')}"
    if kind == "in":
        items = ",".join(quote(s) for s in sorted(node[2]))
        return f"{node[1]}{' ' + kw('NOT') if node[3] else ''} {kw('IN')} ({items})"
    if kind == "cmp":
        return f"{node[1]}{sp}{node[2]}{sp}{literal(node[3])}"
    return f"{node[1]} {kw('NOT') + ' ' if node[4] else ''}{kw('BETWEEN')} {literal(node[2])} {kw('AND')} {literal(node[3])}"


@settings(max_examples=400, deadline=None)
@given(trees, st.lists(properties, min_size=1, max_size=4), st.data())
def test_generated_expressions_agree_with_the_reference(tree, props, data):
    text = render(tree, data.draw)
    f = compile_filter(text)
    for p in props:
        assert f.truth(p) is ref(tree, p), (text, p)
        assert f.matches(p) is (ref(tree, p) is True)
    # the negation of a known result is known and opposite; of an unknown one, unknown
    neg = compile_filter(f"NOT ({text})")
    for p in props:
        t = f.truth(p)
        assert neg.truth(p) is (None if t is None else not t)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab ='()<>!,.-1eINOTANDRSUL\t")), max_size=40))
def test_any_text_parses_or_names_a_position_inside_it(text):
    try:
        f = compile_filter(text)
    except FilterSyntaxError as e:
        assert 1 <= e.position <= len(text) + 1
        assert f"position {e.position}" in str(e)
    else:
        assert f.truth({"a": "1"}) in (True, False, None)
