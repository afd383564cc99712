"""Every flag and code symbol the docs name is one the code has, and every link to a
heading reaches one.

Reads README.md and docs/*.md; takes each `--flag` they name (in backticks or code
blocks) and each CamelCase symbol in backticks (`SyncLedger`, `PeerTargets::Map`), and
looks for it in the tree's code, scripts, protos and deploy files. A name found nowhere
fails the check, with the doc and the line that names it: a doc that describes a flag
or a class the code no longer has is wrong.

    python3 tests/docs/doc_names_check.py ROOT
"""

import os
import re
import sys

CODE_SUFFIXES = (".cc", ".h", ".cu", ".py", ".sh", ".proto", ".yaml", ".service", ".env", ".toml", ".bzl")
CODE_DIRS = ("bench", "client", "common", "daemon", "deploy", "executor", "planner", "proto", "scripts", "spec",
             "tests", "tools", "third_party", "examples")
# (tests/docs is not code: this check and its self-test name missing things on purpose.)
# Flags of other programs the docs show in their commands.
OTHER_PROGRAMS = {"--config", "--test_output", "--system-site-packages", "--no-build-isolation", "--repo_env",
                  "--linkopt", "--watch", "--version", "--help", "--now",  # bazel, pip, systemctl
                  "--custom-weight-loader", "--enable-memory-saver"}  # SGLang's

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# CamelCase with two capitals at least (`SyncLedger`, `Coordinator::Sync`), not a word.
SYMBOL = re.compile(r"^[A-Z][A-Za-z0-9]*(?:::[A-Z][A-Za-z0-9]*)?$")


def code_text(root):
    texts = []
    for top in CODE_DIRS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            if "/corpus" in folder or "/standins" in folder or folder.endswith("tests/docs"):
                continue
            for name in files:
                if name.endswith(CODE_SUFFIXES) or name == "BUILD" or os.path.dirname(folder).endswith("scripts"):
                    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                        texts.append(f.read())
    for folder in (os.path.join(root, "scripts"), os.path.join(root, ".ci")):
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    return "\n".join(texts)


def named_in(path):
    """(line number, kind, name) of each flag and symbol the doc at `path` names."""
    names = []
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            spans = [line] if fenced else CODE_SPAN.findall(line)
            for span in spans:
                for flag in FLAG.findall(span):
                    names.append((number, "flag", flag))
                if not fenced:
                    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_:]*", span):
                        if SYMBOL.match(word) and sum(c.isupper() for c in word) >= 2 and not word.isupper():
                            names.append((number, "symbol", word))
    return names


LINK = re.compile(r"\]\(([^)#\s]*\.md)?#([a-z0-9-]+)\)")


def anchors(path):
    """The anchors of the headings of the doc at `path`, as GitHub makes them."""
    found = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                found.add(re.sub(r"[^a-z0-9 -]", "", title).replace(" ", "-"))
    return found


def broken_links(doc):
    """Each `[..](file.md#anchor)` or `[..](#anchor)` of `doc` whose heading is not there."""
    broken = []
    with open(doc, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            for target, anchor in LINK.findall(line):
                path = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
                if not os.path.exists(path) or anchor not in anchors(path):
                    broken.append(f"{doc}:{number}: link {target}#{anchor} reaches no heading")
    return broken


def main(root):
    code = code_text(root)
    docs = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", n) for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    missing, checked = [], 0
    for doc in docs:
        for number, kind, name in named_in(doc):
            if kind == "flag" and name in OTHER_PROGRAMS:
                continue
            checked += 1
            found = (f'"{name}' in code or f"'{name}" in code or f" {name}" in code or f"{name}=" in code) \
                if kind == "flag" else all(part in code for part in name.split("::"))
            if not found:
                missing.append(f"{os.path.relpath(doc, root)}:{number}: {kind} {name} is in no code")
    for doc in docs:
        links = broken_links(doc)
        checked += len(LINK.findall(open(doc, encoding="utf-8").read()))
        missing += [os.path.relpath(line, root) if line.startswith(root) else line for line in links]
    for line in missing:
        print(line)
    print(f"{checked - len(missing)} passed, {len(missing)} failed")
    return 1 if missing or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
