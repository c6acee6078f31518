"""Graph inspection for the compile passes: operator counts, subgraph inputs, attributes, fresh names."""
from __future__ import annotations

from collections import Counter

from onnx import GraphProto, ModelProto, helper


def op_key(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def _subgraphs(node):
    for attr in node.attribute:
        if attr.type == attr.GRAPH:
            yield attr.g
        elif attr.type == attr.GRAPHS:
            yield from attr.graphs


def count_ops(graph: GraphProto | ModelProto) -> dict[str, int]:
    """Operator type -> count, subgraphs (If/Loop/Scan bodies) included, sorted by name."""
    if isinstance(graph, ModelProto):
        graph = graph.graph
    counts: Counter = Counter()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            counts[op_key(node)] += 1
            stack.extend(_subgraphs(node))
    return dict(sorted(counts.items()))


def subgraph_inputs(node) -> set[str]:
    """Every name a node's subgraphs read (their outer-scope references included)."""
    names: set[str] = set()
    for g in _subgraphs(node):
        for n in g.node:
            names.update(i for i in n.input if i)
            names |= subgraph_inputs(n)
    return names


def attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class Names:
    """Fresh tensor/node names that collide with nothing in the graph."""

    def __init__(self, graph: GraphProto) -> None:
        self.used: set[str] = {t.name for t in graph.initializer} | {v.name for v in graph.input}
        self.used |= {v.name for v in graph.output} | {v.name for v in graph.value_info}
        for node in graph.node:
            self.used.update(node.output)
            self.used.update(node.input)
            if node.name:
                self.used.add(node.name)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name = f"{base}.{i}"
            i += 1
        self.used.add(name)
        return name
