"""What a hook type is, when it does not depend on the entry's spec, is a class attribute
(``needs_backward = True``), not a ``@property`` returning a constant: read from hooks/ with ``ast``."""
from __future__ import annotations

import ast
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "hooks"


def _is_constant(node: ast.expr) -> bool:
    """A literal (``"..."``, ``True``, ``("slot", "0")``, ``{"a"}``), ``set()`` / ``frozenset({...})`` of
    one, or a module constant (an upper-case name)."""
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset"):
        return not node.keywords and len(node.args) <= 1 and all(_is_constant(a) for a in node.args)
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def constant_properties(source: str) -> list[str]:
    """``Class.name`` of each ``@property`` in ``source`` whose body (its docstring aside) is one
    ``return`` of a constant."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or not any(
                    isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
                continue
            body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None \
                    and _is_constant(body[0].value):
                found.append(f"{cls.name}.{fn.name}")
    return found


def test_the_scan_finds_a_constant_property_and_passes_a_computed_one():
    source = '''
class A:
    @property
    def needs_backward(self) -> bool:
        """Docstring."""
        return True

    @property
    def kinds(self):
        return frozenset({"saved"})

    @property
    def limit(self):
        return LIMIT

    @property
    def slot(self):
        return "slot", "0"

    @property
    def computed(self):
        return self.spec.kinds

    @property
    def branch(self):
        if self.spec.x:
            return None
        return "a"

    needs_grad = True
'''
    assert constant_properties(source) == ["A.needs_backward", "A.kinds", "A.limit", "A.slot"]


def test_no_hooks_property_returns_a_constant():
    found = {f"{path.relative_to(HOOKS.parent)}: {name}" for path in sorted(HOOKS.rglob("*.py"))
             for name in constant_properties(path.read_text())}
    assert found == set()


def test_class_attributes_and_properties_still_read_as_values_through_the_class_tree():
    """A subclass constant over a computed property wins (``GradTransform.needs_backward`` over
    ``Tap``'s); a computed property over a base constant still computes (``Observe.record_kinds`` over
    ``Tap``'s); the base defaults (``HookType.stored_runs``, ``Tap.grad_slot``) read as values."""
    from conftest import make_config
    from hooks import build_hooks

    cfg = make_config("hooks=[clip,stats,post_accumulate]", "hooks.stats.kinds=[output]", "model=resnet18")
    clip, stats, post = build_hooks(cfg.hooks)
    assert (clip.type_name, stats.type_name, post.type_name) == ("clamp", "stats", "post_accumulate")
    assert (clip.needs_backward, stats.needs_backward, post.needs_backward) == (True, False, True)
    assert stats.record_kinds == {"output"} and post.expected_kinds == frozenset({"param_grad"})
    assert (post.stored_runs, stats.side_data, stats.grad_slot, stats.edited_input) == ((), None, None, ("slot", "0"))
