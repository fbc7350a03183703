"""What the driver needs of the ast module, on the C module _ast alone.

ast imports enum, contextlib, functools and collections (for ast.unparse and
its helpers); the driver only parses (compile with PyCF_ONLY_AST), walks and
rewrites. walk, NodeTransformer, copy_location and fix_missing_locations
here do what ast's do, in the same order (the guardrails name the first
refused construct ast.walk meets). Model code that imports ast gets the real
module, as before.

_ast itself is imported at the first use of one of its names here (the node
classes, AST, PyCF_ONLY_AST), which plain code (screen.plain) never makes.
(The classes themselves are made by the interpreter's first compile(),
whatever it compiles: about 1.5 ms, which the driver's warm-up pays while
it waits for the first step.)
"""

from _collections import deque


def __getattr__(name):
    """The names of _ast, at the first that is asked for (PEP 562)."""
    import _ast
    names = {key: value for key, value in vars(_ast).items() if not key.startswith("_")}
    globals().update(names)  # from _ast import *
    if name not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return names[name]


def node_class():
    """_ast.AST, for the helpers below (a module's own globals do not go
    through __getattr__)."""
    return globals().get("AST") or __getattr__("AST")


def iter_fields(node):
    for name in node._fields:
        try:
            yield name, getattr(node, name)
        except AttributeError:
            pass


def iter_child_nodes(node, AST=None):
    AST = AST or node_class()
    for _, field in iter_fields(node):
        if isinstance(field, AST):
            yield field
        elif isinstance(field, list):
            for item in field:
                if isinstance(item, AST):
                    yield item


def walk(node):
    """Every node under node, breadth first, as ast.walk."""
    todo, AST = deque([node]), node_class()
    while todo:
        node = todo.popleft()
        todo.extend(iter_child_nodes(node, AST))
        yield node


def copy_location(new_node, old_node):
    for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        if attr in old_node._attributes and attr in new_node._attributes:
            value = getattr(old_node, attr, None)
            # The end positions are optional: copied even when None.
            if value is not None or (hasattr(old_node, attr) and attr.startswith("end_")):
                setattr(new_node, attr, value)
    return new_node


def fix_missing_locations(node):
    """Positions for the nodes that lack them, from their parents."""
    def fix(node, lineno, col_offset, end_lineno, end_col_offset):
        attributes = node._attributes
        if "lineno" in attributes:
            if not hasattr(node, "lineno"):
                node.lineno = lineno
            else:
                lineno = node.lineno
        if "end_lineno" in attributes:
            if getattr(node, "end_lineno", None) is None:
                node.end_lineno = end_lineno
            else:
                end_lineno = node.end_lineno
        if "col_offset" in attributes:
            if not hasattr(node, "col_offset"):
                node.col_offset = col_offset
            else:
                col_offset = node.col_offset
        if "end_col_offset" in attributes:
            if getattr(node, "end_col_offset", None) is None:
                node.end_col_offset = end_col_offset
            else:
                end_col_offset = node.end_col_offset
        for child in iter_child_nodes(node):
            fix(child, lineno, col_offset, end_lineno, end_col_offset)
    fix(node, 1, 0, 1, 0)
    return node


class NodeTransformer:
    """ast.NodeTransformer: visit_<Class> where defined, else the children."""

    def visit(self, node):
        return getattr(self, "visit_" + node.__class__.__name__, self.generic_visit)(node)

    def generic_visit(self, node):
        AST = node_class()
        for field, old_value in iter_fields(node):
            if isinstance(old_value, list):
                new_values = []
                for value in old_value:
                    if isinstance(value, AST):
                        value = self.visit(value)
                        if value is None:
                            continue
                        if not isinstance(value, AST):
                            new_values.extend(value)
                            continue
                    new_values.append(value)
                old_value[:] = new_values
            elif isinstance(old_value, AST):
                new_node = self.visit(old_value)
                if new_node is None:
                    delattr(node, field)
                else:
                    setattr(node, field, new_node)
        return node
