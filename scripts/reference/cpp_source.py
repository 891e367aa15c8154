"""Compare printed C++ initializers with a C++ source file, ignoring layout (used by the reference scripts)."""
import sys


def normalize(text: str) -> str:
    """C++ text without comments and without white space outside string literals, adjacent string literals
    joined ("ab" "cd" -> "abcd"): the same tokens give the same string, however they are wrapped. White space
    inside a string literal is kept, so " Hello" and "Hello" stay different."""
    out: list[str] = []
    i, n = 0, len(text)
    string_end = -1  # len(out) just after the last string literal's closing quote
    while i < n:
        c = text[i]
        if c == '"':
            if string_end == len(out):
                out.pop()  # "ab" "cd": drop the closing quote, and the opening one below
            else:
                out.append('"')
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    out.append(text[i : i + 2])
                    i += 2
                else:
                    out.append(text[i])
                    i += 1
            out.append('"')
            i += 1
            string_end = len(out)
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == "'" and not (out and out[-1][-1:].isalnum()):  # a character literal, not a digit separator
            end = text.find("'", i + 2 if text[i + 1 : i + 2] == "\\" else i + 1)
            end = i + 1 if end < 0 else end
            out.append(text[i : end + 1])
            i = end + 1
        elif c.isspace():
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check(lines: list[str], path: str, what: str) -> int:
    """Prints each line whose normalized form (less a trailing comma) is not in the file; 1 if any."""
    with open(path, encoding="utf-8") as f:
        source = normalize(f.read())
    missing = [line for line in lines if normalize(line).rstrip(",") not in source]
    for line in missing:
        print(f"MISMATCH: not in {path}: {line}", file=sys.stderr)
    print(f"{len(lines) - len(missing)} of {len(lines)} {what} match {path}", file=sys.stderr)
    return 1 if missing else 0
