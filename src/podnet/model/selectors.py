"""Label selectors and field selectors, as list/watch and NetworkPolicy use them.

Pure: parsing and matching only. The string syntax is Kubernetes':

- labels: ``a=b,c==d,e!=f,g in (x,y),h notin (z),i,!j`` (also ``k>1``, ``k<9``);
  ``!=`` and ``notin`` also match objects that lack the key.
- fields: ``metadata.name=x,spec.nodeName!=y``; ``\\,``, ``\\=`` and ``\\\\`` escape.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podnet.model.schemas_names import label_value_problem, qualified_name_problem

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
_SET_OPS = {"in": IN, "notin": NOT_IN}


@dataclass(frozen=True)
class Requirement:
    """One condition on one label key."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` meet this condition."""
        value = labels.get(self.key)
        if self.operator == IN:
            return value is not None and value in self.values
        if self.operator == NOT_IN:
            return value is None or value not in self.values
        if self.operator == EXISTS:
            return value is not None
        if self.operator == DOES_NOT_EXIST:
            return value is None
        return _compare(self.operator, value, next(iter(self.values)))

    def __str__(self) -> str:
        listed = ",".join(sorted(self.values))
        if self.operator in (IN, NOT_IN) and len(self.values) == 1:
            return f"{self.key}{'=' if self.operator == IN else '!='}{listed}"
        forms = {EXISTS: self.key, DOES_NOT_EXIST: f"!{self.key}"}
        forms |= {GT: f"{self.key}>{listed}", LT: f"{self.key}<{listed}"}
        return forms.get(self.operator, f"{self.key} {self.operator.lower()} ({listed})")


def _compare(operator: str, value: str | None, bound: str) -> bool:
    """Gt/Lt compare integers; a missing or non-integer label never matches."""
    if value is None:
        return False
    try:
        number = int(value)
    except ValueError:
        return False
    return number > int(bound) if operator == GT else number < int(bound)


def _sort_key(req: Requirement) -> tuple[str, str, list[str]]:
    return req.key, req.operator, sorted(req.values)


@dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold. No requirements: matches everything. Hashable."""

    requirements: tuple[Requirement, ...] = field(default=())

    def __post_init__(self) -> None:
        # Sorted so that equal selectors compare and hash equal, whatever their order.
        ordered = tuple(sorted(self.requirements, key=_sort_key))
        object.__setattr__(self, "requirements", ordered)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with ``labels`` (None: no labels) is selected."""
        present = labels or {}
        return all(r.matches(present) for r in self.requirements)

    def is_empty(self) -> bool:
        """True when the selector has no requirements (it selects everything)."""
        return not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


EVERYTHING = LabelSelector()


def _check_key(key: str) -> str:
    why = qualified_name_problem(key)
    if why:
        raise ValueError(f"invalid label key {key!r}: {why}")
    return key


def _requirement(key: str, operator: str, values: Sequence[str] = ()) -> Requirement:
    """A checked requirement; ValueError names the bad key or value."""
    _check_key(key)
    for value in values:
        why = label_value_problem(value)
        if why:
            raise ValueError(f"invalid label value {value!r} for key {key!r}: {why}")
    if operator in (IN, NOT_IN) and not values:
        raise ValueError(f"{key!r}: operator {operator} needs at least one value")
    if operator in (EXISTS, DOES_NOT_EXIST) and values:
        raise ValueError(f"{key!r}: operator {operator} takes no values")
    return Requirement(key, operator, frozenset(values))


# --- label selector strings ----------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:(==|!=|=|\(|\)|,|!|<|>)|([^\s=!(),<>]+))")


@dataclass(frozen=True)
class _Token:
    text: str
    is_word: bool
    position: int


def _tokens(text: str) -> Iterator[_Token]:
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _TOKEN_RE.match(text, position)
        if match is None:
            raise ValueError(f"unexpected character {text[position]!r} at position {position}")
        word = match.group(2)
        group = 2 if word is not None else 1
        yield _Token(match.group(group), word is not None, match.start(group))
        position = match.end()


