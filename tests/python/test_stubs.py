"""The type stubs (python/sharpcheck/__init__.pyi) against the module: every public name has a
stub, and every stubbed function takes exactly the parameters the function takes (names, order,
positional or keyword-only, which have defaults), so an editor never offers a keyword the module
refuses or hides one it takes (issue 34: attention_backward's stub lacked alibi_slopes)."""

import ast
import inspect
import pathlib

import pytest

import sharpcheck

STUB = pathlib.Path(sharpcheck.__file__).with_name("__init__.pyi")


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def _stub_functions():
    return {node.name: node for node in _stub_tree().body if isinstance(node, ast.FunctionDef)}


def _stub_names():
    names = set()
    for node in _stub_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _stub_parameters(node: ast.FunctionDef):
    args = node.args
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    rows = [(a.arg, "positional", i >= first_default) for i, a in enumerate(positional)]
    if args.vararg:
        rows.append((args.vararg.arg, "var_positional", False))
    rows += [(a.arg, "keyword_only", d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        rows.append((args.kwarg.arg, "var_keyword", False))
    return rows


def _module_parameters(function):
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.VAR_POSITIONAL: "var_positional", inspect.Parameter.KEYWORD_ONLY: "keyword_only",
             inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    return [(p.name, kinds[p.kind], p.default is not inspect.Parameter.empty and "var" not in kinds[p.kind])
            for p in inspect.signature(function).parameters.values()]


def test_every_public_name_has_a_stub():
    missing = sorted(set(sharpcheck.__all__) - _stub_names())
    assert not missing, f"__init__.pyi lacks {missing}"


@pytest.mark.parametrize("name", sorted(n for n in sharpcheck.__all__ if inspect.isfunction(getattr(sharpcheck, n))))
def test_a_stub_takes_exactly_the_parameters_the_function_takes(name):
    stub = _stub_functions().get(name)
    assert stub is not None, f"no stub for {name}"
    assert _stub_parameters(stub) == _module_parameters(getattr(sharpcheck, name))


def test_the_comparison_can_fail():
    # A stub missing one keyword, compared as above, differs.
    tree = ast.parse("def f(a, *, b=1, c=2): ...")
    node = tree.body[0]
    node.args.kwonlyargs.pop()
    node.args.kw_defaults.pop()

    def f(a, *, b=1, c=2):
        return a, b, c

    assert _stub_parameters(node) != _module_parameters(f)
