#!/usr/bin/env python3
"""Checks the documentation's relative links: every [text](target) in
README.md, CHANGELOG.md and the .md files under docs/ and bench/ names a
file or folder of the tree, and a #fragment names a heading of the target
(GitHub's anchors); a link that leaves the tree is refused.
Prints each failure as FILE:LINE: ... and exits 1 if there is any.

    scripts/check_links.py [ROOT]"""

import re
import sys
from pathlib import Path

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def documents(root):
    files = [root / "README.md", root / "CHANGELOG.md"]
    for folder in ("docs", "bench"):
        files += sorted((root / folder).rglob("*.md"))
    return [f for f in files if f.is_file() and ".venv" not in f.parts]


def anchors(path):
    """GitHub's heading anchors of a markdown file: lower case, punctuation
    dropped except '-' and '_', spaces to '-', repeats numbered."""
    seen, out, fenced = {}, set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def problems(root, doc):
    fenced = False
    for no, line in enumerate(doc.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, frag = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                yield no, f"link to a missing file: {target}"
            elif root.resolve() not in dest.parents and dest != root.resolve():
                yield no, f"link outside the tree: {target}"
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                yield no, f"link to a missing heading: {target}"


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    bad = 0
    for doc in documents(root):
        for no, why in problems(root, doc):
            print(f"{doc.relative_to(root)}:{no}: {why}")
            bad += 1
    print(f"check_links: {bad} problem(s) in {len(documents(root))} files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
