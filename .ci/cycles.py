#!/usr/bin/env python3
"""Fails when modules of a crate import each other in a cycle.

For each crate source folder given, reads every `crate::a::...` and `super::...` path
(comments and `mod tests` blocks left out), maps it to the module it names, and records
an edge between the two modules where their paths part (siblings under one parent; a
module using its parent or child is not an edge). Prints each cycle found and exits 1.

    python3 .ci/cycles.py host/rules/src host/runtime/src host/src
"""
import glob
import os
import re
import sys


def module_path(root, path):
    parts = os.path.relpath(path, root)[:-3].split("/")
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return parts


def edges_of(root):
    edges = set()
    for path in glob.glob(root + "/**/*.rs", recursive=True):
        me = module_path(root, path)
        text = open(path).read()
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
        text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
        for m in re.finditer(r"\b(crate|super(?:::super)*)::([a-z_]+)", text):
            if m.group(1) == "crate":
                target = [m.group(2)]
            else:
                up = m.group(1).count("super")
                target = me[: len(me) - up] + [m.group(2)]
            k = 0
            while k < min(len(me), len(target)) and me[k] == target[k]:
                k += 1
            if k < len(me) and k < len(target):
                edges.add(("/".join(me[: k + 1]), "/".join(target[: k + 1])))
    return edges


def main():
    failed = False
    for root in sys.argv[1:]:
        graph = {}
        for a, b in edges_of(root):
            graph.setdefault(a, set()).add(b)

        def reaches(start, goal):
            seen, todo = set(), [start]
            while todo:
                node = todo.pop()
                if node == goal:
                    return True
                for nxt in graph.get(node, ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            return False

        cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
        for a, b in cycles:
            print(f"{root}: {a} and {b} import each other (directly or through others)")
            failed = True
    if failed:
        sys.exit(1)
    print("no import cycle between modules in " + ", ".join(sys.argv[1:]))


main()
