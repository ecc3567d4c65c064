#!/usr/bin/env python3
"""Print which folders of include/loom include which, and fail on a cycle.

The folders under include/loom/ follow the data flow of the design (core, graph, ops,
autograd, plan, partition, runtime, search, calibrate, train; schedule, io and models where
they belong): nothing downstream reaches back upstream. This check reads every
`#include <loom/...>` (and every quoted include naming a file under the root) of every
header, maps each header to its top-level folder (runtime/host/gemm.hpp belongs to
runtime), and prints one line per folder: the folders it includes, with how many include
lines point there. Includes inside one folder are not edges. Headers directly under the
root (loom.hpp, the entry header) form the folder ".".

Without a cycle it also prints the folders in layers: each layer includes only folders of
the layers before it. If the folder graph has a cycle, it prints each cycle with the include lines that make
every edge of it (file:line -> included header) and exits 1, so the fix is to move one of
those headers or drop one of those includes.

    python3 tools/folder_deps.py                 # include/loom of this checkout
    python3 tools/folder_deps.py --root DIR      # any tree laid out like include/loom
"""

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "include" / "loom"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
HEADER_SUFFIXES = {".hpp", ".h", ".hh", ".cuh", ".ipp"}


def folder_of(relative):
    """Top-level folder of a path relative to the root; '.' for files directly in it."""
    parts = relative.parts
    return parts[0] if len(parts) > 1 else "."


def included_path(name, quote, including_file, root):
    """Path, relative to root, of the header an include names; None when outside root."""
    candidates = []
    if quote == '"':
        candidates.append(including_file.parent / name)
    if name.startswith(root.name + "/"):
        candidates.append(root.parent / name)
    for candidate in candidates:
        candidate = candidate.resolve()
        if candidate.is_file() and root in candidate.parents:
            return candidate.relative_to(root)
    return None


def read_edges(root):
    """{(from folder, to folder): [(file, line number, included header), ...]}."""
    edges = defaultdict(list)
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in HEADER_SUFFIXES:
            continue
        source = path.relative_to(root)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = INCLUDE_RE.match(line)
            target = match and included_path(match.group(2), match.group(1), path, root)
            if target is None:
                continue
            source_folder, target_folder = folder_of(source), folder_of(target)
            if source_folder != target_folder:
                edges[(source_folder, target_folder)].append((source, number, target))
    return edges


def strongly_connected(nodes, successors):
    """Tarjan's algorithm; components in discovery order, nodes sorted within each."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for next_node in successors[node]:
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return components


def cycle_in(component, successors):
    """One cycle through the component's first folder, as a list of folders (first repeated
    at the end), found by breadth-first search inside the component."""
    members = set(component)
    start = component[0]
    parent = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for next_node in successors[node]:
                if next_node == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return list(reversed(path)) + [start]
                if next_node in members and next_node not in parent:
                    parent[next_node] = node
                    following.append(next_node)
        frontier = following
    raise AssertionError("a strongly connected component without a cycle")


def layers(folders, successors):
    """Folders by depth in an acyclic graph: layer 0 includes nothing, layer n includes
    something of layer n - 1 and nothing of layer n or later."""
    depth = {}

    def depth_of(folder):
        if folder not in depth:
            depth[folder] = 1 + max((depth_of(t) for t in successors[folder]), default=-1)
        return depth[folder]

    grouped = defaultdict(list)
    for folder in folders:
        grouped[depth_of(folder)].append(folder)
    return [sorted(grouped[d]) for d in sorted(grouped)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="the folder whose sub-folders are checked (default: include/loom); "
                             "includes are read as <NAME/...> where NAME is its own name")
    args = parser.parse_args()
    root = args.root.resolve()
    if not root.is_dir():
        sys.exit(f"folder_deps: --root {args.root} is not a directory; pass the folder that "
                 f"holds the header folders, e.g. include/loom")

    edges = read_edges(root)
    folders = sorted({p.relative_to(root).parts[0] for p in root.iterdir() if p.is_dir()}
                     | {a for a, _ in edges} | {b for _, b in edges})
    successors = defaultdict(list)
    for (source, target) in sorted(edges):
        successors[source].append(target)

    print(f"folder dependencies of {args.root} (folder -> folder (include lines)):")
    for folder in folders:
        targets = ", ".join(f"{t} ({len(edges[(folder, t)])})" for t in successors[folder])
        print(f"  {folder} -> {targets or '(nothing)'}")

    cycles = [c for c in strongly_connected(folders, successors) if len(c) > 1]
    if not cycles:
        print("no cycles; layers, each including only the layers before it:")
        for number, layer in enumerate(layers(folders, successors)):
            print(f"  {number}: {', '.join(layer)}")
        return 0
    for component in cycles:
        cycle = cycle_in(component, successors)
        print(f"cycle: {' -> '.join(cycle)}  (folders in the knot: {', '.join(component)})",
              file=sys.stderr)
        for source, target in zip(cycle, cycle[1:]):
            for path, number, included in edges[(source, target)]:
                print(f"  {source} -> {target}: {path.as_posix()}:{number} includes "
                      f"{included.as_posix()}", file=sys.stderr)
    print(f"folder_deps: {len(cycles)} cycle(s) between folders of {args.root}; move one of "
          f"the headers above to the folder it belongs to, or drop the include, so that "
          f"nothing downstream includes upstream", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
