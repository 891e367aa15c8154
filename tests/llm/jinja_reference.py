#!/usr/bin/env python3
"""Renders every chat template of a folder with every case of render.py (../shared/chat-templates), as
transformers does, in one process: prints one JSON object {template file: {case: {"ok": bool, "text": str}}}
for tests/llm/test_jinja.cpp to compare troupe's Jinja engine with.

    jinja_reference.py DIR [RENDER_PY]       (RENDER_PY: DIR/render.py by default)
"""
import importlib.util
import json
import os
import sys


def main(argv):
    folder = argv[1]
    render_py = argv[2] if len(argv) > 2 else os.path.join(folder, "render.py")
    spec = importlib.util.spec_from_file_location("render", render_py)
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read()
        results = {}
        for case_name, case in render.CASES.items():
            try:
                results[case_name] = {"ok": True, "text": render.render(text, case)}
            except Exception as e:  # the template refuses (TemplateError) or fails in Python itself
                results[case_name] = {"ok": False, "text": f"{type(e).__name__}: {e}"}
        out[name] = results
    out["__cases__"] = render.CASES
    json.dump(out, sys.stdout, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