class _LabelParser:
    """Recursive descent over the tokens of one selector string."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(_tokens(text))
        self.index = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Token | None:
        token = self.peek()
        self.index += 1
        return token

    def fail(self, expected: str) -> ValueError:
        token = self.peek()
        found = f"{token.text!r} at position {token.position}" if token else "end of input"
        return ValueError(
            f"invalid label selector {self.text!r}: expected {expected}, found {found}"
        )

    def word(self, what: str) -> str:
        token = self.peek()
        if token is None or not token.is_word:
            raise self.fail(what)
        self.index += 1
        return token.text

    def at_symbol(self, symbol: str) -> bool:
        token = self.peek()
        return token is not None and not token.is_word and token.text == symbol

    def expect(self, symbol: str) -> None:
        if not self.at_symbol(symbol):
            raise self.fail(repr(symbol))
        self.index += 1

    def at_end_of_term(self) -> bool:
        return self.peek() is None or self.at_symbol(",")

    def parse(self) -> LabelSelector:
        found: list[Requirement] = []
        while self.peek() is not None:
            found.append(self.requirement())
            if self.peek() is not None:
                self.expect(",")
                if self.peek() is None:
                    raise self.fail("a requirement after ','")
        return LabelSelector(tuple(found))

    def requirement(self) -> Requirement:
        if self.at_symbol("!"):
            self.index += 1
            return _requirement(self.word("a label key after '!'"), DOES_NOT_EXIST)
        key = self.word("a label key")
        if self.at_end_of_term():
            return _requirement(key, EXISTS)
        return self.operation(key)

    def operation(self, key: str) -> Requirement:
        token = self.take()
        assert token is not None  # at_end_of_term() was False
        if token.is_word and token.text in _SET_OPS:
            return _requirement(key, _SET_OPS[token.text], self.value_set())
        if token.text in ("=", "==", "!="):
            operator = NOT_IN if token.text == "!=" else IN
            return _requirement(key, operator, [self.single_value()])
        if token.text in ("<", ">"):
            return self.comparison(key, GT if token.text == ">" else LT)
        self.index -= 1
        raise self.fail("one of '=', '==', '!=', 'in', 'notin', '<', '>'")

    def single_value(self) -> str:
        """The value after '=' or '!='; it may be empty (``tier=``)."""
        return "" if self.at_end_of_term() else self.word("a label value")

    def value_set(self) -> list[str]:
        self.expect("(")
        values: list[str] = []
        while not self.at_symbol(")"):
            if values:
                self.expect(",")
            values.append(self.word("a label value"))
        self.expect(")")
        return values

    def comparison(self, key: str, operator: str) -> Requirement:
        bound = self.word("an integer")
        if not re.fullmatch(r"-?[0-9]+", bound):
            raise ValueError(f"invalid label selector {self.text!r}: {bound!r} is not an integer")
        return Requirement(_check_key(key), operator, frozenset([bound]))


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a selector string; "" selects everything. ValueError says what is wrong."""
    return _LabelParser(text).parse()


def label_selector_from_spec(spec: Mapping[str, Any] | None) -> LabelSelector:
    """A LabelSelector from its object form ``{matchLabels, matchExpressions}``.

    ``{}`` selects everything. ``None`` ("not given") also returns the empty selector:
    what an absent selector means depends on where it is absent (in a NetworkPolicy peer,
    a missing podSelector beside a namespaceSelector means all pods there, while a missing
    namespaceSelector means the policy's own namespace), so callers that care must test
    for None before calling.
    """
    if spec is None:
        return EVERYTHING
    if not isinstance(spec, Mapping):
        raise ValueError(f"a label selector must be an object, got {type(spec).__name__}")
    found = [_requirement(k, IN, [v]) for k, v in (spec.get("matchLabels") or {}).items()]
    found += [_expression(e) for e in spec.get("matchExpressions") or []]
    return LabelSelector(tuple(found))


def _expression(expr: Mapping[str, Any]) -> Requirement:
    operator = expr.get("operator")
    if operator not in (IN, NOT_IN, EXISTS, DOES_NOT_EXIST):
        raise ValueError(f"unsupported label selector operator {operator!r}")
    return _requirement(str(expr.get("key", "")), operator, list(expr.get("values") or []))


# --- field selectors -----------------------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    """``field op value`` with op "=" or "!="; the field is a dotted path."""

    field: str
    op: str
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` meets this requirement."""
        equal = field_value(obj, self.field) == self.value
        return equal if self.op == "=" else not equal


def _split_unescaped(text: str, separator: str) -> list[str]:
    """Split on ``separator`` where it is not escaped by a backslash; keep the escapes."""
    if "\\" not in text:
        return text.split(separator)  # nothing escaped: the same parts, without the loop
    parts, start, escaped = [], 0, False
    for i, char in enumerate(text):
        if char == separator and not escaped:
            parts.append(text[start:i])
            start = i + 1
        escaped = char == "\\" and not escaped
    return [*parts, text[start:]]


def _find_operator(term: str) -> tuple[int, int, str] | None:
    """Where the first unescaped ``=``, ``==`` or ``!=`` of a term is: (start, end, op)."""
    escaped = False
    for i, char in enumerate(term):
        if char == "=" and not escaped:
            if i > 0 and term[i - 1] == "!" and not (i > 1 and term[i - 2] == "\\"):
                return i - 1, i + 1, "!="
            end = i + 2 if term[i + 1 : i + 2] == "=" else i + 1
            return i, end, "="
        escaped = char == "\\" and not escaped
    return None


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _field_term(term: str, allowed: set[str]) -> FieldRequirement:
    found = _find_operator(term)
    if found is None:
        why = "expected <field>=<value> or <field>!=<value>"
        raise ValueError(f"invalid field selector term {term.strip()!r}: {why}")
    start, end, op = found
    name = term[:start].strip()
    if name not in allowed:
        raise ValueError(f"field label not supported: {name}")
    return FieldRequirement(name, op, _unescape(term[end:].strip()))


def parse_field_selector(text: str, allowed: set[str]) -> list[FieldRequirement]:
    """Parse ``"metadata.name=x,spec.nodeName!=y"``; fields outside ``allowed`` are refused."""
    terms = (t for t in _split_unescaped(text, ",") if t.strip())
    return [_field_term(term, allowed) for term in terms]


def field_value(obj: Mapping[str, Any], field: str) -> str:
    """The value at a dotted path as a string ("" when missing or not a scalar)."""
    node: Any = obj
    for part in field.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node) if isinstance(node, str | int | float) else ""


def fields_match(obj: Mapping[str, Any], reqs: Sequence[FieldRequirement]) -> bool:
    """Whether ``obj`` meets every requirement (an empty list matches everything)."""
    return all(req.matches(obj) for req in reqs)
