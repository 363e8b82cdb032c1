#!/usr/bin/env python3
"""The command-line flags Megatron-LM's pretrain_gpt.py accepts, read from
its sources without importing them (they need a recent PyTorch):

    megatron-arguments.py MEGATRON_LM_CHECKOUT > tests/data/megatron-arguments.txt

megatron/training/arguments.py adds flags two ways: add_argument('--name',
...) calls, and ArgumentGroupFactory(SomeConfig, exclude=[...]), which makes
one flag per field of the dataclass and its bases
(megatron/training/argument_utils.py): '--' + the name with '-' for '_',
'--no-' and '--disable-' for a bool that defaults to True, or the field's
metadata argparse_meta arg_names. `memledger plan --emit megatron` writes
only flags from this list (tests/unit/test_emit_megatron.c checks it)."""
import ast
import os
import re
import sys


def dataclasses_in(root):
    """{class name: (ast.ClassDef, path)} for every class under megatron/."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, "megatron")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            try:
                tree = ast.parse(open(path, encoding="utf-8").read())
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, node)
    return out


def fields(cls, classes, seen=None):
    """(name, is_bool, default_true, arg_names) of cls and its bases."""
    seen = seen or set()
    if cls.name in seen:
        return []
    seen.add(cls.name)
    out = []
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name in classes:
            out += fields(classes[name], classes, seen)
    for st in cls.body:
        if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
            continue
        ann = ast.unparse(st.annotation)
        is_bool = ann == "bool"
        default_true = False
        names = None
        v = st.value
        if isinstance(v, ast.Constant):
            default_true = v.value is True
        elif isinstance(v, ast.Call) and ast.unparse(v.func).endswith("field"):
            for kw in v.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    default_true = kw.value.value is True
                if kw.arg == "metadata":
                    m = re.search(r"'arg_names':\s*\[([^\]]*)\]", ast.unparse(kw.value))
                    if m:
                        names = re.findall(r"'(--[^']+)'", m.group(1))
        out.append((st.target.id, is_bool, default_true, names))
    return out


def main():
    root = sys.argv[1]
    src = open(os.path.join(root, "megatron", "training", "arguments.py"), encoding="utf-8").read()
    flags = set(re.findall(r"""add_argument\(\s*['"](--[a-z0-9-]+)['"]""", src))
    flags |= set(re.findall(r"""add_argument\(\s*['"]--[a-z0-9-]+['"],\s*['"](--[a-z0-9-]+)['"]""",
                            src))
    classes = dataclasses_in(root)
    for m in re.finditer(r"ArgumentGroupFactory\((\w+)(?:,\s*exclude\s*=\s*(\[[^\]]*\]))?", src):
        cls = classes.get(m.group(1))
        if cls is None:
            continue
        exclude = set(re.findall(r"""['"](\w+)['"]""", m.group(2) or ""))
        for name, is_bool, default_true, names in fields(cls, classes):
            if name in exclude or name.startswith("_"):
                continue
            if names:
                flags.update(names)
            elif is_bool and default_true:
                flags.update(("--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")))
            else:
                flags.add("--" + name.replace("_", "-"))
    for f in sorted(flags):
        print(f)


if __name__ == "__main__":
    main()
