"""YAML from files drill does not trust (a policy, a trainer's snapshot metadata), read within
bounds: plain data only, nesting no deeper than asked, and aliases that share a value but do not
multiply it.

PyYAML's safe loader builds no object from a tag, but it still follows aliases: a few anchors
that refer to each other (the "billion laughs") describe more values than memory holds, and
even where the loader shares them, whoever walks the result walks every copy. So the document is
composed first, its size counted with every alias expanded (memoized: counting is cheap), and
refused past the bound before anything is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


class YamlRefused(ValueError):
    """Not YAML, or YAML past a bound; ``line`` (1-based) where it was found, when known."""

    def __init__(self, why: str, line: int | None = None) -> None:
        super().__init__(why)
        self.why, self.line = why, line


@dataclass(frozen=True, slots=True)
class _Limit:
    mark: Any
    why: str


def _bounded_loader(max_depth: int) -> type[yaml.SafeLoader]:
    class Bounded(yaml.SafeLoader):
        """PyYAML's safe loader, refusing documents nested deeper than ``max_depth``."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > max_depth:
                    why = f"nested more than {max_depth} levels deep"
                    raise yaml.YAMLError(_Limit(self.peek_event().start_mark, why))
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Bounded


def compose(text: str | bytes, *, max_depth: int, max_nodes: int | None = None) -> yaml.Node | None:
    """The document's node graph; :class:`YamlRefused` for text that is not YAML, nested deeper
    than ``max_depth``, with an alias that contains itself, or with more than ``max_nodes``
    values once every alias is expanded (None: more than twice the values written, plus
    10,000 — aliases may share a value, not multiply it)."""
    loader = None
    try:
        loader = _bounded_loader(max_depth)(text)
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        limit = exc.args[0] if exc.args and isinstance(exc.args[0], _Limit) else None
        mark = limit.mark if limit else getattr(exc, "problem_mark", None)
        why = f"refused: {limit.why}" if limit else f"not valid YAML: {getattr(exc, 'problem', exc)}"
        raise YamlRefused(why, mark.line + 1 if mark else None) from None
    except (ValueError, RecursionError) as exc:  # bytes that are not text; nesting past the interpreter's
        raise YamlRefused(f"not valid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is not None:
        written, expanded = _sizes(root)
        bound = max_nodes if max_nodes is not None else 2 * written + 10_000
        if expanded > bound:
            raise YamlRefused(
                f"refused: more than {bound} values once its aliases are expanded", root.start_mark.line + 1
            )
    return root


def load(text: str | bytes, *, max_depth: int, max_nodes: int | None = None) -> Any:
    """The document as plain Python data, within the bounds :func:`compose` applies."""
    root = compose(text, max_depth=max_depth, max_nodes=max_nodes)
    if root is None:
        return None
    try:
        return yaml.SafeLoader("").construct_document(root)
    except yaml.YAMLError as exc:  # a tag that builds an object, a key that cannot be one
        mark = getattr(exc, "problem_mark", None)
        raise YamlRefused(f"not plain data: {getattr(exc, 'problem', exc)}", mark.line + 1 if mark else None) from None


def _sizes(root: yaml.Node) -> tuple[int, int]:
    """(values written, values once every alias is expanded); :class:`YamlRefused` for an
    alias that refers to the value containing it."""
    expanded: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in expanded:
            return expanded[key]
        if key in open_:
            raise YamlRefused("refused: an alias refers to the value that contains it", node.start_mark.line + 1)
        open_.add(key)
        total = 1
        for child in _children(node):
            total += size(child)
        open_.discard(key)
        expanded[key] = total
        return total

    total = size(root)
    return len(expanded), total


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [c for pair in node.value for c in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
