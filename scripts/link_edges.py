#!/usr/bin/env python3
"""Checks that each library's CMake link edges equal its includes (docs/architecture.md's rule).

For every `sharpcheck_<folder>` library in CMakeLists.txt, the project libraries it links (PUBLIC
or PRIVATE, sharpcheck_warnings and sharpcheck_arb aside) must be exactly the folders its sources
and headers include (`#include "<folder>/..."`, its own folder aside; subfolders count as their
folder). Prints each mismatch and
exits 1 if there is one; usage: link_edges.py [source-dir].
"""
import pathlib
import re
import sys

NOT_FOLDERS = {"warnings", "arb"}


def link_edges(cmake_text):
    edges = {}
    for match in re.finditer(r"target_link_libraries\(\s*sharpcheck_(\w+)(.*?)\)\n", cmake_text, re.S):
        name, body = match.group(1), re.sub(r"\$\{[^}]*\}", "", match.group(2))
        deps = set(re.findall(r"\bsharpcheck_(\w+)", body)) - NOT_FOLDERS
        edges.setdefault(name, set()).update(deps)
    return edges


def include_edges(root, folder):
    found = set()
    for path in (root / folder).rglob("*"):  # an operation's folder has one folder per operation
        if path.suffix in (".cpp", ".hpp", ".h"):
            found.update(re.findall(r'#include "(\w+)/', path.read_text(errors="replace")))
    return found - {folder}


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    edges = link_edges((root / "CMakeLists.txt").read_text())
    problems = []
    for name, linked in sorted(edges.items()):
        if not (root / name).is_dir():
            continue  # not a folder library (an executable or an interface target)
        included = include_edges(root, name)
        for missing in sorted(included - linked):
            problems.append(f"sharpcheck_{name} includes {missing}/ but does not link sharpcheck_{missing}")
        for extra in sorted(linked - included):
            problems.append(f"sharpcheck_{name} links sharpcheck_{extra} but includes nothing from {extra}/")
    for problem in problems:
        print(problem)
    print(f"link_edges: {len(edges)} targets checked, {len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
