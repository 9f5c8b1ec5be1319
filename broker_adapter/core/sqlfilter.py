"""SQL92 message filters over user properties and TAGS, as RocketMQ's consumers subscribe with
``FilterExpression(..., FilterType.SQL)`` (docs/broker.md, "SQL92 filters").

A pure module: ``compile_filter(text)`` tokenizes and parses once and returns a ``SqlFilter`` whose ``matches``
takes a message's properties (the message's TAGS is the property ``TAGS``, as RocketMQ stores it). A bad
expression raises ``FilterSyntaxError`` naming the 1-based character position, which the faces answer as
INVALID_ARGUMENT (ours) or ILLEGAL_FILTER_EXPRESSION (RocketMQ's).

The language is RocketMQ's documented subset:

- comparisons ``=  <>  <  <=  >  >=``, ``[NOT] BETWEEN x AND y``, ``[NOT] IN ('a', 'b')``, ``IS [NOT] NULL``;
- ``AND``, ``OR``, ``NOT`` and parentheses; keywords are case-insensitive, property names are not;
- string literals in single quotes (``''`` is a quote), numbers (integers, decimals, exponents, a leading minus),
  ``TRUE``, ``FALSE``, ``NULL``.

Values: property values are strings. ``< <= > >= BETWEEN`` compare numbers: a string literal there is a syntax
error, and a property whose value is not a number does not satisfy them. ``=`` and ``<>`` compare numerically when
one side is a number literal, as booleans when one side is TRUE/FALSE, else as strings; values of different kinds
are not equal. ``IN`` lists string literals.

Missing properties follow SQL's three-valued logic, as RocketMQ does: a comparison, BETWEEN or IN with a property
the message does not have is *unknown*, ``NOT unknown`` is unknown, ``unknown AND false`` is false,
``unknown OR true`` is true, and a message is selected only when the whole expression is true. So ``a > 1`` and
``NOT (a > 1)`` both skip a message without ``a``; ``a IS NULL`` selects it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

MAX_LENGTH: Final = 4096  # characters of an expression (RocketMQ keeps filters in its subscription data)
MAX_DEPTH: Final = 64  # nesting of parentheses and NOTs: the parser recurses

Value = str | int | float | bool | None
Truth = bool | None  # None: unknown (a missing property)
Eval = Callable[[Mapping[str, str]], Truth]
Operand = Callable[[Mapping[str, str]], Value]


class FilterSyntaxError(ValueError):
    """A filter expression that does not parse; ``position`` is 1-based (the character the parser stopped at)."""

    def __init__(self, expression: str, position: int, why: str):
        self.expression = expression
        self.position = position
        self.why = why
        super().__init__(f"illegal SQL92 filter expression {expression!r} at position {position}: {why}")


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A compiled expression: ``matches(properties)`` is True when the expression is true for them."""

    text: str
    _eval: Eval

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self._eval(properties) is True

    def truth(self, properties: Mapping[str, str]) -> Truth:
        """The three-valued result: True, False, or None (unknown)."""
        return self._eval(properties)


# -- tokens -------------------------------------------------------------------------------------------------
KEYWORDS: Final = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_TOKEN: Final = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_$.]*)
  | (?P<op><>|<=|>=|!=|=|<|>|\(|\)|,|-)
    """,
    re.VERBOSE,
)
_NUMERIC: Final = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # number, string, ident, keyword, op, end
    text: str
    value: Value
    pos: int  # 0-based


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            c = text[i]
            why = "a string literal is not closed" if c == "'" else f"unexpected character {c!r}"
            raise FilterSyntaxError(text, i + 1, why)
        kind = m.lastgroup or ""
        s = m.group()
        if kind == "number":
            value: Value = float(s) if any(c in s for c in ".eE") else int(s)
            if isinstance(value, float) and not math.isfinite(value):
                raise FilterSyntaxError(text, i + 1, f"number {s} is out of range")
            out.append(Token("number", s, value, i))
        elif kind == "string":
            out.append(Token("string", s, s[1:-1].replace("''", "'"), i))
        elif kind == "ident":
            up = s.upper()
            if up in KEYWORDS:
                out.append(Token("keyword", up, None, i))
            else:
                out.append(Token("ident", s, s, i))
        elif kind == "op":
            out.append(Token("op", "<>" if s == "!=" else s, None, i))
        i = m.end()
    out.append(Token("end", "", None, len(text)))
    return out


# -- values -------------------------------------------------------------------------------------------------
def as_number(v: Value) -> int | float | None:
    """A property's value as a number, or None when it is not one."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return v
    if not _NUMERIC.fullmatch(v):
        return None
    s = v.strip()
    try:
        return int(s)
    except ValueError:
        f = float(s)
        return f if math.isfinite(f) else None


