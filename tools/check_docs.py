#!/usr/bin/python3
"""The rules the README states, checked instead of claimed (issue 32).

  check_docs.py ROOT

ROOT is the source tree. Checks, each failure printed with what to do:
  1. every relative link in README.md, docs/*.md, deploy/README.md and
     bench/*.md names an existing file, and a #anchor into a .md file an
     existing heading (GitHub's slugs);
  2. README.md has at most README_MAX_LINES lines;
  3. no .cc/.h file has more than FILE_MAX_LINES lines and no function more
     than FUNCTION_MAX_LINES (a rough brace-matching scan), except what
     tools/size_exceptions.txt lists, at no more than its recorded size.
Exit status 0 when every rule holds, 1 otherwise.
"""

import os
import re
import sys

README_MAX_LINES = 160
FILE_MAX_LINES = 500
FUNCTION_MAX_LINES = 120
EXCEPTIONS = "tools/size_exceptions.txt"
SOURCE_DIRS_SKIPPED = {"third_party", "out", "node_modules"}


# ---------------------------------------------------------------- links

def markdown_files(root):
    files = ["README.md", "deploy/README.md"]
    for folder in ("docs", "bench"):
        d = os.path.join(root, folder)
        if os.path.isdir(d):
            files += sorted(os.path.join(folder, f) for f in os.listdir(d) if f.endswith(".md"))
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def strip_code(text):
    """Markdown text without fenced blocks and inline code spans."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def github_slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped,
    spaces to hyphens (hyphens and underscores kept)."""
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link's text
    s = re.sub(r"[^\w\- ]", "", s, flags=re.UNICODE)
    return s.replace(" ", "-")


