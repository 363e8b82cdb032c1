#!/usr/bin/env python3
"""The keys torchtitan's TOML job config accepts, read from its
torchtitan/config/job_config.py without importing it (it needs a recent
PyTorch):

    torchtitan-job-config.py JOB_CONFIG_PY [COMMIT] > tests/data/torchtitan-job-config.txt

JobConfig is a dataclass whose fields are the TOML's sections, each a
dataclass whose fields are its keys; a field that is itself a dataclass
(training.dataloader, quantize.linear.float8) is a deeper table. One line
per key, `section.key` (dots for the deeper tables), after a first line
naming the source. `memledger plan --emit torchtitan` writes only keys from
this list (tests/unit/test_emit_torchtitan.c checks it)."""
import ast
import sys


def classes_of(tree):
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def annotation_class(node, classes):
    """The dataclass a field's annotation names, or None."""
    if isinstance(node, ast.Name) and node.id in classes:
        return node.id
    return None


def keys(cls, classes, prefix, out):
    for stmt in classes[cls].body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name = stmt.target.id
        sub = annotation_class(stmt.annotation, classes)
        if sub:
            keys(sub, classes, prefix + name + ".", out)
        else:
            out.append(prefix + name)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = open(sys.argv[1], encoding="utf-8").read()
    classes = classes_of(ast.parse(src))
    if "JobConfig" not in classes:
        sys.exit("%s: no JobConfig class" % sys.argv[1])
    out = []
    keys("JobConfig", classes, "", out)
    commit = sys.argv[2] if len(sys.argv) > 2 else "?"
    print("# torchtitan's TOML job config keys, from scripts/torchtitan-job-config.py at "
          "pytorch/torchtitan commit %s (v0.2.2)" % commit)
    for k in sorted(out):
        print(k)


if __name__ == "__main__":
    main()