def as_bool(v: Value) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def equal(a: Value, b: Value) -> Truth:
    """``a = b``: unknown with a missing side; numbers, booleans or strings by what the literals are."""
    if a is None or b is None:
        return None
    x: bool | float | None
    y: bool | float | None
    if isinstance(a, bool) or isinstance(b, bool):
        x, y = as_bool(a), as_bool(b)
    elif isinstance(a, int | float) or isinstance(b, int | float):
        x, y = as_number(a), as_number(b)
    else:
        return a == b
    return x is not None and y is not None and x == y


def ordered(op: str, a: Value, b: Value) -> Truth:
    if a is None or b is None:
        return None
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return False
    if op == "<":
        return x < y
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    return x >= y


def t_not(a: Truth) -> Truth:
    return None if a is None else not a


def t_and(a: Truth, b: Truth) -> Truth:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def t_or(a: Truth, b: Truth) -> Truth:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


# -- parser -------------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def fail(self, why: str, tok: Token | None = None) -> FilterSyntaxError:
        t = tok or self.tok
        return FilterSyntaxError(self.text, t.pos + 1, why)

    def found(self, tok: Token | None = None) -> str:
        t = tok or self.tok
        return "the end of the expression" if t.kind == "end" else repr(t.text)

    def take(self) -> Token:
        t = self.tok
        self.i += 1
        return t

    def at(self, kind: str, text: str) -> bool:
        return self.tok.kind == kind and self.tok.text == text

    def expect(self, kind: str, text: str, what: str) -> Token:
        if not self.at(kind, text):
            raise self.fail(f"expected {what}, found {self.found()}")
        return self.take()

    def parse(self) -> Eval:
        if self.tok.kind == "end":
            raise self.fail("the expression is empty")
        e = self.disjunction()
        if self.tok.kind != "end":
            raise self.fail(f"expected AND, OR or the end of the expression, found {self.found()}")
        return e

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"the expression nests deeper than {MAX_DEPTH} levels")

    def disjunction(self) -> Eval:
        e = self.conjunction()
        while self.at("keyword", "OR"):
            self.take()
            e = _or(e, self.conjunction())
        return e

    def conjunction(self) -> Eval:
        e = self.negation()
        while self.at("keyword", "AND"):
            self.take()
            e = _and(e, self.negation())
        return e

    def negation(self) -> Eval:
        if self.at("keyword", "NOT"):
            self.take()
            self.nested()
            inner = self.negation()
            self.depth -= 1
            return lambda p: t_not(inner(p))
        return self.predicate()

    def predicate(self) -> Eval:
        if self.at("op", "("):
            self.take()
            self.nested()
            e = self.disjunction()
            self.depth -= 1
            self.expect("op", ")", "')'")
            return e
        start = self.tok
        left, left_kind = self.operand()
        t = self.tok
        if t.kind == "op" and t.text in ("=", "<>", "<", "<=", ">", ">="):
            self.take()
            right, right_kind = self.operand()
            if t.text in ("=", "<>"):
                return _eq(left, right, t.text == "<>")
            self.numeric(left_kind, start, t.text)
            self.numeric(right_kind, self.tokens[self.i - 1], t.text)
            return _cmp(t.text, left, right)
        negate = False
        if self.at("keyword", "NOT"):
            self.take()
            negate = True
            if not (self.at("keyword", "BETWEEN") or self.at("keyword", "IN")):
                raise self.fail(f"expected BETWEEN or IN after NOT, found {self.found()}")
        if self.at("keyword", "BETWEEN"):
            self.take()
            self.numeric(left_kind, start, "BETWEEN")
            lo_tok = self.tok
            lo, lo_kind = self.operand()
            self.numeric(lo_kind, lo_tok, "BETWEEN")
            self.expect("keyword", "AND", "AND between the bounds of BETWEEN")
            hi_tok = self.tok
            hi, hi_kind = self.operand()
            self.numeric(hi_kind, hi_tok, "BETWEEN")
            return _between(left, lo, hi, negate)
        if self.at("keyword", "IN"):
            self.take()
            self.expect("op", "(", "'(' after IN")
            values: list[str] = []
            while True:
                v = self.tok
                if v.kind != "string":
                    raise self.fail(f"IN lists string literals ('a', 'b'), found {self.found()}")
                values.append(str(self.take().value))
                if self.at("op", ","):
                    self.take()
                    continue
                self.expect("op", ")", "',' or ')' in the IN list")
                break
            return _in(left, frozenset(values), negate)
        if self.at("keyword", "IS"):
            self.take()
            is_not = False
            if self.at("keyword", "NOT"):
                self.take()
                is_not = True
            self.expect("keyword", "NULL", "NULL after IS" + (" NOT" if is_not else ""))
            return _is_null(left, is_not)
        if left_kind == "bool" and start.kind == "keyword":
            return lambda p: as_bool(left(p))  # TRUE / FALSE alone (a bool literal: as_bool keeps it)
        raise self.fail(
            f"expected a comparison (=, <>, <, <=, >, >=, BETWEEN, IN, IS NULL) after {self.found(start)}, "
            f"found {self.found()}"
        )

    def numeric(self, kind: str, tok: Token, op: str) -> None:
        if kind not in ("number", "property"):
            raise self.fail(
                f"{op} compares numbers, but {self.found(tok)} is not a number or a property", tok
            )

    def operand(self) -> tuple[Operand, str]:
        t = self.tok
        if t.kind == "ident":
            self.take()
            name = t.text
            return (lambda p: p.get(name)), "property"
        if t.kind == "string":
            self.take()
            s = t.value
            return (lambda p: s), "string"
        if t.kind == "number":
            self.take()
            n = t.value
            return (lambda p: n), "number"
        if self.at("op", "-") and self.tokens[self.i + 1].kind == "number":
            self.take()
            n = -self.take().value  # type: ignore[operator]
            return (lambda p: n), "number"
        if t.kind == "keyword" and t.text in ("TRUE", "FALSE"):
            self.take()
            b = t.text == "TRUE"
            return (lambda p: b), "bool"
        if t.kind == "keyword" and t.text == "NULL":
            self.take()
            return (lambda p: None), "null"
        if t.kind == "end":
            raise self.fail("expected a property, a literal or '(', found the end of the expression")
        raise self.fail(f"expected a property, a literal or '(', found {self.found()}")


