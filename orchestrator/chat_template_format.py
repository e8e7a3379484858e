"""Whether a chat template reads a message's content as a string or iterates over its parts.

vLLM 0.32's detection (`vllm/renderers/hf.py`, `_detect_content_format` and the
`_iter_nodes_*` walks it uses), over the template's Jinja syntax tree:

    messages vars = "messages" and every variable assigned from it (or a slice / filter of it)
    message vars  = the targets of `for m in <messages var>` loops
    content loop  = a loop over `<message var>.content` / `<message var>["content"]`, or over a macro
                    parameter that a call passes such content, or (outside macros) over a bare `content`
    format        = "openai" if the template has a content loop, else "string";
                    "string" too for a template that does not compile

Restated here so that the frontend does not import vLLM (seconds and ~0.5 GB) to read one
property of its template; tests/unit/test_chat_messages.py checks it against vLLM's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import lru_cache

import jinja2
import jinja2.nodes as nodes


@lru_cache(maxsize=8)
def iterates_content_parts(template: str) -> bool:
    """True for vLLM's "openai" content format: the template loops over a message's content parts."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:  # parsed by the environment transformers renders chat templates in (its extensions' tags)
        tree = _compile_jinja_template(template).environment.parse(template)
    except jinja2.TemplateError:
        return False
    return next(_content_loops(tree), None) is not None


def _is_var(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    return isinstance(node, nodes.Getattr) and _is_var(node.node, name) and node.attr == key


def _is_access(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """`name` (or `name.key`), possibly filtered, tested or sliced."""
    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_access(node.node, name, key)
    if isinstance(node, nodes.Test):
        return _is_access(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_access(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _aliases(root: nodes.Template, name: str) -> Iterator[str]:
    """`name` and every variable assigned from it, transitively."""
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(nodes.Assign):
            if _is_access(assign.node, current) and isinstance(assign.target, nodes.Name):
                yield assign.target.name
                if assign.target.name != current:
                    pending.append(assign.target.name)


def _message_vars(root: nodes.Template) -> list[str]:
    """Targets of loops over the messages."""
    messages = list(_aliases(root, "messages"))
    found = []
    for loop in root.find_all(nodes.For):
        if any(_is_access(loop.iter, m) for m in messages) and isinstance(loop.target, nodes.Name):
            found.append(loop.target.name)
    return found


def _macro_content_params(root: nodes.Template, message_vars: list[str]) -> tuple[dict[int, set[str]], set[int]]:
    """Per loop inside a macro: the macro's parameters that some call passes a message's content;
    and the ids of every loop inside a macro."""

    def is_content(arg: nodes.Node) -> bool:
        return any(_is_access(arg, m, "content") for m in message_vars)

    by_loop: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        names = [a.name for a in macro.args]
        params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            params |= {names[i] for i, arg in enumerate(call.args) if i < len(names) and is_content(arg)}
            params |= {kw.key for kw in call.kwargs if kw.key in names and is_content(kw.value)}
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if params:
                by_loop[id(loop)] = params
    return by_loop, in_macros


def _content_loops(root: nodes.Template) -> Iterator[nodes.For]:
    message_vars = _message_vars(root)
    macro_params, in_macros = _macro_content_params(root, message_vars)
    for loop in root.find_all(nodes.For):
        over = loop.iter
        if any(_is_access(over, m, "content") for m in message_vars):
            yield loop
        elif isinstance(over, nodes.Name) and over.name in macro_params.get(id(loop), ()):
            yield loop
        elif id(loop) not in in_macros and isinstance(over, nodes.Name) and over.name == "content":
            yield loop
