"""Makes protoc's Python output importable from inside the shardsync package.

protoc and grpc_python_plugin write imports of sibling modules by their top-level
names (`import layout_pb2 as layout__pb2`), which only work with the output folder
on sys.path. This rewrites, in place, each import of a module among the given files
into a package-relative one (`from . import layout_pb2 as layout__pb2`); imports of
anything else (google.protobuf, grpc) stay as they are. It also gives the message
classes the module's real name (`shardsync.layout_pb2.Box`, not `layout_pb2.Box`,
which pickle could not import): protoc writes the top-level name into
`_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'layout_pb2', ...)`; that
becomes `__name__`.

    python3 client/python/package_imports.py OUT/layout_pb2.py OUT/shardsync_pb2.py ...

Used by client/python/BUILD (the genrule) and scripts/build-wheel, so both make the
same modules. Exits non-zero if a top-level import or name of a sibling is left.
"""

import os
import re
import sys

_IMPORT = re.compile(r"^import (?P<module>\w+)(?P<alias> as \w+)?$", re.MULTILINE)
_MODULE_NAME = re.compile(r"(?P<call>BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'(?P<module>\w+)'")


def package_imports(text, siblings):
    """`text` with each `import X [as Y]` of a module X in `siblings` made
    `from . import X [as Y]`, and the module name protoc gives its message classes made
    `__name__`."""
    def relative(m):
        return f"from . import {m['module']}{m['alias'] or ''}" if m["module"] in siblings else m[0]

    def own_name(m):
        return f"{m['call']}__name__" if m["module"] in siblings else m[0]

    return _MODULE_NAME.sub(own_name, _IMPORT.sub(relative, text))


def main(paths):
    if not paths:
        sys.exit("usage: package_imports.py GENERATED.py...")
    siblings = {os.path.splitext(os.path.basename(p))[0] for p in paths}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = package_imports(f.read(), siblings)
        left = [m[0] for pattern in (_IMPORT, _MODULE_NAME) for m in pattern.finditer(text)
                if m["module"] in siblings]
        if left:
            sys.exit(f"package_imports.py: {path} still has {left}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