def anchors(path):
    result, counts, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = github_slug(m.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            result.add(slug if n == 0 else "%s-%d" % (slug, n))
    return result


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def check_links(root):
    errors = []
    anchor_cache = {}
    for md in markdown_files(root):
        with open(os.path.join(root, md), encoding="utf-8") as f:
            text = strip_code(f.read())
        for lineno, line in enumerate(text.split("\n"), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                if path:
                    full = os.path.normpath(os.path.join(root, os.path.dirname(md), path))
                else:
                    full = os.path.join(root, md)
                rel = os.path.relpath(full, root)
                if rel.startswith(".."):
                    errors.append("%s:%d: link %s leads out of the tree" % (md, lineno, target))
                    continue
                if not os.path.exists(full):
                    errors.append("%s:%d: link %s: no file %s" % (md, lineno, target, rel))
                    continue
                if anchor and full.endswith(".md"):
                    if full not in anchor_cache:
                        anchor_cache[full] = anchors(full)
                    if anchor not in anchor_cache[full]:
                        errors.append("%s:%d: link %s: %s has no heading with anchor #%s"
                                      % (md, lineno, target, rel, anchor))
    return errors


def check_readme_length(root):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        n = len(f.read().rstrip("\n").split("\n"))
    if n > README_MAX_LINES:
        return ["README.md has %d lines, more than %d: move the detail into docs/"
                % (n, README_MAX_LINES)]
    return []


# ---------------------------------------------------------------- sizes

def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and not d.startswith("bazel-")
            and not (rel_dir == "." and d in SOURCE_DIRS_SKIPPED))
        for name in sorted(filenames):
            if name.endswith((".cc", ".h")):
                yield os.path.normpath(os.path.join(rel_dir, name))


def blank_out(text):
    """C++ text with comments, string and character literals and
    preprocessor lines replaced by spaces (newlines kept), so braces in them
    do not count."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                i += 1  # a digit separator: 1'000'000
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


FUNCTION_HEAD_END = re.compile(
    r"\)\s*(?:(?:const|override|final|mutable|volatile|noexcept(?:\s*\([^()]*\))?|&&?|"
    r"->\s*[\w:<>,\s*&]+|ABSL_\w+\s*\([^()]*\)|ABSL_\w+)\s*)*$")
NOT_FUNCTION_HEAD = re.compile(r"^\s*(?:namespace|class|struct|union|enum|extern)\b")


def function_name(head):
    head = " ".join(head.split())
    m = re.search(r"(operator\s*[^\s(]+|[~\w:]+)\s*\(", head)
    if not m:
        return head[:60]
    name = m.group(1)
    if re.match(r"^[A-Z_0-9]+$", name):  # TEST(Suite, Name) and other macros
        depth, j = 0, m.start()
        for j in range(m.start(), len(head)):
            if head[j] == "(":
                depth += 1
            elif head[j] == ")":
                depth -= 1
                if depth == 0:
                    break
        return re.sub(r"\s+", " ", head[m.start():j + 1])
    return name


def functions(text):
    """(name, first line, lines) of every function body at namespace or
    class level: a `{` whose head ends like a function's signature."""
    code = blank_out(text)
    result = []
    stack = []  # for each open brace: "function", "scope" or "other"
    head_start = 0
    paren = 0
    i, n = 0, len(code)
    line_of = lambda k: code.count("\n", 0, k) + 1
    while i < n:
        c = code[i]
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c in ";":
            if paren <= 0:
                head_start = i + 1
        elif c == "{":
            head = code[head_start:i]
            if any(isinstance(e, tuple) for e in stack) or paren > 0:
                stack.append("other")  # a block, lambda or braced init inside
            elif NOT_FUNCTION_HEAD.match(head) or not head.strip():
                stack.append("scope")
            elif FUNCTION_HEAD_END.search(head) and (
                    "operator" in head or "=" not in head.replace("==", "")):
                first = head_start + (len(head) - len(head.lstrip()))
                stack.append(("function", function_name(head), line_of(first)))
            else:
                stack.append("other")  # an initializer: int x[] = {...}
            head_start = i + 1
        elif c == "}":
            if stack:
                top = stack.pop()
                if isinstance(top, tuple):
                    _, name, first = top
                    result.append((name, first, line_of(i) - first + 1))
            head_start = i + 1
        i += 1
    return result


def read_exceptions(root):
    files, funcs, errors = {}, {}, []
    path = os.path.join(root, EXCEPTIONS)
    if not os.path.exists(path):
        return files, funcs, errors
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            try:
                if parts[0] == "file" and len(parts) == 3:
                    files[parts[1]] = int(parts[2])
                    continue
                if parts[0] == "function" and len(parts) >= 4:
                    funcs[(parts[1], " ".join(parts[2:-1]))] = int(parts[-1])
                    continue
            except ValueError:
                pass
            errors.append("%s:%d: not 'file PATH LINES' or 'function PATH NAME LINES': %s"
                          % (EXCEPTIONS, lineno, line))
    return files, funcs, errors


def check_sizes(root):
    allowed_files, allowed_funcs, errors = read_exceptions(root)
    notes = []
    seen_files, seen_funcs = set(), {}
    for rel in source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = len(text.rstrip("\n").split("\n"))
        if rel in allowed_files:
            seen_files.add(rel)
            limit = allowed_files[rel]
            if lines <= FILE_MAX_LINES:
                errors.append("%s has %d lines, within the %d-line limit now: remove its line from %s"
                              % (rel, lines, FILE_MAX_LINES, EXCEPTIONS))
            elif lines > limit:
                errors.append("%s has %d lines, more than the %d %s allows it (listed files may only shrink): split it"
                              % (rel, lines, limit, EXCEPTIONS))
            elif lines < limit:
                notes.append("%s shrank to %d lines: lower its record in %s" % (rel, lines, EXCEPTIONS))
        elif lines > FILE_MAX_LINES:
            errors.append("%s has %d lines, more than %d: split it (only files already in %s may be over)"
                          % (rel, lines, FILE_MAX_LINES, EXCEPTIONS))
        for name, first, length in functions(text):
            key = (rel, name)
            if key in allowed_funcs:
                seen_funcs[key] = max(seen_funcs.get(key, 0), length)
            elif length > FUNCTION_MAX_LINES:
                errors.append("%s:%d: %s has %d lines, more than %d: split it"
                              % (rel, first, name, length, FUNCTION_MAX_LINES))
    for rel in sorted(set(allowed_files) - seen_files):
        errors.append("%s lists %s, which no longer exists: remove its line" % (EXCEPTIONS, rel))
    for key, limit in sorted(allowed_funcs.items()):
        rel, name = key
        length = seen_funcs.get(key)
        if length is None:
            errors.append("%s lists function %s in %s, which is no longer there: remove its line"
                          % (EXCEPTIONS, name, rel))
        elif length <= FUNCTION_MAX_LINES:
            errors.append("%s: %s has %d lines, within the %d-line limit now: remove its line from %s"
                          % (rel, name, length, FUNCTION_MAX_LINES, EXCEPTIONS))
        elif length > limit:
            errors.append("%s: %s has %d lines, more than the %d %s allows it (listed functions may only shrink): split it"
                          % (rel, name, length, limit, EXCEPTIONS))
        elif length < limit:
            notes.append("%s: %s shrank to %d lines: lower its record in %s" % (rel, name, length, EXCEPTIONS))
    return errors, notes


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    errors = check_links(root) + check_readme_length(root)
    size_errors, notes = check_sizes(root)
    errors += size_errors
    for note in notes:
        print("note: " + note)
    for e in errors:
        print("FAIL: " + e)
    if errors:
        print("%d rule(s) broken (README.md, docs/, %s)" % (len(errors), EXCEPTIONS))
        return 1
    print("docs and size rules hold: links, README length, .cc/.h sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