def _or(a: Eval, b: Eval) -> Eval:
    return lambda p: t_or(a(p), b(p))


def _and(a: Eval, b: Eval) -> Eval:
    return lambda p: t_and(a(p), b(p))


def _eq(a: Operand, b: Operand, negate: bool) -> Eval:
    if negate:
        return lambda p: t_not(equal(a(p), b(p)))
    return lambda p: equal(a(p), b(p))


def _cmp(op: str, a: Operand, b: Operand) -> Eval:
    return lambda p: ordered(op, a(p), b(p))


def _between(x: Operand, lo: Operand, hi: Operand, negate: bool) -> Eval:
    def between(p: Mapping[str, str]) -> Truth:
        v = x(p)
        r = t_and(ordered(">=", v, lo(p)), ordered("<=", v, hi(p)))
        return t_not(r) if negate else r

    return between


def _in(x: Operand, values: frozenset[str], negate: bool) -> Eval:
    def member(p: Mapping[str, str]) -> Truth:
        v = x(p)
        if v is None:
            return None
        r = isinstance(v, str) and v in values
        return not r if negate else r

    return member


def _is_null(x: Operand, negate: bool) -> Eval:
    if negate:
        return lambda p: x(p) is not None
    return lambda p: x(p) is None


def compile_filter(text: str) -> SqlFilter:
    """Parse ``text`` once; ``FilterSyntaxError`` (with the position) when it is not a valid expression."""
    if len(text) > MAX_LENGTH:
        raise FilterSyntaxError(text[:64] + "...", MAX_LENGTH + 1, f"longer than {MAX_LENGTH} characters")
    return SqlFilter(text, _Parser(text).parse())
